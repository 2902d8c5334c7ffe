"""CI replay of the neighbours that take the server's memory or its disk (`memory.toml`, `disk.toml`, issue 34), one
live run each (docs/BENCHMARKS.md, "Neighbours that take the memory or the disk"): found, labelled, and for memory
the neighbour that grew named by its pid, the one the scenario recorded. Pinned as recorded, with the reason."""

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
    # A neighbour writing and fsyncing 128 MiB/s on the disk the server syncs its small writes to (recorded
    # 2026-12-04 13:45-13:52 UTC, load average 0.2 before, 1.0 after): the server's p99 moved little (0.15-0.2 s
    # normal, 0.15-0.48 s in the phase: its fsyncs waited a little longer), but the I/O stall of its cgroup went
    # x4.4 over its baseline (0.077 s/s against 0.018) in every window; the regression opened after 6 windows (p99
    # stayed under the expected 0.39 s: only the phase's mean moved), labelled `blocked` by that stall. The recording predates the writers (docs/detector.md "Who wrote":
    # its windows' `writers` are null), so the recorded culprit is not named in replay.
    "disk": ("blocked", 6, "not named"),
    # A neighbour in the server's memory-limited family holding it at 50-200 major faults/s (recorded 2026-12-04
    # 13:53-14:01 UTC, load average 1.6 before, 0.2 after). The squeeze bites in bursts: the server's pages go, it
    # stalls for seconds reading them back (memory stall of its cgroup 0.13-0.41 s/s, 230-350 major faults/s, p99 9.9
    # s and 19.6 s, three windows with no answer at all), then runs normally again for a few windows. The first
    # burst left one anomalous window (2-of-3 needs two); the second opened it, 9 windows after onset, labelled
    # `memory` and naming the allocating neighbour by the pid the scenario recorded (it grew by 125-195 MiB).
    "memory": ("memory", 9, "named"),
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


def test_the_disk_recording_with_writers_read_scores_the_writer_it_names() -> None:
    # The scoring path of `culprit_top1` for a disk stall, on the recorded windows: the recording predates the
    # writers, so they are put in here as the pressure source reads them (synthetic, not measured: the diskhog's
    # recorded pid at its 128 MiB/s in every window its I/O stalled, the server's own small syncs beside it).
    # The cause names the recorded pid first, and the phase is scored as named; without the writers it is not.
    from agent.evaluation.detection import detect
    from agent.evaluation.recording import read_recording
    from analysis.scoring import score_run, summarize
    from analysis.window import DiskWriter

    rec = read_recording(RECORDED / "disk.jsonl.gz")
    (culprit,) = {w.culprit for w in rec.windows if w.culprit is not None}
    for item in rec.windows:
        w = item.window
        if w.pressure is None or w.pressure.cgroup is None or w.pressure.cgroup["io"]["some"] < 0.01 * w.duration:
            continue  # not read where the I/O did not stall 1 % of the window (agent/sources/pressure.py)
        own = DiskWriter(pid=w.pid, comm="python", written_bytes=3 << 20, seconds=w.duration, member=True)
        hog = DiskWriter(pid=culprit, comm="python3", written_bytes=int(128 * w.duration) << 20,
                         seconds=w.duration, cmdline="python3 diskhog.py 90")
        w.pressure.writers = [hog, own] if item.culprit is not None else [own]
    score = score_run(rec.scenario.name, detect(LatencyDetector, rec.windows))
    (phase,) = score.fault_phases
    assert phase.detected and phase.top_cause == "blocked" and phase.named == culprit, phase
    assert summarize([score])["culprit_top1"] == 1.0
