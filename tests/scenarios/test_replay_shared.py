"""CI replay of the neighbours that take the server's memory or its disk (`memory.toml`, `disk.toml`, issue 34), one
live run each (docs/BENCHMARKS.md, "Neighbours that take the memory or the disk"): found, labelled, and the
neighbour that grew or wrote named by its pid, the one the scenario recorded. Pinned as recorded, with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.evaluation import command
from analysis.detector import LatencyDetector

HERE = Path(__file__).resolve().parent
RECORDED = HERE / "recorded-shared"

# Recording -> (label, windows from onset to the regression opening, the culprit named). "named": the top cause
# names the pid the scenario recorded as the culprit; "not named": it names no process (or another).
EXPECTED: dict[str, tuple[str, int, str]] = {
    # A neighbour writing and fsyncing 128 MiB/s on the disk the server syncs its small writes to (recorded live
    # 2026-12-05 05:52:31-05:59:39 UTC, alone on the lock, load average 1.50 before, 0.57 after, code of 6d0f34f):
    # the server's p99 moved little (0.2-0.5 s against 0.1-0.3 s before), but the I/O stall of its cgroup (the root:
    # the host's) went x4.3 over its baseline (0.059 s/s against 0.014); the regression opened after 4 windows,
    # labelled `blocked` by that stall, and names the writer the agent read from /proc/PID/io while the I/O stalled
    # (docs/detector.md "Who wrote"): the diskhog's pid, the one the scenario recorded, ahead of the server's own,
    # at its own rate ("wrote 3180 MiB in 25 s, 127.3 MiB/s": the writer's own seconds, checked live here).
    "disk": ("blocked", 4, "named"),
    # A neighbour in the server's memory-limited family holding it at 50-200 major faults/s (recorded live
    # 2026-12-05 05:42:47-05:49:55 UTC, alone on the lock, load average 1.80 before, 0.64 after, code of 9a1cc57).
    # The squeeze bit hard this time: 20 s into the phase the server stalled outright (no answer in 11 windows, one
    # request of 59.8 s when it came back), 147-223 major faults/s. The regression opened 4 windows after onset,
    # labelled `memory`, naming the allocating neighbour by the pid the scenario recorded (it grew 133 MiB in 75 s);
    # it stays `memory` to the phase's end (after it, while the server recovers, it is re-ranked `lock`). The
    # 2026-12-04 13:53 take (before the writers, the 15 s stack recordings) opened after 9 windows.
    "memory": ("memory", 4, "named"),
}


def _run(name: str):
    (run,) = command.replay([RECORDED / f"{name}.jsonl.gz"], LatencyDetector)
    return run


def test_every_recording_is_pinned() -> None:
    assert {p.name.removesuffix(".jsonl.gz") for p in RECORDED.glob("*.jsonl.gz")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_neighbour_is_found_labelled_and_named_as_recorded(name: str) -> None:
    label, delay, named = EXPECTED[name]
    run = _run(name)
    (phase,) = run.score.fault_phases
    assert phase.label == label and phase.detected and phase.top_cause == label, phase
    assert phase.delay_windows == delay, phase
    assert phase.culprit is not None  # the scenario recorded its neighbour's pid
    assert (phase.named == phase.culprit) == (named == "named"), (phase.named, phase.culprit)
    assert not [e for e in run.score.episodes if e.phase is None]  # no false alarm


def test_the_outside_hog_beside_neighbours_is_found_by_its_stall_and_named_by_its_pid() -> None:
    # `recorded-neighbours/outside` re-recorded 2026-12-04 14:01-14:15 UTC beside two neighbours.py loops (load
    # average 1.3 at the start, 3.2 after), the hog as busy threads of one process whose pid the scenario recorded.
    # The run-queue rise is 0.85 sigma of the 6 the sustained test needs (docs/detector.md "Sensitivity floor"); the
    # direct evidence finds it: the six-window latency shift passed the sustained bar (0.95 of 0.75), the CPU stall
    # of the server's cgroup (the root: the host's) stayed above the baseline's usual high in 6 of 6 windows at x3.0
    # its median, and one process led the server's run-queue wait in all six, x3.4 the next (LatencyDetector.
    # _contention). Found 7 windows after onset, labelled cpu_contention, the hog named first by its pid.
    from agent.evaluation.recording import read_recording

    rec = read_recording(HERE / "recorded-neighbours" / "outside.jsonl.gz")
    hog = [w for w in rec.windows if w.label == "cpu_contention"]
    (culprit,) = {w.culprit for w in hog}
    assert culprit is not None and {w.culprit for w in rec.windows if w.label != "cpu_contention"} == {None}
    first = [next((c.pid for c in w.window.runqueue.culprits if c.kind == ""), None) for w in hog]
    assert len(hog) == 18 and first.count(culprit) == 15, first
    (run,) = command.replay([HERE / "recorded-neighbours" / "outside.jsonl.gz"], LatencyDetector)
    (phase,) = [p for p in run.score.fault_phases if p.label == "cpu_contention"]
    assert phase.detected and phase.top_cause == "cpu_contention" and phase.delay_windows == 7, phase
    assert phase.culprit == culprit and phase.named == culprit, phase
    assert not [e for e in run.score.episodes if e.phase is None]  # no false alarm


def test_the_disk_writer_is_named_from_what_the_agent_read_live_and_not_without_it() -> None:
    # The live recording's writers (agent/sources/disk_writers.py, read only where the I/O stalled >= 1 % of the
    # window): in every window of the phase the diskhog's pid, the one the scenario recorded when it started it,
    # wrote most (600-650 MiB in 5 s: its 128 MiB/s), the server's own syncs second and marked as its own; it is
    # never among the writers outside the phase. The phase is scored as named from those readings: with them taken
    # out it is still found and labelled, but names nobody.
    from agent.evaluation.detection import detect
    from agent.evaluation.recording import read_recording
    from analysis.scoring import score_run

    rec = read_recording(RECORDED / "disk.jsonl.gz")
    (culprit,) = {w.culprit for w in rec.windows if w.culprit is not None}
    phase = [i.window.pressure for i in rec.windows if i.culprit is not None]
    assert len(phase) == 18 and all(p.writers and p.writers[0].pid == culprit for p in phase)
    assert all(not p.writers[0].member and p.writers[0].written_bytes >= 500 << 20 for p in phase)
    assert all(w.member for p in phase for w in p.writers[1:])
    others = [i.window.pressure for i in rec.windows if i.culprit is None]
    assert not [w for p in others for w in (p.writers or []) if w.pid == culprit]
    for item in rec.windows:
        item.window.pressure.writers = None
    (blind,) = score_run(rec.scenario.name, detect(LatencyDetector, rec.windows)).fault_phases
    assert blind.detected and blind.top_cause == "blocked" and blind.named is None, blind


# Every neighbour phase of the shared-host recordings whose scenario recorded its culprit's pid (the run command's,
# or the cpuhog fault's spinners), and whether the regression named it first at the phase's end. Pinned as recorded.
NEIGHBOUR_PHASES: dict[str, bool] = {
    "recorded-neighbours/outside": True,
    # Re-recorded 2026-12-05 06:02:43-06:09:56 UTC beside two neighbours.py loops (load average 2.4 at the start,
    # 3.9-8.0 in the hog phase). Found 3 windows after onset, labelled cpu_contention, but a tenant's test process
    # (pid 770, a burst of 2.1 s in one window) led the last `attribution_windows` windows, in which the four
    # spinners held 0.4-0.7 s each; summed over the phase's 18 windows a spinner leads every other process (7.3 s; the
    # next tenant 5.1 s). Named from the last windows the tenant came first; since session 22 the cause names its
    # neighbours from the whole open episode's culprits (analysis.culprits.pooled): a spinner first
    # (docs/BENCHMARKS.md "cpuhog's spinners recorded as its culprit").
    "recorded-neighbours/cpuhog": True,
    "recorded-shared/disk": True,
    "recorded-shared/memory": True,
}


def test_the_neighbour_named_in_each_phase_with_a_recorded_culprit_is_as_recorded() -> None:
    sets = ("recorded-neighbours", "recorded-shared")
    found: dict[str, bool] = {}
    for path in sorted(p for s in sets for p in (HERE / s).glob("*.jsonl.gz")):
        (run,) = command.replay([path], LatencyDetector)
        for phase in run.score.fault_phases:
            if phase.culprit is not None:
                assert phase.detected, (path.name, phase)
                found[f"{path.parent.name}/{path.name.removesuffix('.jsonl.gz')}"] = phase.culprit_named
    assert found == NEIGHBOUR_PHASES
