"""The agent's own footprint in a target (its GC probe's uretprobe trampoline) is never read as the server's work."""

from pathlib import Path

import pytest

from agent.evaluation.recording import read_recording
from analysis.detector import LatencyDetector
from analysis.features import extract
from analysis.members import member_measures
from analysis.window import MemberReading, SyscallReading
from tests.analysis import synth

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def test_uretprobe_calls_are_not_the_targets_syscalls():
    w = synth.window(3)
    w.syscalls = SyscallReading(counts={"futex": 4000, "read": 1000, "uretprobe": 5000})
    f = extract(w)
    assert f.syscalls_per_second == pytest.approx(5000 / w.duration)
    assert f.syscalls_per_request == pytest.approx(5000 / w.latency.requests)
    assert "uretprobe" not in f.top_syscalls


def test_a_members_syscall_measure_leaves_out_uretprobe_too():
    w = synth.window(3)
    w.members = [MemberReading(pid=7, role="engine", syscalls={"futex": 100, "uretprobe": 900})]
    row = member_measures(w, extract(w))["7"]
    assert row["syscalls"] == pytest.approx(100 / w.duration)
    # The member's own cause signals (analysis.members.rank_in_members reads them) leave it out as well.
    assert row["signals"]["syscalls"] == pytest.approx(100 / w.latency.requests)


# Recorded live GC faults whose windows count one `uretprobe` per collection (Linux 6.11+ makes the trampoline a
# syscall): the old features doubled syscalls per request there and the detector named "syscalls" second.
@pytest.mark.parametrize("recording", ["recorded-full", "recorded-neighbours", "recorded-fresh", "recorded-allthreads"])
def test_a_gc_fault_is_not_also_a_syscall_regression(recording: str):
    rec = read_recording(SCENARIOS / recording / "gc.jsonl.gz")
    assert sum(i.window.syscalls.counts.get("uretprobe", 0) for i in rec.windows if i.window.syscalls) > 10_000
    detector = LatencyDetector()
    named: set[str] = set()
    for item in rec.windows:
        verdict = detector.update(item.window)
        current = verdict.regression or verdict.closed
        if current is not None and item.label == "gc":
            named.update(c.label for c in current.causes)
    assert "gc" in named
    assert "syscalls" not in named
