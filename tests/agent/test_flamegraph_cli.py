"""`infersight flamegraph`: stored ranges, diffs, live capture from a real process, and bad options."""

import subprocess
import sys
import time

import pytest

from agent.store import Store
from analysis.window import StackReading, Window


def infersight(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "agent.cli", "flamegraph", *args], capture_output=True,
                          timeout=timeout)


@pytest.fixture
def store_dir(tmp_path):
    path = tmp_path / "store"
    store = Store.open(path)
    for t in range(0, 50, 5):
        store.add_window(Window(target="server", pid=7, start=t, end=t + 5,
                                stacks=StackReading(active={"main;step;matmul": 4, "main;step;softmax": 4})))
    for t in range(50, 100, 5):
        store.add_window(Window(target="server", pid=7, start=t, end=t + 5,
                                stacks=StackReading(active={"main;step;matmul": 4, "main;step;gc_churn": 12})))
    store.close()
    return path


def test_stored_range_as_folded(store_dir):
    proc = infersight("--store", str(store_dir), "--target", "server", "--from", "0", "--to", "50",
                      "--format", "folded")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines() == ["main;step;matmul 40", "main;step;softmax 40"]


def test_pid_resolves_to_its_stored_target(store_dir):
    proc = infersight("--store", str(store_dir), "--pid", "7", "--from", "50", "--to", "100", "--format", "folded")
    assert proc.returncode == 0, proc.stderr
    assert b"main;step;gc_churn 120" in proc.stdout


def test_diff_to_a_file(store_dir, tmp_path):
    out = tmp_path / "diff.svg"
    proc = infersight("--store", str(store_dir), "--target", "server", "--baseline-from", "0", "--baseline-to", "50",
                      "--from", "50", "--to", "100", "--format", "svg", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    svg = out.read_text()
    assert svg.startswith("<?xml") and "gc_churn" in svg and "softmax" in svg
    movers = infersight("--store", str(store_dir), "--target", "server", "--baseline-from", "0", "--baseline-to",
                        "50", "--from", "50", "--to", "100", "--format", "json")
    assert b'"function": "gc_churn"' in movers.stdout


@pytest.mark.parametrize("args, says", [
    (["--target", "server", "--duration", "5", "--from=-1m"], b"either --duration"),
    (["--target", "server"], b"--duration S (live) or --from/--to"),
    (["--target", "server", "--from", "0", "--baseline-from", "0"], b"baseline"),  # no --baseline-to is fine
    (["--target", "server", "--from", "0", "--format", "json"], b"format"),
])
def test_bad_option_combinations_exit_2(store_dir, args, says):
    proc = infersight("--store", str(store_dir), *args)
    if says == b"baseline":
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == 2
    assert says in proc.stderr and proc.stderr.count(b"\n") == 1


def test_missing_store_is_one_line(tmp_path):
    proc = infersight("--store", str(tmp_path / "nope"), "--target", "x", "--from", "0")
    assert proc.returncode == 2 and b"no store at" in proc.stderr


LIVE_CHILD = """
import threading, time
def hot_loop_for_flamegraph():
    x = 0
    while True:
        x += 1
def waiting_on_event():
    threading.Event().wait()
threading.Thread(target=waiting_on_event, daemon=True).start()
hot_loop_for_flamegraph()
"""


@pytest.mark.bpf
def test_live_capture_of_a_real_process(require_bpf, tmp_path):
    child = subprocess.Popen([sys.executable, "-c", LIVE_CHILD])
    try:
        time.sleep(0.5)
        active = infersight("--pid", str(child.pid), "--duration", "3", "--format", "folded")
        idle = infersight("--pid", str(child.pid), "--duration", "3", "--kind", "idle", "--format", "folded")
        off = infersight("--pid", str(child.pid), "--duration", "2", "--kind", "offcpu", "--format", "folded")
    finally:
        child.kill()
        child.wait()
    assert active.returncode == 0, active.stderr
    assert b"hot_loop_for_flamegraph" in active.stdout and b"waiting_on_event" not in active.stdout
    assert b"waiting_on_event" in idle.stdout
    assert off.returncode == 0, off.stderr
    assert b"futex" in off.stdout  # the waiting thread blocks in futex_wait


@pytest.mark.parametrize("where", ["DIR", "/no/such/dir/out.svg"])
def test_a_bad_output_path_fails_at_once_and_leaves_nothing(store_dir, tmp_path, where):
    target = tmp_path / "outdir"
    target.mkdir()
    output = str(target) if where == "DIR" else where
    before = set(map(str, tmp_path.iterdir())) | set(map(str, __import__("pathlib").Path("/").iterdir()))
    began = time.monotonic()
    proc = infersight("--pid", "1", "--duration", "30", "-o", output)
    assert time.monotonic() - began < 10, "the bad path was found only after the capture"
    assert proc.returncode == 2 and b"Traceback" not in proc.stderr, proc.stderr
    assert b"-o" in proc.stderr and proc.stderr.count(b"\n") == 1
    after = set(map(str, tmp_path.iterdir())) | set(map(str, __import__("pathlib").Path("/").iterdir()))
    assert after == before and list(target.iterdir()) == []


def test_no_samples_is_an_error_not_an_empty_file(store_dir, tmp_path):
    out = tmp_path / "x.folded"
    proc = infersight("--store", str(store_dir), "--target", "nobody", "--from", "0", "--to", "100",
                      "--format", "folded", "-o", str(out))
    assert proc.returncode == 1 and b"no active samples" in proc.stderr and not out.exists(), proc.stderr
    proc = infersight("--store", str(store_dir), "--target", "server", "--from", "500", "--to", "600",
                      "--baseline-from", "0", "--baseline-to", "50", "--format", "json")
    assert proc.returncode == 1 and b"no active samples" in proc.stderr, proc.stderr
    proc = infersight("--store", str(store_dir), "--target", "server", "--from", "0", "--to", "100",
                      "--baseline-from", "500", "--baseline-to", "600", "--format", "json")
    assert proc.returncode == 1 and b"baseline" in proc.stderr, proc.stderr


def test_a_non_python_process_gives_an_error_not_an_empty_file(tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    out = tmp_path / "x.svg"
    try:
        proc = infersight("--pid", str(sleeper.pid), "--duration", "1", "-o", str(out))
    finally:
        sleeper.kill()
        sleeper.wait()
    assert proc.returncode == 1 and not out.exists(), proc.stderr
    # py-spy's own reason when it cannot attach, or "no active samples" when it attached and saw no Python.
    assert (b"py-spy failed to attach" in proc.stderr or b"no active samples" in proc.stderr), proc.stderr
    assert b"Traceback" not in proc.stderr and proc.stderr.count(b"\n") == 1
