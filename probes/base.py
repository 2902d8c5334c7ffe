"""What every probe shares: the Probe protocol, its health record, and BCC loading."""

from __future__ import annotations

import ctypes
import os
import platform
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from analysis.errors import NotRoot, ProbeUnavailable, TracepointMissing
from analysis.health import Health

TRACEFS_ROOTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


class Probe(Protocol):
    name: str

    def start(self, targets: Iterable[int]) -> None: ...

    def set_targets(self, targets: Iterable[int]) -> None: ...

    def read(self) -> dict[int, Any]:
        """Readings for exactly the targets it measures; the others are named in health().unsupported."""

    def host(self) -> Any | None:
        """A host-wide reading of the last read (tcp: every retransmit on the host); None for per-target probes."""

    def stop(self) -> None: ...

    def health(self) -> Health: ...


def tracefs_root(candidates: Iterable[Path] = TRACEFS_ROOTS) -> Path | None:
    for root in candidates:
        if (root / "events").is_dir():
            return root
    return None


def require_tracepoints(names: Iterable[str], root: Path | None = None) -> None:
    """Raise TracepointMissing naming the first `category:event` absent from tracefs."""
    root = root or tracefs_root()
    if root is None:
        raise TracepointMissing("tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)")
    for name in names:
        category, event = name.split(":", 1)
        if not (root / "events" / category / event).is_dir():
            raise TracepointMissing(f"tracepoint {name} does not exist in {root}/events")


def import_bcc() -> Any:
    try:
        import bcc  # noqa: PLC0415 - imported lazily: LLVM costs ~76 MB and seconds
    except ImportError as exc:
        raise ProbeUnavailable(f"BCC is not importable ({exc}); run 'make setup' (installs python3-bpfcc)") from exc
    return bcc


def load_bpf(text: str, cflags: Iterable[str] = ()) -> Any:
    """Compile and load BCC C text; translate BCC's failures into ProbeUnavailable with the reason."""
    if os.geteuid() != 0:
        raise NotRoot("loading BPF programs needs root")
    bcc = import_bcc()
    try:
        bpf = bcc.BPF(text=text.encode(), cflags=list(cflags))
    except Exception as exc:  # BCC raises bare Exception for compile and load failures
        raise ProbeUnavailable(f"BPF program failed to load: {exc}") from exc
    release_compiler_memory()
    return bpf


# BCC's compiler: their machine code runs only while a probe compiles, a few times in the agent's life.
COMPILER_LIBRARIES = ("libLLVM", "libclang", "libbcc")
MADV_DONTNEED = 4


def release_compiler_memory(smaps: Path = Path("/proc/self/smaps")) -> int:
    """Give back what compiling left resident; returns the bytes of compiler code dropped.

    LLVM's freed heap goes back with malloc_trim (~150 MB -> ~110 MB after five programs, docs/kernel.md). The
    compiler's code pages (~70 MiB of libLLVM and libclang-cpp text) are file-backed and unmodified:
    MADV_DONTNEED drops them from this process, they stay in the page cache (shared, reclaimable), and the next
    compile faults back what it runs (measured: 0.16 s for a small program, as before). A code mapping with
    anonymous pages was written in place (a text relocation); dropping those would lose the writes, so it is
    left alone."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        return 0  # not glibc: nothing to trim, RSS stays higher
    try:
        mappings = compiler_code_mappings(smaps.read_text())
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    dropped = 0
    for m in mappings:
        if m.anonymous_bytes == 0 and libc.madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
            dropped += m.rss_bytes
    return dropped


@dataclass(frozen=True)
class CodeMapping:
    start: int
    end: int
    path: str
    rss_bytes: int
    anonymous_bytes: int


def compiler_code_mappings(smaps_text: str, libraries: Iterable[str] = COMPILER_LIBRARIES) -> list[CodeMapping]:
    """The executable, private, file-backed mappings of the compiler's libraries in /proc/PID/smaps text."""
    found: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in smaps_text.splitlines():
        head = line.split()
        if not head:
            continue
        if "-" in head[0] and not head[0].endswith(":"):  # a mapping's header: "lo-hi perms offset dev inode path"
            name = head[5] if len(head) > 5 else ""
            current = None
            if head[1] == "r-xp" and any(lib in os.path.basename(name) for lib in libraries):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                current = {"start": lo, "end": hi, "path": name, "rss_bytes": 0, "anonymous_bytes": 0}
                found.append(current)
        elif current is not None and head[0] in ("Rss:", "Anonymous:") and len(head) >= 2:
            current["rss_bytes" if head[0] == "Rss:" else "anonymous_bytes"] = int(head[1]) * 1024
    return [CodeMapping(**m) for m in found]


class TargetSlots:
    """tgid -> slot in a probe's per-target arrays; freed slots are reused oldest-first.

    Reusing the slot freed longest ago gives in-flight events of a removed target time to
    land before the slot's baseline is taken for the next owner.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_tgid: dict[int, int] = {}
        self._free: deque[int] = deque(range(capacity))

    def __contains__(self, tgid: int) -> bool:
        return tgid in self._by_tgid

    def __len__(self) -> int:
        return len(self._by_tgid)

    def items(self) -> list[tuple[int, int]]:
        return list(self._by_tgid.items())

    def slot(self, tgid: int) -> int:
        return self._by_tgid[tgid]

    def add(self, tgid: int) -> int:
        if tgid <= 0:
            raise ValueError(f"target tgid must be positive, got {tgid!r}")
        if not self._free:
            raise ProbeUnavailable(f"all {self.capacity} target slots are in use; cannot add tgid {tgid}")
        slot = self._free.popleft()
        self._by_tgid[tgid] = slot
        return slot

    def remove(self, tgid: int) -> int:
        slot = self._by_tgid.pop(tgid)
        self._free.append(slot)
        return slot

    def reserve(self) -> int | None:
        """A free slot set aside (for the kernel to give a followed child), or None when none is free."""
        return self._free.popleft() if self._free else None

    def adopt(self, tgid: int, slot: int) -> None:
        """`tgid` owns `slot`, a reserved one the kernel gave it."""
        if tgid in self._by_tgid:
            raise ValueError(f"tgid {tgid} already has slot {self._by_tgid[tgid]}")
        self._by_tgid[tgid] = slot


class Followed:
    """What the probes that follow a family's forks in the kernel (probes/target_filter.py) keep alike: the targets
    followed, the children the kernel placed (child -> parent), and which exited ones already gave their last
    reading."""

    def __init__(self) -> None:
        self.tgids: set[int] = set()
        self.parents: dict[int, int] = {}
        self._reported: set[int] = set()

    def sync(self, follow: Any) -> None:
        """Make a program's `follow` hash hold the followed targets and the children placed (their forks are
        followed too); a key the process took along when it ended is simply gone."""
        wanted = self.tgids | set(self.parents)
        kernel = {int(k.value) for k in follow.keys()}
        for tgid in kernel - wanted:
            try:
                del follow[follow.Key(tgid)]
            except KeyError:
                pass  # deleted meanwhile
        for tgid in wanted - kernel:
            follow[follow.Key(tgid)] = follow.Leaf(1)

    def to_drop(self, gone: Iterable[int]) -> list[int]:
        """Of the targets that exited, those to drop before this read. A family member (followed, or a child placed)
        has its last counts in the maps: it goes out in this reading and is dropped at the next one. Any other
        target is dropped at once, as its pid may already name another process."""
        gone = list(gone)
        last = {t for t in gone if t in self.parents or t in self.tgids}
        drop = [t for t in gone if t not in last or t in self._reported]
        self._reported = last - self._reported
        return drop


# struct bpf_prog_info (uapi linux/bpf.h, kernel >= 5.12): recursion_misses is a u64 at byte 208.
PROG_INFO_SIZE = 232
RECURSION_MISSES_OFFSET = 208


def prog_recursion_misses(prog_fd: int, name: str = "") -> int:
    """Runs of one program the kernel skipped because a BPF program was already running on that CPU.

    Classic tracepoint programs share one per-CPU guard with every kprobe/tracepoint program
    on the host (another tool's sched_switch program can hide our sched_wakeup); raw
    tracepoints only guard against themselves. Either way the kernel counts the miss.
    """
    from bcc.libbcc import lib

    info = (ctypes.c_uint8 * PROG_INFO_SIZE)()
    size = ctypes.c_uint32(PROG_INFO_SIZE)
    if lib.bpf_obj_get_info(prog_fd, ctypes.byref(info), ctypes.byref(size)) != 0:
        raise ProbeUnavailable(f"BPF_OBJ_GET_INFO_BY_FD failed for program {name!r} (fd {prog_fd})")
    if size.value < RECURSION_MISSES_OFFSET + 8:
        return 0  # kernel older than 5.12: it does not count misses
    return int.from_bytes(bytes(info[RECURSION_MISSES_OFFSET:RECURSION_MISSES_OFFSET + 8]), "little")


def recursion_misses(bpf: Any) -> int:
    """prog_recursion_misses summed over every program `bpf` loaded."""
    return sum(prog_recursion_misses(fn.fd, fn.name) for fn in bpf.funcs.values())


# bpf(2)'s command number and the syscall's number per architecture (uapi linux/bpf.h, unistd.h).
BPF_PROG_TEST_RUN = 10
BPF_SYSCALL_NR = {"x86_64": 321, "aarch64": 280}


class _TestRunAttr(ctypes.Structure):
    """The BPF_PROG_TEST_RUN part of `union bpf_attr` (linux/bpf.h)."""

    _fields_ = [("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
                ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_uint64), ("ctx_out", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32),
                ("batch_size", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]


class RawTracepointRunner:
    """Runs a loaded raw-tracepoint program once with the given u64 args (kernel >= 5.10)."""

    def __init__(self, prog_fd: int, machine: str | None = None) -> None:
        machine = machine or platform.machine()
        if machine not in BPF_SYSCALL_NR:
            raise ProbeUnavailable(f"no bpf(2) syscall number known for architecture {machine!r}")
        self._nr = BPF_SYSCALL_NR[machine]
        self._fd = prog_fd
        self._libc = ctypes.CDLL(None, use_errno=True)

    def run(self, *args: int) -> int:
        ctx = (ctypes.c_uint64 * len(args))(*args)
        attr = _TestRunAttr(prog_fd=self._fd, ctx_size_in=ctypes.sizeof(ctx), ctx_in=ctypes.addressof(ctx))
        if self._libc.syscall(self._nr, BPF_PROG_TEST_RUN, ctypes.byref(attr), ctypes.sizeof(attr)) != 0:
            err = ctypes.get_errno()
            raise ProbeUnavailable(f"BPF_PROG_TEST_RUN of a raw tracepoint program failed: {os.strerror(err)} "
                                   f"(errno {err}; needs kernel >= 5.10)")
        return attr.retval
