"""py-spy runs with CAP_SYS_PTRACE only (CAP_DAC_READ_SEARCH added where a target needs it), under resource
limits, and only while its target is the process discovery chose, run by an allowed user."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from agent.sources.pyspy import (
    ADDRESS_SPACE_BYTES,
    OUTPUT_MAX_BYTES,
    PySpySampler,
    cpu_limit_seconds,
)
from analysis.errors import AccessDenied
from probes.pidfd import read_start_time

pytestmark = pytest.mark.root

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3.11"
CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE = 1 << 2, 1 << 19

SPINNER = textwrap.dedent("""
    import os, sys, threading
    def {name}():
        while True:
            pass
    threading.Thread(target={name}, daemon=True).start()
    print("ready", flush=True)
    for line in sys.stdin:  # "drop": become nobody, as a root server that switches user would
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
        print("dropped", flush=True)
""")


def _spawn(argv: list[str], name: str, user: int | None = None) -> subprocess.Popen:
    kw = {"user": user, "group": user, "extra_groups": []} if user is not None else {}
    proc = subprocess.Popen([*argv, "-c", SPINNER.format(name=name)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, **kw)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _status(pid: int) -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)


def _limits(pid: int) -> dict[str, tuple[str, str]]:
    """/proc/PID/limits by name: (soft, hard). Its columns are fixed-width (fs/proc/base.c)."""
    rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    return {row[:26].strip(): (row[26:47].strip(), row[47:68].strip()) for row in rows}


def _recorder(sampler: PySpySampler, timeout: float = 60) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """Status and limits of one of the sampler's recorders once it is py-spy itself (setpriv and prlimit exec it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in sampler.child_pids():
            try:
                status = _status(pid)
                if status["Name"].strip() == "py-spy" and sampler.health().detail["capabilities"]:
                    return status, _limits(pid)
            except (OSError, KeyError):
                continue  # ended between listing and reading
        time.sleep(0.02)
    pytest.fail(f"no py-spy recorder ran within {timeout} s: {sampler.health()}")


def _wait_segments(sampler: PySpySampler, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while sampler.health().detail["segments"] < n:
        assert time.monotonic() < deadline, f"py-spy recorded nothing: {sampler.health()}"
        time.sleep(0.1)


@pytest.mark.parametrize("who", ["root", "another user"])
def test_pyspy_runs_with_cap_sys_ptrace_alone_under_its_limits(require_root, who: str) -> None:
    argv, user = ([sys.executable], None) if who == "root" else ([SYSTEM_PYTHON], NOBODY)
    target = _spawn(argv, "confined_target_spins", user)
    sampler = PySpySampler(target.pid, rate_hz=20, segment_seconds=1, start_time=read_start_time(target.pid),
                           allowed_uids=frozenset({0, NOBODY}))
    try:
        status, limits = _recorder(sampler)
        _wait_segments(sampler, 1)
        assert any("confined_target_spins" in s for s in sampler.read().active)
    finally:
        sampler.close()
        _stop(target)
    caps = {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    assert caps == {"CapInh": 0, "CapPrm": CAP_SYS_PTRACE, "CapEff": CAP_SYS_PTRACE, "CapBnd": CAP_SYS_PTRACE,
                    "CapAmb": 0}, caps
    assert status["NoNewPrivs"].strip() == "1"
    cpu = cpu_limit_seconds(1)
    assert limits["Max address space"] == (str(ADDRESS_SPACE_BYTES), str(ADDRESS_SPACE_BYTES))
    assert limits["Max cpu time"] == (str(cpu), str(cpu + 5))
    assert limits["Max file size"] == (str(OUTPUT_MAX_BYTES), str(OUTPUT_MAX_BYTES))
    assert limits["Max core file size"] == ("0", "0")
    assert sampler.health().detail["capabilities"] == "sys_ptrace"


@pytest.fixture
def private_interpreter(require_root):
    """A user's own interpreter that only the user may read (a venv or conda in a 0700 home is the usual case)."""
    top = Path(tempfile.mkdtemp(prefix="infersight-home-", dir="/tmp"))  # pytest's tmp_path is root's only
    try:
        top.chmod(0o755)
        home = top / "home"
        home.mkdir(mode=0o700)
        private = home / "python3"
        shutil.copy2(SYSTEM_PYTHON, private)
        for path in (home, private):
            os.chown(path, NOBODY, NOBODY)
        private.chmod(0o700)
        yield private
    finally:
        shutil.rmtree(top)


def test_a_target_whose_interpreter_only_its_owner_may_read_gets_cap_dac_read_search(private_interpreter) -> None:
    target = _spawn([str(private_interpreter)], "private_interpreter_spins", NOBODY)
    sampler = PySpySampler(target.pid, rate_hz=20, segment_seconds=1, start_time=read_start_time(target.pid),
                           allowed_uids=frozenset({0, NOBODY}))
    try:
        _wait_segments(sampler, 1)
        status, _ = _recorder(sampler)
        stacks = sampler.read().active
        health = sampler.health()
    finally:
        sampler.close()
        _stop(target)
    assert any("private_interpreter_spins" in s for s in stacks)
    assert int(status["CapEff"], 16) == int(status["CapBnd"], 16) == CAP_SYS_PTRACE | CAP_DAC_READ_SEARCH
    assert health.detail["capabilities"] == "sys_ptrace,dac_read_search"
    assert health.detail["restarts"] == 0, health  # decided before the first launch, not after a refusal


def test_a_target_that_switches_to_a_user_not_allowed_gets_no_further_recorder(require_root) -> None:
    target = _spawn([sys.executable], "switching_target_spins")
    sampler = PySpySampler(target.pid, rate_hz=20, segment_seconds=1, start_time=read_start_time(target.pid),
                           allowed_uids=frozenset({0}))
    try:
        _wait_segments(sampler, 1)
        target.stdin.write("drop\n")
        target.stdin.flush()
        assert target.stdout.readline().strip() == "dropped"
        deadline = time.monotonic() + 30
        while sampler.health().state == "running":
            assert time.monotonic() < deadline, f"py-spy went on sampling a nobody process: {sampler.health()}"
            time.sleep(0.05)
        with pytest.raises(AccessDenied, match="uid 65534"):
            sampler.read()
        # The recorder already attached when the target switched may finish its segment; none starts after.
        deadline = time.monotonic() + 5
        while sampler.child_pids():
            assert time.monotonic() < deadline, "a recorder outlived the refusal"
            time.sleep(0.05)
    finally:
        sampler.close()
        os.kill(target.pid, signal.SIGKILL)
        target.wait()


UNREDUCED = textwrap.dedent("""
    import subprocess, sys, time
    from agent.sources.pyspy import PySpySampler
    from probes.pidfd import read_start_time
    target = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    time.sleep(0.5)
    sampler = PySpySampler(target.pid, rate_hz=20, segment_seconds=1, start_time=read_start_time(target.pid))
    try:
        deadline = time.monotonic() + 60
        while not sampler.health().detail["capabilities"] and time.monotonic() < deadline:
            time.sleep(0.05)
        print(sampler.health().detail["capabilities"], flush=True)
    finally:
        sampler.close()
        target.kill()
        target.wait()
""")


def test_an_agent_without_cap_setpcap_says_pyspy_keeps_its_capabilities(require_root) -> None:
    # setpriv cannot shrink a bounding set without CAP_SETPCAP, and exits 0 all the same.
    out = subprocess.run(["setpriv", "--bounding-set=-setpcap", "--", sys.executable, "-c", UNREDUCED],
                         capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    assert "not reduced" in out.stdout, out.stdout
    assert "runs with capabilities" in out.stderr and "CAP_SETPCAP" in out.stderr, out.stderr
