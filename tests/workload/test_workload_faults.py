"""Each fault switch toggles and moves its own ground-truth signal, read outside the agent."""

import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from workload.client import complete, debug, set_fault
from workload.faults import FaultTuning
from workload.netloss import table_name

pytestmark = pytest.mark.workload
REPO = Path(__file__).resolve().parents[2]
STEPS = 40  # decode steps per measured burst: one request of this many tokens


def burst(url: str, requests: int = 1, tokens: int = STEPS, prompt: str = "measure me") -> list:
    results: list = [None] * requests

    def run(i: int) -> None:
        results[i] = complete(url, prompt, tokens, temperature=0.0, timeout=120)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    assert all(r is not None and r.ok for r in results), [r.error for r in results if r]
    return results


def delta(read: Callable[[], float], action: Callable[[], object]) -> float:
    before = read()
    action()
    return read() - before


def proc_io_syscr(pid: int) -> int:
    text = Path(f"/proc/{pid}/io").read_text()
    return int(re.search(r"^syscr:\s+(\d+)", text, re.MULTILINE).group(1))


def run_delay_ns(pid: int, tid: int) -> int:
    # schedstat: on-CPU ns, run-queue wait ns, timeslices (Documentation/scheduler/sched-stats.rst)
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])


def tcp_retrans_segs() -> int:
    lines = [line.split() for line in Path("/proc/net/snmp").read_text().splitlines() if line.startswith("Tcp:")]
    return int(lines[1][lines[0].index("RetransSegs")])


@pytest.fixture
def fault(server):
    switched: list[str] = []

    def toggle(name: str, on: bool) -> None:
        set_fault(server.url, name, on, server.token)
        switched.append(name)

    yield toggle
    for name in switched:
        set_fault(server.url, name, False, server.token)


def test_gc_fault_multiplies_collections(server, fault) -> None:
    def gen0() -> float:
        return debug(server.url, server.token)["gc"]["collections"][0]

    off = delta(gen0, lambda: burst(server.url))
    fault("gc", True)
    on = delta(gen0, lambda: burst(server.url))
    # 4000 cycles x 3 tracked containers per step, gen0 threshold 700: >= 10 collections per step.
    assert on >= 10 * STEPS, (off, on)
    assert on > 20 * max(off, 1)


def test_syscall_fault_adds_reads_per_step(server, fault) -> None:
    off = delta(lambda: proc_io_syscr(server.pid), lambda: burst(server.url))
    fault("syscall", True)
    on = delta(lambda: proc_io_syscr(server.pid), lambda: burst(server.url))
    assert on - off >= 0.9 * FaultTuning().syscalls_per_sequence * STEPS, (off, on)


def off_cpu_seconds(pid: int, tid: int) -> float:
    """Wall time minus on-CPU and run-queue time: how long the thread slept (futex waits included)."""
    on_cpu_ns, run_queue_ns, _ = map(int, Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split())
    return time.monotonic() - (on_cpu_ns + run_queue_ns) / 1e9


def test_lock_fault_makes_the_scheduler_sleep_on_the_lock(server, fault) -> None:
    tid = debug(server.url, server.token)["scheduler_tid"]

    def waited() -> float:
        return debug(server.url, server.token)["lock_wait_seconds"]

    def slept() -> float:
        return off_cpu_seconds(server.pid, tid)

    # 160 tokens: the holder frees the lock 20 ms in every 60, so a fast host's scheduler slips steps through those
    # gaps; at 80 tokens a quiet CI-like host slept 0.16 s in all (the full suite, 2026-12-05), under the 0.2 s bar.
    off_slept = delta(slept, lambda: burst(server.url, tokens=160))
    fault("lock", True)
    before_wait, before_sleep = waited(), slept()
    burst(server.url, tokens=160)
    on_waited, on_slept = waited() - before_wait, slept() - before_sleep
    # The kernel's view (the scheduler thread off CPU) agrees with the server's own lock-wait clock.
    assert on_slept > 0.2 and on_slept > 5 * off_slept, (off_slept, on_slept)
    assert on_waited == pytest.approx(on_slept, rel=0.5), (on_waited, on_slept)


def test_nocache_fault_keeps_tokens_and_raises_latency(server, fault) -> None:
    prompt = "a long prompt to recompute " * 12
    pairs = []
    reference = None
    for _ in range(3):
        off = burst(server.url, prompt=prompt, tokens=64)[0]
        fault("nocache", True)
        assert debug(server.url, server.token)["use_cache"] is False
        on = burst(server.url, prompt=prompt, tokens=64)[0]
        fault("nocache", False)
        reference = reference or off.token_ids
        assert on.token_ids == off.token_ids == reference
        pairs.append(on.latency_s / off.latency_s)
    assert statistics.median(pairs) > 1.5, pairs


@pytest.mark.root
def test_netloss_fault_drops_packets_and_causes_retransmits(server, fault, require_root) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    fault("netloss", True)
    listed = subprocess.run(["nft", "list", "table", "inet", table_name(port)], capture_output=True, text=True, check=False)
    assert listed.returncode == 0 and f"dport {port}" in listed.stdout
    retrans_before = tcp_retrans_segs()
    burst(server.url, requests=4, tokens=60)
    dropped = sum(int(n) for n in re.findall(r"packets (\d+)", subprocess.run(
        ["nft", "list", "table", "inet", table_name(port)], capture_output=True, text=True, check=False).stdout))
    assert dropped > 0
    assert tcp_retrans_segs() > retrans_before
    set_fault(server.url, "netloss", False, server.token)
    gone = subprocess.run(["nft", "list", "table", "inet", table_name(port)], capture_output=True, text=True, check=False)
    assert gone.returncode != 0, "netloss table still present after switching off"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"


def test_cpuhog_fault_raises_run_queue_delay_and_cleans_up(server, fault) -> None:
    tid = debug(server.url, server.token)["scheduler_tid"]
    affinity = os.sched_getaffinity(server.pid)
    waits = {"off": 0, "on": 0}
    pids: list[int] = []
    for state in ("off", "on", "on", "off"):  # interleaved: other load on the machine hits both sides
        fault("cpuhog", state == "on")
        if state == "on":
            pids = debug(server.url, server.token)["cpuhog_pids"]
            assert len(pids) == 2 * len(affinity)
            assert all(os.sched_getaffinity(p) == affinity for p in pids)
        waits[state] += delta(lambda: run_delay_ns(server.pid, tid), lambda: burst(server.url))
        if state == "on":
            set_fault(server.url, "cpuhog", False, server.token)
            assert not any(_alive(p) for p in pids), "hogs still running after the switch went off"
    # Two spinners per CPU against one scheduler thread: it spends most of each burst runnable but waiting.
    assert waits["on"] > 2 * waits["off"] and waits["on"] > 50_000_000, waits


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_cpuhog_dies_with_the_server(server_factory, how: str) -> None:
    doomed = server_factory()
    set_fault(doomed.url, "cpuhog", True, doomed.token)
    pids = debug(doomed.url, doomed.token)["cpuhog_pids"]
    assert pids and all(_alive(p) for p in pids)
    if how == "SIGTERM":
        doomed.proc.terminate()
    else:
        doomed.proc.kill()
    doomed.proc.wait(15)
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), f"hogs outlived the server after {how}"


def test_fault_cli_round_trip(server) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "workload", "fault", *args, "--url", server.url],
                              cwd=REPO, capture_output=True, text=True, timeout=60, check=False)

    assert cli("gc", "on", "--token", server.token).returncode == 0
    assert debug(server.url, server.token)["faults"]["gc"] is True
    denied = cli("gc", "off", "--token", "wrong")
    assert denied.returncode == 1 and "401" in denied.stderr
    assert cli("gc", "off", "--token", server.token).returncode == 0
    assert debug(server.url, server.token)["faults"]["gc"] is False


def proc_io_wchar(pid: int) -> int:
    text = Path(f"/proc/{pid}/io").read_text()
    return int(re.search(r"^wchar:\s+(\d+)", text, re.MULTILINE).group(1))


def test_io_fault_writes_and_fsyncs_on_a_real_disk_per_step(server, fault) -> None:
    tuning = FaultTuning()
    mounts = {line.split()[1]: line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()}
    where = max((m for m in mounts if tuning.io_dir.startswith(m)), key=len)
    assert mounts[where] != "tmpfs", f"{tuning.io_dir} is on tmpfs: fsync would not block"
    off = delta(lambda: proc_io_wchar(server.pid), lambda: burst(server.url))
    syncs = debug(server.url, server.token)["io_syncs"]
    fault("io", True)
    on = delta(lambda: proc_io_wchar(server.pid), lambda: burst(server.url))
    assert on - off >= 0.9 * tuning.io_write_bytes * tuning.io_writes_per_sequence * STEPS, (off, on)
    assert debug(server.url, server.token)["io_syncs"] - syncs >= STEPS * tuning.io_writes_per_sequence
