"""The exits probe against how real processes ended, as their parent's wait() status tells it (the ground truth)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from probes.exits import ExitsConfig, ExitsProbe, ProcessExit, decode, render

# Each child says "ready" once its handlers are in place, then waits for the test to act (or acts by itself on a
# byte from the test), so that the probe watches it before it ends.
WAIT = "import sys, time\nsys.stdout.write('ready\\n'); sys.stdout.flush()\n"


def child(code: str, setup: str = "") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", setup + WAIT + code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def go(proc: subprocess.Popen) -> None:
    assert proc.stdin is not None
    proc.stdin.write(b"x")
    proc.stdin.close()


def record_of(probe: ExitsProbe, proc: subprocess.Popen) -> ProcessExit | None:
    proc.wait(timeout=30)
    return probe.exit_of(proc.pid)


@pytest.fixture(scope="module")
def loaded():
    """One probe for the module: compiling it takes ~0.5 s."""
    if os.geteuid() != 0:
        pytest.skip("needs root: BPF programs are root-only (CI runs as root)")
    p = ExitsProbe()
    p.start([])
    yield p
    p.stop()


@pytest.fixture
def probe(require_bpf, loaded):
    return loaded


def watch(probe: ExitsProbe, *procs: subprocess.Popen) -> None:
    probe.set_targets([p.pid for p in procs])


@pytest.mark.bpf
def test_kill_9_names_the_signal_and_the_sender(probe):
    victim = child("time.sleep(60)")
    watch(probe, victim)
    sender = subprocess.run(["kill", "-KILL", str(victim.pid)])
    assert sender.returncode == 0
    found = record_of(probe, victim)
    assert victim.returncode == -signal.SIGKILL
    assert found is not None and found.how == "killed" and found.signal == signal.SIGKILL
    assert found.sender_comm == "kill" and found.sender_pid not in (None, 0, victim.pid, os.getpid())
    assert found.describe().startswith("killed by SIGKILL (signal 9) from pid ")


@pytest.mark.bpf
def test_a_default_sigterm_is_told_as_sigterm_not_as_the_sigkill_every_thread_then_dequeues(probe):
    # The kernel turns a fatal-by-default signal into a group exit when it is sent: the threads then dequeue SIGKILL.
    victim = child("import threading\nthreading.Thread(target=time.sleep, args=(60,)).start()\ntime.sleep(60)")
    watch(probe, victim)
    os.kill(victim.pid, signal.SIGTERM)
    found = record_of(probe, victim)
    assert victim.returncode == -signal.SIGTERM
    assert found == ProcessExit(pid=victim.pid, how="killed", signal=signal.SIGTERM, sender_pid=os.getpid(),
                                sender_comm=Path(f"/proc/{os.getpid()}/comm").read_text().strip())


@pytest.mark.bpf
def test_exit_status_and_a_handled_signal_are_the_status_the_parent_sees(probe):
    plain = child("sys.stdin.read(1); sys.exit(3)")
    handled = child("time.sleep(60)", setup="import os, signal\nsignal.signal(signal.SIGTERM, lambda *a: os._exit(7))\n")
    watch(probe, plain, handled)
    go(plain)
    os.kill(handled.pid, signal.SIGTERM)
    records = [record_of(probe, p) for p in (plain, handled)]
    found = {p.returncode: r for p, r in zip((plain, handled), records)}
    assert set(found) == {3, 7}
    assert found[3] == ProcessExit(pid=plain.pid, how="exited", status=3)
    assert found[7] == ProcessExit(pid=handled.pid, how="exited", status=7)
    assert found[3].describe() == "exited with status 3"


@pytest.mark.bpf
def test_a_crash_is_the_kernel_and_an_abort_is_the_process_itself(probe):
    crash = child("sys.stdin.read(1)\nimport ctypes\nctypes.string_at(0)")
    abort = child("sys.stdin.read(1)\nimport os\nos.abort()")
    watch(probe, crash, abort)
    go(crash)
    go(abort)
    crashed, aborted = record_of(probe, crash), record_of(probe, abort)
    assert crash.returncode == -signal.SIGSEGV and abort.returncode == -signal.SIGABRT
    assert crashed is not None and crashed.signal == signal.SIGSEGV and crashed.sender_pid == 0
    assert "from the kernel" in crashed.describe()
    assert aborted is not None and aborted.signal == signal.SIGABRT and aborted.sender_pid == abort.pid
    assert aborted.describe().endswith("sent by itself")


@pytest.mark.bpf
def test_the_oom_killer_is_named(probe, tmp_path):
    cgroup = Path("/sys/fs/cgroup/memory") / f"infersight-test-{uuid.uuid4().hex[:8]}"
    if not Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() and not Path(
            "/sys/fs/cgroup/memory").is_dir():
        pytest.fail("no cgroup v1 memory controller to hold the test process (expected on this kind of machine)")
    cgroup.mkdir()
    try:
        (cgroup / "memory.limit_in_bytes").write_text(str(64 << 20))
        hog = child("sys.stdin.read(1)\nheld = []\nwhile True:\n    held.append(bytearray(8 << 20))")
        (cgroup / "cgroup.procs").write_text(str(hog.pid))
        watch(probe, hog)
        go(hog)
        found = record_of(probe, hog)
    finally:
        deadline = time.monotonic() + 10
        while cgroup.exists():
            try:
                cgroup.rmdir()
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    assert hog.returncode == -signal.SIGKILL
    assert found is not None and found.oom and found.signal == signal.SIGKILL
    assert found.describe() == "killed by SIGKILL (signal 9) from the kernel's OOM killer"


@pytest.mark.bpf
def test_only_targets_are_recorded_and_a_reused_pid_starts_clean(probe):
    other = child("time.sleep(60)")
    watch(probe)
    other.kill()
    assert record_of(probe, other) is None, "a process that is not a target leaves no record"
    alive = child("time.sleep(60)")
    try:
        watch(probe, alive)
        assert probe.exit_of(alive.pid) is None, "a running target has not ended"
    finally:
        alive.kill()
        alive.wait()
    assert probe.health().state == "running"


def test_decode_prefers_the_fatal_signal_over_a_status_and_reads_kernel_senders():
    raw = SimpleNamespace(fatal_sig=11, sent_sig=11, sent_code=1, sender_tgid=5, sender_comm=b"srv", oom=0,
                          has_status=1, status=0)
    assert decode(5, raw) == ProcessExit(pid=5, how="killed", signal=11, sender_pid=0)
    raw = SimpleNamespace(fatal_sig=0, sent_sig=0, sent_code=0, sender_tgid=0, sender_comm=b"", oom=0,
                          has_status=1, status=256 + 2)
    assert decode(6, raw) == ProcessExit(pid=6, how="exited", status=2), "only the low byte reaches wait()"
    raw = SimpleNamespace(fatal_sig=0, sent_sig=0, sent_code=0, sender_tgid=0, sender_comm=b"", oom=0,
                          has_status=0, status=0)
    assert decode(7, raw).describe().startswith("exited; how was not seen")


def test_render_defines_the_fatal_mask_and_leaves_oom_out_where_the_kernel_lacks_it():
    text = render(ExitsConfig(oom=False))
    mask = int(text.split("#define FATAL_MASK ")[1].split("ULL")[0])
    assert mask >> signal.SIGKILL & 1 and mask >> signal.SIGTERM & 1
    assert not mask >> signal.SIGCHLD & 1 and not mask >> signal.SIGSTOP & 1 and not mask >> signal.SIGCONT & 1
    assert "#define HAVE_OOM" not in text and "#define HAVE_OOM 1" in render(ExitsConfig())
    with pytest.raises(ValueError, match="max_records"):
        ExitsConfig(max_records=0)
