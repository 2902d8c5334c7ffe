"""Who wrote to the disks (agent/sources/disk_writers.py): real writers, one that fsyncs and one that leaves its pages
to the flusher, are named with the bytes they wrote; a reused pid is a new process; the agent and small writers are
left out; a window whose I/O did not stall reads nobody and says so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.sources.disk_writers import CLK_TCK, MIN_BYTES, WriteTracker, parse_io, scan, writers
from agent.sources.pressure import PressureSource

MiB = 1 << 20
WRITE = 48 * MiB


DISK_TMP = Path(os.environ.get("INFERSIGHT_DISK_TMP", "/var/tmp"))


def _fs_type(path: Path) -> str:
    """The filesystem type of the mount `path` is on (the longest mount point that holds it)."""
    best, kind = "", "?"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        point = left.split()[4]
        if str(path.resolve()).startswith(point.rstrip("/") + "/") or str(path.resolve()) == point:
            if len(point) >= len(best):
                best, kind = point, right.split()[0]
    return kind


# tmpfs and ramfs pages are never written back, and /proc/PID/io counts none of them: these need a disk.
on_a_disk = pytest.mark.skipif(_fs_type(DISK_TMP) in ("tmpfs", "ramfs", "?"),
                               reason=f"{DISK_TMP} is not on a disk (set INFERSIGHT_DISK_TMP to a directory that is)")


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _writer(sync: bool, directory: Path) -> subprocess.Popen:
    """A child that, on a line on stdin, writes WRITE bytes to a file in `directory` (fsynced or not), then waits."""
    code = ("import os, sys\nprint('ready', flush=True); sys.stdin.readline()\n"
            f"fd = os.open({str(directory / 'out')!r}, os.O_WRONLY | os.O_CREAT, 0o600)\n"
            f"for _ in range({WRITE // MiB}): os.write(fd, os.urandom({MiB}))\n"
            + ("os.fsync(fd)\n" if sync else "")
            + "print('done', flush=True); sys.stdin.readline()\n")
    return subprocess.Popen([sys.executable, "-c", code, "--api-token", "s3cr3t"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


@on_a_disk
@pytest.mark.parametrize("sync", [True, False], ids=["fsyncs", "leaves-it-to-the-flusher"])
def test_a_real_writer_is_named_with_the_bytes_it_wrote(sync, tmp_path):
    # On a disk, /var/tmp as the scenario's diskhog.py uses it.
    directory = DISK_TMP / f"infersight-test-{os.getpid()}-{sync}"
    directory.mkdir()
    child = _writer(sync, directory)
    try:
        assert child.stdout.readline().strip() == "ready"
        clock = Clock()
        tracker = WriteTracker(clock=clock)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        clock.now += 5.0
        found = tracker.writers(members={child.pid})
    finally:
        child.kill()
        child.wait()
        (directory / "out").unlink(missing_ok=True)
        directory.rmdir()
    mine = [w for w in found if w.pid == child.pid]
    assert mine, f"the writer {child.pid} was not named: {found}"
    top = mine[0]
    assert top.member and top.seconds == pytest.approx(5.0)
    # What it wrote (the kernel counts a page where it is dirtied, fsync or not), within the interpreter's own start.
    assert WRITE <= top.written_bytes <= WRITE + 4 * MiB, top
    assert top.comm.startswith("python") and top.user == "root"
    assert "--api-token ***" in top.cmdline and "s3cr3t" not in top.cmdline


def _proc(proc: Path, pid: int, written: int, start_ticks: int = 100, comm: str = "job", ppid: int = 1,
          cancelled: int = 0) -> None:
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(start_ticks)] + ["0"] * 20
    (proc / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (proc / str(pid) / "io").write_text(f"rchar: 1\nwchar: 2\nsyscr: 3\nsyscw: 4\nread_bytes: 0\n"
                                        f"write_bytes: {written}\ncancelled_write_bytes: {cancelled}\n")


def test_parse_io_nets_out_cancelled_writes_and_refuses_a_file_without_them():
    assert parse_io("read_bytes: 5\nwrite_bytes: 4096\ncancelled_write_bytes: 1024\n") == 3072
    with pytest.raises(ValueError, match="write_bytes"):
        parse_io("rchar: 1\n")


def test_a_reused_pid_is_a_new_process_and_small_writers_and_the_agent_are_left_out(tmp_path):
    proc = tmp_path / "proc"
    big = 64 * MiB
    _proc(proc, 10, written=big, start_ticks=100)    # replaced by a new process that wrote more than it in all
    _proc(proc, 11, written=big, start_ticks=100)    # replaced by one that wrote less: its counter went down
    _proc(proc, 12, written=0)                       # writes less than the floor
    _proc(proc, 13, written=0)                       # the agent itself
    _proc(proc, 14, written=0, comm="py-spy", ppid=13)  # the agent's sampler
    _proc(proc, 15, written=0, comm="dd")            # a neighbour
    before = scan(proc)
    before_boot = 10.0  # seconds since boot of that scan: start ticks after it are a new process
    _proc(proc, 10, written=big + 8 * MiB, start_ticks=int(12 * CLK_TCK), comm="new")
    _proc(proc, 11, written=4 * MiB, start_ticks=int(12 * CLK_TCK), comm="newer")
    _proc(proc, 12, written=MIN_BYTES - 1)
    _proc(proc, 13, written=500 * MiB)
    _proc(proc, 14, written=400 * MiB, comm="py-spy", ppid=13)
    _proc(proc, 15, written=300 * MiB, cancelled=100 * MiB, comm="dd")
    found = writers(scan(proc), before, before_boot, {11}, 13, 5.0, proc)
    assert [(w.pid, w.comm, w.written_bytes, w.member) for w in found] == [
        (15, "dd", 200 * MiB, False), (10, "new", big + 8 * MiB, False), (11, "newer", 4 * MiB, True)]
    assert found[0].cmdline is None and found[0].user is None  # no cmdline or status in this /proc: not invented


def test_a_process_that_started_within_the_interval_wrote_its_bytes_in_the_time_it_ran(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 40, written=0, start_ticks=int(5 * CLK_TCK))  # there all along
    before = scan(proc)
    _proc(proc, 40, written=50 * MiB, start_ticks=int(5 * CLK_TCK))
    _proc(proc, 41, written=100 * MiB, start_ticks=int(22 * CLK_TCK), comm="new")  # started 3 s before the read
    found = writers(scan(proc), before, 10.0, set(), 1, 15.0, proc)  # the scan before: 10 s after boot, 15 s ago
    assert [(w.pid, w.written_bytes, w.seconds) for w in found] == [(41, 100 * MiB, 3.0), (40, 50 * MiB, 15.0)]


def test_a_writer_that_exits_before_the_read_is_not_named(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 20, written=0)
    before = scan(proc)
    _proc(proc, 20, written=100 * MiB)
    now = scan(proc)
    (proc / "20" / "stat").unlink()  # gone between the scan and its naming
    assert writers(now, before, 10.0, set(), 1, 5.0, proc) == []


def test_each_read_counts_from_the_last_one_and_the_reference_is_renewed(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 30, written=0)
    clock = Clock()
    tracker = WriteTracker(proc, reference_seconds=60.0, clock=clock, boot=lambda: 1e9, agent=1)
    clock.now += 5.0
    _proc(proc, 30, written=10 * MiB)
    [w] = tracker.writers([])
    assert w.written_bytes == 10 * MiB and w.seconds == pytest.approx(5.0)
    clock.now += 5.0
    assert tracker.writers([]) == []  # nothing new since the last read
    _proc(proc, 30, written=30 * MiB)
    clock.now += 61.0
    tracker.tick()  # a reference taken now holds the 30 MiB: they are no longer new
    clock.now += 5.0
    assert tracker.writers([]) == []


PSI = "some avg10=0.00 avg60=0.00 avg300=0.00 total={some}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def test_a_window_without_an_io_stall_reads_nobody_and_says_so(tmp_path):
    proc = tmp_path / "proc"
    _proc(proc, 42, written=0, comm="srv")
    (proc / "42" / "cgroup").write_text("0::/srv\n")
    (proc / "vmstat").write_text("pgsteal_kswapd 5\n")
    (proc / "pressure").mkdir()

    def psi(io_us: int) -> None:
        for r, v in (("cpu", 0), ("memory", 0), ("io", io_us)):
            (proc / "pressure" / r).write_text(PSI.format(some=v))

    psi(0)
    source = PressureSource(42, proc_root=proc, cgroup_mounts=(tmp_path / "nowhere",))
    _proc(proc, 43, written=100 * MiB, comm="backup")
    r = source.read()
    assert r.writers is None and "I/O stalled under 1%" in r.reasons["writers"]
    psi(60_000_000)  # a minute of I/O stall since: far above 1 % of any window this test takes
    _proc(proc, 43, written=300 * MiB, comm="backup")
    r = source.read()
    assert [(w.pid, w.comm, w.member) for w in r.writers] == [(43, "backup", False)] and "writers" not in r.reasons
    assert r.writers[0].written_bytes >= 200 * MiB


@on_a_disk
def test_a_writer_that_exits_within_the_window_is_charged_to_the_parent_that_reaped_it(tmp_path):
    # The kernel adds a reaped child's I/O to its parent's: a backup script's short-lived dd is named by the script.
    out = DISK_TMP / f"infersight-test-{os.getpid()}-reaped"
    code = ("import subprocess, sys\nprint('ready', flush=True); sys.stdin.readline()\n"
            f"subprocess.run(['dd', 'if=/dev/zero', 'of={out}', 'bs=1M', 'count={WRITE // MiB}', 'conv=fsync'],"
            " stderr=subprocess.DEVNULL, check=True)\n"
            "print('done', flush=True); sys.stdin.readline()\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "ready"
        tracker = WriteTracker(clock=Clock())
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "done"
        found = tracker.writers(members=set())
    finally:
        parent.kill()
        parent.wait()
        out.unlink(missing_ok=True)
    mine = [w for w in found if w.pid == parent.pid]
    assert mine and WRITE <= mine[0].written_bytes <= WRITE + 4 * MiB, found
