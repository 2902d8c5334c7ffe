"""Target discovery against a fixture /proc tree and against real processes, and restart detection."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.config import LatencySpec, TargetSpec
from agent.targets import diff_targets, discover, read_pidfile, read_proc
from agent.trust import UntrustedPath
from analysis.errors import TargetGone


def fake_proc(root: Path, pid: int, comm: str, cmdline: list[str], start: int, state: str = "S",
              flags: int = 4194560) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    # Fields after "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    # stime cutime cstime priority nice threads itrealvalue starttime ...
    rest = [state, "1", str(pid), str(pid), "0", "-1", str(flags)] + ["0"] * 8 + ["20", "0", "1", "0", str(start)]
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)} 1000 200 18446744073709551615\n")
    (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in cmdline))


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    fake_proc(root, 1, "systemd", ["/sbin/init"], 5)
    fake_proc(root, 2, "kthreadd", [], 5)
    fake_proc(root, 100, "python", ["python", "-m", "workload", "serve", "--port", "8000"], 1000)
    fake_proc(root, 200, "python3", ["python3", "-m", "workload", "serve", "--port", "8001"], 2000)
    fake_proc(root, 300, "bash", ["bash"], 3000)
    fake_proc(root, 400, "python", [], 4000, state="Z")
    fake_proc(root, 500, "weird) name (x", ["/opt/weird"], 5000)
    fake_proc(root, 999, "python", ["python", "-m", "agent", "run", "-m workload serve"], 9000)
    return root


def spec(name: str = "w", **kw) -> TargetSpec:
    return TargetSpec(name=name, **kw)


def test_read_proc_parses_stat_with_parens_in_comm(proc: Path) -> None:
    info = read_proc(500, proc)
    assert (info.comm, info.start_time, info.state, info.cmdline) == ("weird) name (x", 5000, "S", ("/opt/weird",))
    with pytest.raises(TargetGone, match="process 7 does not exist"):
        read_proc(7, proc)


def test_regex_matching_several_names_them_by_pid_and_excludes_agent(proc: Path) -> None:
    problems: dict[str, str] = {}
    found = discover([spec(process_regex=r"-m\s+workload\s+serve")], proc, hold=False, own_pid=999, problems=problems)
    assert [(t.name, t.pid, t.start_time) for t in found] == [("w#100", 100, 1000), ("w#200", 200, 2000)]
    assert found[0].cmdline == ("python", "-m", "workload", "serve", "--port", "8000")
    assert problems == {}


def test_regex_single_match_takes_spec_name_and_matches_comm(proc: Path) -> None:
    found = discover([spec(process_regex=r"--port 8001")], proc, hold=False, own_pid=999)
    assert [(t.name, t.pid) for t in found] == [("w", 200)]
    assert [t.pid for t in discover([spec(process_regex=r"^weird\)")], proc, hold=False, own_pid=999)] == [500]


def test_regex_skips_zombies_and_kernel_threads(proc: Path) -> None:
    pids = [t.pid for t in discover([spec(process_regex="kthreadd|^python")], proc, hold=False, own_pid=999)]
    assert pids == [100, 200]  # not 2 (kernel thread), not 400 (zombie), not 999 (the agent)


def test_no_match_is_reported(proc: Path) -> None:
    problems: dict[str, str] = {}
    assert discover([spec(process_regex="nginx")], proc, hold=False, problems=problems) == []
    assert problems == {"w": "no process matches process_regex 'nginx'"}


def test_pid_spec(proc: Path) -> None:
    problems: dict[str, str] = {}
    found = discover([spec("a", pid=300), spec("b", pid=77), spec("c", pid=400)], proc, hold=False, problems=problems)
    assert [(t.name, t.pid, t.start_time) for t in found] == [("a", 300, 3000)]
    assert problems == {"b": f"process 77 does not exist (no {proc}/77)", "c": "process 400 has exited (state Z)"}


def test_a_pid_without_a_command_line_is_named_for_what_it_is(proc: Path) -> None:
    # Mid-execve (a vfork spawn's parent runs on before the new argv is set) the command line reads empty, as a
    # kernel thread's does; neither is watched, and neither is called exited.
    fake_proc(proc, 500, "python3", [], 5000, state="R")
    fake_proc(proc, 501, "kworker/0:1", [], 10, state="I", flags=0x04208060)
    problems: dict[str, str] = {}
    assert discover([spec("starting", pid=500), spec("kthread", pid=501)], proc, hold=False, problems=problems) == []
    assert problems == {"starting": "process 500 has no command line yet (still starting, or it cleared its own); "
                                    "looked for again every window",
                        "kthread": "process 501 is a kernel thread: nothing to trace"}
    assert read_proc(2, proc).kernel_thread is False and read_proc(501, proc).kernel_thread is True


def test_the_kernel_thread_flag_is_read_from_the_real_proc() -> None:
    kthreadd = read_proc(2)
    if kthreadd.comm != "kthreadd":
        pytest.skip(f"pid 2 is {kthreadd.comm!r}, not kthreadd: this test runs in a pid namespace")
    assert kthreadd.kernel_thread is True
    assert read_proc(os.getpid()).kernel_thread is False


def test_a_process_is_claimed_once(proc: Path) -> None:
    problems: dict[str, str] = {}
    found = discover([spec("a", pid=100), spec("b", process_regex="--port 8000")], proc, hold=False, problems=problems)
    assert [t.name for t in found] == ["a"]
    assert problems == {"b": "process 100 is already watched as target 'a'"}


def test_pidfile(proc: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    good, bad, big, gone = run / "good.pid", run / "bad.pid", run / "big.pid", run / "gone.pid"
    good.write_text("200\n")
    bad.write_text("12abc\n")
    big.write_text("1" * 100)
    gone.write_text("31337")
    problems: dict[str, str] = {}
    specs = [spec("g", pidfile=good), spec("b", pidfile=bad), spec("B", pidfile=big), spec("x", pidfile=gone),
             spec("m", pidfile=run / "missing.pid")]
    found = discover(specs, proc, hold=False, problems=problems)
    assert [(t.name, t.pid) for t in found] == [("g", 200)]
    assert problems["b"] == f"pidfile {str(bad)!r} does not hold a pid, got '12abc'"
    assert problems["B"].startswith(f"pidfile {str(big)!r} does not hold a pid, got '1111")
    assert problems["x"] == f"process 31337 does not exist (no {proc}/31337)"
    assert problems["m"] == f"cannot read pidfile {str(run / 'missing.pid')!r}: No such file or directory"


def test_world_writable_pidfile_or_dir_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    pidfile = run / "w.pid"
    pidfile.write_text(str(os.getpid()))
    pidfile.chmod(0o644)
    assert read_pidfile(pidfile) == os.getpid()
    pidfile.chmod(0o666)
    with pytest.raises(UntrustedPath, match=r"refusing pidfile '.*w\.pid': it is writable by every user \(mode 0666\)"):
        read_pidfile(pidfile)
    pidfile.chmod(0o644)
    run.chmod(0o777)
    problems: dict[str, str] = {}
    assert discover([spec(pidfile=pidfile)], problems=problems) == []
    assert problems["w"].startswith(f"refusing pidfile {str(pidfile)!r}: {str(run)!r} is writable by every user")


def test_pid_reuse_reads_as_removed_and_added(proc: Path) -> None:
    s = spec(pid=300)
    before = discover([s], proc, hold=False)
    fake_proc(proc, 300, "bash", ["bash"], 3500)  # same pid, a different process
    after = discover([s], proc, hold=False)
    d = diff_targets(before, after)
    assert [t.start_time for t in d.removed] == [3000] and [t.start_time for t in d.added] == [3500]
    assert d.same == () and d.restarted == ("w",)
    assert diff_targets(after, after).same == tuple(after) and diff_targets(after, after).added == ()


# ---- real processes -----------------------------------------------------------------------------------

@pytest.fixture
def sleepers() -> Iterator[Callable[[str], subprocess.Popen]]:
    started: list[subprocess.Popen] = []

    def start(marker: str) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(60)", marker])
        started.append(p)
        return p

    yield start
    for p in started:
        p.kill()
        p.wait()


def _wait_cmdline(pid: int, marker: str) -> None:
    # Popen returns after fork; the exec that sets the command line may not have happened yet.
    for _ in range(500):
        if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never showed {marker!r} in its command line")


def test_real_processes_regex_restart_and_gone(sleepers) -> None:
    marker = f"infersight-test-{uuid.uuid4().hex}"
    s = TargetSpec(name="srv", process_regex=marker, latency=LatencySpec.from_preset("workload"))
    a, b = sleepers(marker), sleepers(marker)
    for p in (a, b):
        _wait_cmdline(p.pid, marker)
    first = discover([s])
    assert sorted((t.name, t.pid) for t in first) == sorted([(f"srv#{a.pid}", a.pid), (f"srv#{b.pid}", b.pid)])
    for t in first:
        assert t.start_time == int(Path(f"/proc/{t.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        assert t.cmdline[-1] == marker and t.spec is s

    b.kill()
    b.wait()
    second = discover([s])
    assert [(t.name, t.pid) for t in second] == [("srv", a.pid)]
    d = diff_targets(first, second)
    assert [t.pid for t in d.removed] == [b.pid] and [t.pid for t in d.same] == [a.pid] and d.added == ()

    a.kill()
    a.wait()
    c = sleepers(marker)
    _wait_cmdline(c.pid, marker)
    third = discover([s])
    d = diff_targets(second, third)
    assert [t.pid for t in d.removed] == [a.pid] and [t.pid for t in d.added] == [c.pid]
    assert d.restarted == ("srv",)

    c.kill()
    c.wait()
    problems: dict[str, str] = {}
    assert discover([s], problems=problems) == []
    assert problems == {"srv": f"no process matches process_regex {marker!r}"}


def test_real_agent_excludes_itself() -> None:
    me = " ".join(Path("/proc/self/cmdline").read_bytes().decode().split("\0")).strip()
    s = TargetSpec(name="me", pid=os.getpid())
    assert [t.pid for t in discover([s])] == [os.getpid()]  # an explicit pid is honoured
    regex = TargetSpec(name="me", process_regex=re.escape(me))
    assert os.getpid() not in [t.pid for t in discover([regex])]
    assert os.getpid() in [t.pid for t in discover([regex], own_pid=1)]


def _owned(root: Path, pid: int, uid: int) -> None:
    (root / str(pid) / "status").write_text(f"Name:\tpython\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t0\t0\t0\t0\n")


def test_regex_skips_processes_of_users_not_allowed_and_says_so(proc: Path) -> None:
    from agent.targets import Skipped

    for pid in (100, 200, 999):
        _owned(proc, pid, 0)
    for pid in range(600, 625):  # 25 processes of an unprivileged user
        fake_proc(proc, pid, "python", ["python", "-m", "workload", "serve", "--port", str(pid)], 10 * pid)
        _owned(proc, pid, 1234)
    skipped: dict[str, Skipped] = {}
    found = discover([spec(process_regex=r"-m\s+workload\s+serve")], proc, hold=False, own_pid=999,
                     allowed_uids=frozenset({0}), skipped=skipped)
    assert [t.pid for t in found] == [100, 200]
    assert skipped["w"] == Skipped(matched=27, not_allowed=25, over_limit=0)
    assert "25 owned by users not in allowed_users" in skipped["w"].line()
    found = discover([spec(process_regex=r"-m\s+workload\s+serve")], proc, hold=False, own_pid=999,
                     allowed_uids=frozenset({0, 1234}), max_targets=4, skipped=skipped)
    assert [t.pid for t in found] == [100, 200, 600, 601]
    assert skipped["w"] == Skipped(matched=27, not_allowed=0, over_limit=23, max_targets=4)
    assert "max_targets (4)" in skipped["w"].line()


def test_a_pid_target_of_a_user_not_allowed_is_refused_with_a_reason(proc: Path) -> None:
    _owned(proc, 300, 1234)
    problems: dict[str, str] = {}
    assert discover([spec(pid=300)], proc, hold=False, allowed_uids=frozenset({0}), problems=problems) == []
    assert "uid 1234" in problems["w"] and "allowed_users" in problems["w"]


def test_a_huge_command_line_is_read_only_up_to_a_cap() -> None:
    from agent.targets import CMDLINE_MAX_BYTES

    # A process controls its own argv: 1 MiB of it must not cost the agent 1 MiB per process per window.
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", *["x" * 100_000] * 10])
    try:
        deadline = time.monotonic() + 5
        info = read_proc(proc.pid)
        while time.monotonic() < deadline and len(" ".join(info.cmdline)) < 1000:
            time.sleep(0.05)  # until exec has replaced the forked child's argv
            info = read_proc(proc.pid)
        assert 1000 < len(" ".join(info.cmdline)) <= CMDLINE_MAX_BYTES
    finally:
        proc.kill()
        proc.wait()


NONDUMPABLE = "import ctypes, sys, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); print('ready', flush=True); time.sleep(60)"


def test_other_users_command_lines_are_not_read_past_their_front(monkeypatch) -> None:
    from agent import targets
    from agent.targets import OTHERS_CMDLINE_BYTES, Skipped

    if os.geteuid() != 0:
        pytest.skip("needs root: starts processes as another user")
    marker = f"infersight-other-{uuid.uuid4().hex}"
    filler = ["x" * 1023] * 64  # 64 KiB of argv, the most discovery ever read of one
    nobody = {"user": 65534, "group": 65534, "extra_groups": [], "start_new_session": True}
    procs = [subprocess.Popen(["sh", "-c", "sleep 60; :", marker, *filler], **nobody) for _ in range(5)]
    # Non-dumpable: the files under /proc/PID then show root as their owner; only its status says whose it is.
    hidden = subprocess.Popen(["/usr/bin/python3", "-c", NONDUMPABLE, marker, *filler], stdout=subprocess.PIPE,
                              text=True, **nobody)
    reads: list[tuple[str, int | None]] = []
    real_read = targets._read
    monkeypatch.setattr(targets, "_read", lambda path, limit=None: reads.append((path, limit)) or real_read(path, limit))
    try:
        assert hidden.stdout.readline().strip() == "ready"
        assert os.stat(f"/proc/{hidden.pid}/cmdline").st_uid == 0
        for p in procs:
            _wait_cmdline(p.pid, marker)
        skipped: dict[str, Skipped] = {}
        problems: dict[str, str] = {}
        found = discover([TargetSpec(name="t", process_regex=marker)], allowed_uids=frozenset({0}),
                         skipped=skipped, problems=problems)
    finally:
        for p in (*procs, hidden):
            os.killpg(p.pid, 9)
            p.wait()
    assert found == []
    theirs = {str(p.pid) for p in (*procs, hidden)}
    cmdline_reads = [(path, limit) for path, limit in reads if path.split("/")[-2] in theirs]
    assert {path.split("/")[-1] for path, _ in cmdline_reads} == {"cmdline"}, cmdline_reads  # no stat read either
    assert all(limit == OTHERS_CMDLINE_BYTES for _, limit in cmdline_reads), cmdline_reads
    # Still counted for the operator, from the front of their command lines: six processes of uid 65534.
    assert skipped["t"] == Skipped(matched=6, not_allowed=6, over_limit=0)
    assert "uid 65534" in problems["t"]


# ---- a pidfile swapped between the path check and the open (a sticky directory such as /run/user or /tmp) ---


def _sticky_pidfile(tmp_path: Path) -> Path:
    run = tmp_path / "sticky"
    run.mkdir()
    run.chmod(0o1777)  # like /tmp: anyone may add a file, only its owner may remove it
    pidfile = run / "server.pid"
    pidfile.write_text(f"{os.getpid()}\n")
    pidfile.chmod(0o644)
    return pidfile


def _swap_after_stat(final: Path, swap: Callable[[], None]) -> Callable[[str], os.stat_result]:
    """lstat that, right after it has looked at the pidfile (root's, trusted), lets another user replace it:
    what a server that removes its pidfile on restart leaves room for in a sticky directory."""
    def stat(path: str) -> os.stat_result:
        st = os.lstat(path)
        if path == str(final):
            swap()
        return st
    return stat


def test_pidfile_replaced_by_another_users_file_after_the_check_is_refused(require_root, tmp_path: Path) -> None:
    # Fails before open_trusted: the path was checked, then another file was opened, and its pid was traced.
    pidfile = _sticky_pidfile(tmp_path)

    def swap() -> None:
        pidfile.unlink()
        pidfile.write_text("1\n")
        os.chown(pidfile, 65534, 65534)

    with pytest.raises(UntrustedPath, match=rf"refusing pidfile '{pidfile}': it is owned by uid 65534"):
        read_pidfile(pidfile, stat=_swap_after_stat(pidfile, swap))


def test_pidfile_replaced_by_a_symlink_after_the_check_is_refused(require_root, tmp_path: Path) -> None:
    pidfile = _sticky_pidfile(tmp_path)
    other = tmp_path / "other-service.pid"  # root's, trusted: but not the file the config names
    other.write_text("1\n")

    def swap() -> None:
        pidfile.unlink()
        pidfile.symlink_to(other)
        os.chown(pidfile, 65534, 65534, follow_symlinks=False)

    with pytest.raises(UntrustedPath, match=r"was replaced \(by a symbolic link or a file\) after it was checked"):
        read_pidfile(pidfile, stat=_swap_after_stat(pidfile, swap))


def test_pidfile_replaced_by_a_fifo_is_refused_without_blocking(require_root, tmp_path: Path) -> None:
    # Fails before: open() of a FIFO waits for a writer, and discovery (the collection thread) hung with it.
    import threading

    pidfile = _sticky_pidfile(tmp_path)

    def swap() -> None:
        pidfile.unlink()
        os.mkfifo(pidfile, 0o666)
        os.chown(pidfile, 65534, 65534)

    outcome: list[BaseException | int] = []

    def read() -> None:
        try:
            outcome.append(read_pidfile(pidfile, stat=_swap_after_stat(pidfile, swap)))
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    if reader.is_alive():
        os.close(os.open(pidfile, os.O_WRONLY | os.O_NONBLOCK))  # let the blocked open return
        reader.join(timeout=5)
        pytest.fail("read_pidfile blocked on a FIFO put in the pidfile's place")
    assert len(outcome) == 1 and isinstance(outcome[0], UntrustedPath), outcome
    assert str(outcome[0]).startswith(f"refusing pidfile '{pidfile}': it is not a regular file (a FIFO)")


def test_pidfile_through_a_trusted_symlink_is_still_read(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    (real / "s.pid").write_text(f"{os.getpid()}\n")
    (tmp_path / "link").symlink_to(real)
    assert read_pidfile(tmp_path / "link" / "s.pid") == os.getpid()
    (real / "alias.pid").symlink_to("s.pid")
    assert read_pidfile(real / "alias.pid") == os.getpid()
