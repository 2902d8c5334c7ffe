"""Memory pressure from a neighbour: PID and this process share a memory-limited cgroup (a pod, a container's
family), and this one allocates until the server's file pages (its code, its libraries) are reclaimed (root).

    python3 memsqueeze.py PID SECONDS [LOW HIGH [HEADROOM_MIB]]

PID moves into `<its memory cgroup>/infersight_eval_mem_PID/server` (cgroup v1; its file pages are paged out so
that it reads back what it uses into the new cgroup; cgroup v2: under the root), this process into
`.../neighbour`, and the family is capped at what it holds now plus HEADROOM_MIB (v1 `memory.limit_in_bytes`, v2
`memory.high`). Then this process allocates and touches memory, 4 MiB at a time, until the server reads its own
pages back from disk at LOW to HIGH major faults per second (default 50-200), and holds it there (freeing a MiB
when the server faults faster): with no swap, only the server's file pages (its code, its libraries) can give way.
Held by its cost rather than by a size, the squeeze is the same whatever the server's working set on the host. The host is never short of memory: the
allocation is bounded by the family's limit; nothing in the family is killed (v1: its OOM killer is off, and a
watchman process outside it raises the limit by 8 MiB whenever the family runs out). At exit the memory is freed, both move back and the cgroups are removed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

from cgroup import Hierarchy, find
from stop_request import StopRequest

STEP = 1 << 20
UP_STEPS = 4
BACK_OFF_STEPS = 8
DOWN_STEPS = 2
TICK = 0.25
GUARD_STEP = 8 << 20
GUARD_TICK = 0.05
MADV_PAGEOUT = 21
SYS_PROCESS_MADVISE = 440  # x86_64 and arm64 alike (the generic syscall table)
IOV_MAX = 1024
# Never more than this beyond the server's file pages at the start, whatever the reclaim does.
MAX_EXTRA = 256 << 20
SETTLE_SECONDS = 5.0


def read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def stat(path: str, v1: bool) -> dict[str, int]:
    with open(f"{path}/memory.stat") as f:
        values = {k: int(v) for k, v in (line.split() for line in f)}
    if v1:  # hierarchical totals, like v2's figures
        return {k[len("total_"):]: v for k, v in values.items() if k.startswith("total_")}
    return values


def file_bytes(path: str, v1: bool) -> int:
    s = stat(path, v1)
    return s.get("active_file", 0) + s.get("inactive_file", 0)


def usage(path: str, v1: bool) -> int:
    return read_int(f"{path}/memory.usage_in_bytes" if v1 else f"{path}/memory.current")


def move_process(pid: int, path: str) -> None:
    # cgroup.procs moves every thread at once in both versions (v1 moves the charges with the thread-group leader).
    write(f"{path}/cgroup.procs", str(pid))


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("length", ctypes.c_size_t)]


def page_out_files(pid: int) -> int:
    """Ask the kernel to reclaim PID's file-backed mappings now (process_madvise MADV_PAGEOUT): in cgroup v1 a
    process's pages stay charged where they were first touched, so the server reads them back in its new cgroup,
    where the family's limit covers them. Returns the bytes of mappings advised."""
    ranges = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5].startswith("/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end - start))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pidfd = os.pidfd_open(pid)
    try:
        for i in range(0, len(ranges), IOV_MAX):
            part = ranges[i:i + IOV_MAX]
            vec = (IoVec * len(part))(*(IoVec(a, n) for a, n in part))
            if libc.syscall(SYS_PROCESS_MADVISE, pidfd, vec, len(part), MADV_PAGEOUT, 0) < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"process_madvise(MADV_PAGEOUT) of pid {pid}: {os.strerror(err)}")
    finally:
        os.close(pidfd)
    return sum(n for _, n in ranges)


def major_faults(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    return int(text[text.rindex(")") + 2:].split()[9])


def guard(family: str, v1: bool) -> None:
    """The forked watchman (it stays outside the family): whenever the family is out of memory, its limit goes up by
    GUARD_STEP, so nothing in it is killed or left waiting (v1 with the OOM killer off: tasks at the limit wait)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    parent = os.getppid()
    while os.getppid() == parent:
        try:
            with open(f"{family}/memory.oom_control") as f:
                under = "under_oom 1" in f.read()
            if under:
                limit = read_int(f"{family}/memory.limit_in_bytes")
                write(f"{family}/memory.limit_in_bytes", str(limit + GUARD_STEP))
                print(f"the family ran out of memory: its limit raised to {(limit + GUARD_STEP) >> 20} MiB",
                      flush=True)
        except FileNotFoundError:
            return  # removed: the squeeze is over
        time.sleep(GUARD_TICK)


def main(pid: int, seconds: float, low: float = 50.0, high: float = 200.0, headroom_mib: float = 16.0) -> int:
    if not 0 < low < high:
        raise SystemExit(f"need 0 < LOW < HIGH (major faults per second), got {low}, {high}")
    hierarchy: Hierarchy = find("memory", "memory.max")
    v1 = hierarchy.version == "v1"
    home = f"{hierarchy.mount}{hierarchy.own_path(pid, 'memory')}".rstrip("/")
    mine = f"{hierarchy.mount}{hierarchy.own_path(os.getpid(), 'memory')}".rstrip("/")
    # v2 allows no controller below a cgroup that has processes: the family goes under the root there.
    family = f"{home if v1 else hierarchy.mount}/infersight_eval_mem_{pid}"
    server, neighbour = f"{family}/server", f"{family}/neighbour"
    stop = StopRequest()
    os.makedirs(family, exist_ok=True)
    held: list[bytes] = []
    watchman = None
    try:
        if v1:
            write(f"{family}/memory.oom_control", "1")  # at the limit, wait for the watchman rather than kill
            watchman = os.fork()
            if watchman == 0:
                try:
                    guard(family, v1)
                finally:
                    os._exit(0)
        else:
            write(f"{family}/cgroup.subtree_control", "+memory")
        os.makedirs(server, exist_ok=True)
        os.makedirs(neighbour, exist_ok=True)
        move_process(pid, server)
        move_process(os.getpid(), neighbour)
        if v1:
            page_out_files(pid)
            time.sleep(SETTLE_SECONDS)  # the server reads back what it uses, now charged to the family
        start_file = file_bytes(server, v1)
        limit = usage(family, v1) + int(headroom_mib * (1 << 20))
        # v2's memory.high throttles and reclaims, never kills: no watchman needed there.
        write(f"{family}/memory.limit_in_bytes" if v1 else f"{family}/memory.high", str(limit))
        print(f"server pid {pid}: {start_file >> 20} MiB of file pages; family capped at {limit >> 20} MiB; "
              f"allocating until it reads back {low:g}-{high:g} pages/s", flush=True)
        deadline = time.monotonic() + seconds
        said = last = time.monotonic()
        faults = major_faults(pid)
        approaching = True
        while not stop.requested and time.monotonic() < deadline:
            time.sleep(TICK)
            now, count = time.monotonic(), major_faults(pid)
            rate, last, faults = (count - faults) / (now - last), now, count
            # How much the server's pages are squeezed is held by what it costs it, the rate at which it reads its
            # own pages back, whatever its working set on this host: quickly up to the first faults, then back a
            # little and a MiB at a time (the cost rises steeply once its working set no longer fits).
            if approaching and rate >= low / 2:
                approaching = False
                del held[-BACK_OFF_STEPS:]
            elif rate < low and len(held) * STEP < start_file + MAX_EXTRA:
                held.extend(b"\x01" * STEP for _ in range(UP_STEPS if approaching else 1))  # written: resident
            elif rate > high and held:
                del held[-DOWN_STEPS:]
            if now - said >= 5:
                said = now
                print(f"holding {len(held) * STEP >> 20} MiB; server's file pages {file_bytes(server, v1) >> 20} MiB, "
                      f"{rate:.0f} major faults/s", flush=True)
    finally:
        held.clear()
        for who, path in ((os.getpid(), mine), (pid, home)):
            try:
                move_process(who, path)
            except (FileNotFoundError, ProcessLookupError):
                pass  # the server is gone
        if watchman:
            os.kill(watchman, signal.SIGTERM)
            os.waitpid(watchman, 0)
        for path in (neighbour, server, family):
            try:
                os.rmdir(path)
            except OSError as exc:
                print(f"cannot remove {path}: {exc}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), float(sys.argv[2]), *(float(a) for a in sys.argv[3:6])))
