"""The outside-fault commands of `variants/outside_more.toml` and `outside_network.toml` do what they say to a real
process or link, and undo it at exit: a CPU cap on the process's cgroup, the process frozen through its cgroup,
its threads pinned to one CPU, loopback shaped by a token bucket (in a network namespace of its own, so the host's
loopback is left alone)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SPINNER = "import threading, time\nfor _ in range(2):\n    threading.Thread(target=lambda: [0 for _ in iter(int, 1)], daemon=True).start()\ntime.sleep(60)\n"


@pytest.fixture
def spinner():
    """A process with two busy threads (and its main thread asleep)."""
    proc = subprocess.Popen([sys.executable, "-c", SPINNER])
    deadline = time.monotonic() + 10
    while len(os.listdir(f"/proc/{proc.pid}/task")) < 3:
        assert time.monotonic() < deadline, "the spinner's threads never started"
        time.sleep(0.05)
    yield proc.pid
    proc.kill()
    proc.wait()


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cgroups(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return f.read()


def _affinities(pid: int) -> set[str]:
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            out.update(line.split(":", 1)[1].strip() for line in f if line.startswith("Cpus_allowed_list"))
    return out


def _command(name: str, *args: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(HERE / name), *map(str, args)], stderr=subprocess.PIPE, text=True)


def test_a_cpu_quota_caps_the_process_and_leaves_with_the_command(require_root, spinner):
    home = _cgroups(spinner)
    cap = _command("cpuquota.py", spinner, 30, 20)
    try:
        time.sleep(1.0)  # the move and the first periods
        assert f"infersight_eval_quota_{spinner}" in _cgroups(spinner), (
            cap.stderr.read() if cap.poll() is not None else "not moved")
        before = _cpu_seconds(spinner)
        time.sleep(2.0)
        used = _cpu_seconds(spinner) - before
    finally:
        cap.terminate()
        assert cap.wait(10) == 0, cap.stderr.read()
    # Two busy threads take up to 2 CPU-seconds in 2 s uncapped; capped at 20 % of one CPU, 0.4.
    assert used < 0.8, f"{used:.2f} CPU-s in 2 s under a 20 % cap"
    assert _cgroups(spinner) == home
    assert not list(Path("/sys/fs/cgroup").glob(f"*/infersight_eval_quota_{spinner}"))


def test_freezing_stops_the_process_and_it_runs_again_after(require_root, spinner):
    home = _cgroups(spinner)
    freeze = _command("freeze.py", spinner, 30, 900, 1000)
    try:
        time.sleep(1.0)
        assert f"infersight_eval_freeze_{spinner}" in _cgroups(spinner), (
            freeze.stderr.read() if freeze.poll() is not None else "not moved")
        before = _cpu_seconds(spinner)
        time.sleep(2.0)
        frozen_use = _cpu_seconds(spinner) - before
    finally:
        freeze.terminate()
        assert freeze.wait(10) == 0, freeze.stderr.read()
    # Two busy threads take up to 4 CPU-seconds in 2 s on two CPUs; frozen 90 % of the time, about 0.4.
    assert frozen_use < 1.0, f"{frozen_use:.2f} CPU-s in 2 s while frozen 90 % of the time"
    assert _cgroups(spinner) == home
    before = _cpu_seconds(spinner)
    time.sleep(1.0)
    assert _cpu_seconds(spinner) - before > 0.5, "the process did not run again after the command"
    assert not list(Path("/sys/fs/cgroup").glob(f"*/infersight_eval_freeze_{spinner}"))


def test_pinning_moves_every_thread_to_one_cpu_and_restores_each(require_root, spinner):
    before = _affinities(spinner)
    pin = _command("pin.py", spinner, 30, "0")
    try:
        deadline = time.monotonic() + 5
        while _affinities(spinner) != {"0"}:
            assert time.monotonic() < deadline and pin.poll() is None, f"not pinned: {_affinities(spinner)}"
            time.sleep(0.05)
    finally:
        pin.terminate()
        assert pin.wait(10) == 0, pin.stderr.read()
    assert _affinities(spinner) == before


@pytest.mark.parametrize(("cpus", "message"), [
    ("4096", "CPU list '4096' names CPUs this process cannot use: [4096]"),
    ("one", "CPU list 'one' is not like 0 or 0-3 or 0,2"),
])
def test_pinning_to_cpus_that_cannot_be_had_is_one_line(spinner, cpus, message):
    before = _affinities(spinner)
    done = subprocess.run([sys.executable, str(HERE / "pin.py"), str(spinner), "1", cpus], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 1 and done.stderr.strip() == message
    assert _affinities(spinner) == before


@pytest.fixture
def netns(require_root):
    name = f"infersight_tbf_{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
    yield ["ip", "netns", "exec", name]
    subprocess.run(["ip", "netns", "del", name], check=True)


def _root_qdisc(netns: list[str]) -> str:
    return subprocess.run([*netns, "tc", "qdisc", "show", "dev", "lo", "root"], capture_output=True, text=True,
                          check=True).stdout


def test_rate_limit_shapes_loopback_and_removes_the_shaping(netns):
    shaper = subprocess.Popen([*netns, sys.executable, str(HERE / "ratelimit.py"), "30", "32kbit", "200ms"],
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 5
        while "tbf" not in _root_qdisc(netns):
            assert time.monotonic() < deadline and shaper.poll() is None, "no token bucket on loopback"
            time.sleep(0.05)
        assert "rate 32Kbit" in _root_qdisc(netns)
    finally:
        shaper.terminate()
        assert shaper.wait(10) == 0, shaper.stderr.read()
    assert _root_qdisc(netns).startswith("qdisc noqueue")


def test_rate_limit_leaves_a_qdisc_it_did_not_put_there(netns):
    subprocess.run([*netns, "tc", "qdisc", "add", "dev", "lo", "root", "pfifo"], check=True)
    done = subprocess.run([*netns, sys.executable, str(HERE / "ratelimit.py"), "1"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1 and done.stderr.startswith("lo already has a root qdisc, not replacing it: qdisc pfifo")
    assert "pfifo" in _root_qdisc(netns)
