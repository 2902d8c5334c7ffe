"""Scoring on synthetic timelines whose precision, recall, delays and attribution are known by hand."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from analysis.scoring import Outcome, score_run, summarize

STEP = 5.0


@dataclass
class Ep:
    opens: int
    closes: int | None = None  # the window it closes on; None: still open at the end
    # window -> top cause from that window on
    causes: dict[int, str] = field(default_factory=dict)


def timeline(phases: list[tuple[str, int]], episodes: list[Ep] = (), warmup: int = 0) -> list[Outcome]:
    labels = [(i, label) for i, (label, n) in enumerate(phases) for _ in range(n)]
    out = []
    for w, (phase, label) in enumerate(labels):
        reg = opened = cause = None
        for k, e in enumerate(episodes):
            last = e.closes if e.closes is not None else len(labels)
            if e.opens <= w <= last:
                reg = f"r{k}"
                opened = reg if w == e.opens else None
                cause = next((c for at, c in sorted(e.causes.items(), reverse=True) if at <= w), "unknown")
        out.append(Outcome(start=w * STEP, end=(w + 1) * STEP, label=label, phase=phase, warmup=w < warmup,
                           state="warmup" if w < warmup else ("regression" if reg else "healthy"),
                           regression=reg, top_cause=cause, opened=opened))
    return out


def test_a_clean_detection_with_the_right_cause() -> None:
    run = score_run("s", timeline([("normal", 10), ("gc", 4), ("normal", 6)], [Ep(11, 15, {11: "gc"})], warmup=4))
    s = summarize([run])
    assert (s["precision"], s["recall"], s["attribution_top1"]) == (1.0, 1.0, 1.0)
    assert s["median_delay_windows"] == 1.0
    # From the phase's first window start (10 * 5 s) to the end of the opening window (12 * 5 s).
    assert s["median_delay_seconds"] == 10.0
    assert s["windows_scored"] == 16 and s["false_alarms"] == 0
    assert s["per_label"] == {"gc": {"phases": 1, "detected": 1, "attributed": 1, "median_delay_windows": 1.0}}


def test_the_cause_counted_is_the_one_stored_when_the_phase_ends() -> None:
    # Ranked lock first, then gc from window 12; the phase ends on window 13; re-ranked to syscalls later.
    run = score_run("s", timeline([("normal", 10), ("gc", 4), ("normal", 6)],
                                  [Ep(10, 16, {10: "lock", 12: "gc", 15: "syscalls"})]))
    assert run.fault_phases[0].top_cause == "gc" and run.fault_phases[0].attributed
    wrong = score_run("s", timeline([("normal", 10), ("gc", 4), ("normal", 6)],
                                    [Ep(10, 16, {10: "gc", 13: "lock"})]))
    assert wrong.fault_phases[0].top_cause == "lock"
    s = summarize([wrong])
    assert s["recall"] == 1.0 and s["attribution_top1"] == 0.0


def test_an_opening_in_the_two_window_tail_still_detects() -> None:
    for opens, detected in ((14, True), (15, True), (16, False)):
        run = score_run("s", timeline([("normal", 10), ("lock", 4), ("normal", 6)], [Ep(opens, 19, {opens: "lock"})]))
        s = summarize([run])
        assert (s["recall"] == 1.0) is detected, opens
        assert s["false_alarms"] == (0 if detected else 1)
        if detected:
            assert s["median_delay_windows"] == opens - 10
            # Opened after the phase: the cause is the one it opened with.
            assert run.fault_phases[0].top_cause == "lock"


def test_false_alarms_precision_and_rate_per_hour_of_normal_time() -> None:
    # 2 fault phases, one detected, plus two false alarms in normal time.
    run = score_run("s", timeline([("normal", 20), ("blocked", 4), ("normal", 20), ("gc", 4), ("normal", 12)],
                                  [Ep(5, 6, {5: "unknown"}), Ep(21, 23, {21: "blocked"}), Ep(35, 36),
                                   ], warmup=2))
    s = summarize([run])
    assert s["episodes"] == 3 and s["false_alarms"] == 2
    assert s["precision"] == pytest.approx(1 / 3)
    assert s["recall"] == 0.5 and s["attribution_top1"] == 1.0
    normal_windows = 20 + 20 + 12 - 2  # minus the warm-up
    assert s["normal_hours"] == pytest.approx(normal_windows * STEP / 3600)
    assert s["false_alarms_per_hour"] == pytest.approx(2 / (normal_windows * STEP / 3600))
    assert s["per_label"]["gc"]["detected"] == 0 and s["per_label"]["blocked"]["median_delay_windows"] == 1.0


def test_warmup_windows_are_not_scored_and_an_unarmed_phase_does_not_count() -> None:
    run = score_run("s", timeline([("normal", 3), ("gc", 4), ("normal", 5)], [], warmup=5))
    s = summarize([run])
    assert s["windows_scored"] == 7 and s["fault_phases"] == 0 and s["recall"] is None
    assert s["precision"] is None and s["median_delay_windows"] is None


def test_an_episode_open_before_the_phase_does_not_detect_it() -> None:
    run = score_run("s", timeline([("normal", 10), ("gc", 4), ("normal", 6)], [Ep(8, 19, {8: "gc"})]))
    s = summarize([run])
    assert s["recall"] == 0.0 and s["false_alarms"] == 1 and s["precision"] == 0.0


def test_a_second_episode_inside_a_phase_is_not_a_false_alarm() -> None:
    run = score_run("s", timeline([("normal", 10), ("cpu_contention", 8), ("normal", 6)],
                                  [Ep(10, 12, {10: "cpu_contention"}), Ep(14, 20, {14: "cpu_contention"})]))
    s = summarize([run])
    assert s["precision"] == 1.0 and s["episodes"] == 2 and s["median_delay_windows"] == 0.0


def test_scenarios_are_scored_apart_and_summed() -> None:
    a = score_run("a", timeline([("normal", 10), ("gc", 4), ("normal", 4)], [Ep(11, 14, {11: "gc"})]))
    b = score_run("b", timeline([("normal", 10), ("network", 4), ("normal", 4)], [Ep(13, 15, {13: "lock"})]))
    c = score_run("c", timeline([("normal", 10), ("network", 4), ("normal", 4)], []))
    s = summarize([a, b, c])
    assert s["recall"] == pytest.approx(2 / 3) and s["attribution_top1"] == 0.5
    assert s["median_delay_windows"] == 2.0  # delays 1 and 3
    assert s["scenarios"]["a"]["attributed"] == 1 and s["scenarios"]["b"]["attributed"] == 0
    assert s["scenarios"]["c"]["recall"] == 0.0 and s["scenarios"]["c"]["precision"] is None
    assert s["per_label"]["network"] == {"phases": 2, "detected": 1, "attributed": 0, "median_delay_windows": 3.0}
    same = summarize([a, a])
    assert set(same["scenarios"]) == {"a", "a #2"}


def test_the_json_keys_the_issue_asks_for() -> None:
    s = summarize([score_run("s", timeline([("normal", 4), ("gc", 2)]))])
    for key in ("precision", "recall", "attribution_top1", "median_delay_windows", "median_delay_seconds",
                "false_alarms_per_hour", "per_label", "scenarios", "windows_scored"):
        assert key in s


def test_culprit_top1_counts_phases_whose_named_neighbour_is_the_recorded_culprit() -> None:
    from dataclasses import replace

    out = timeline([("normal", 10), ("cpu_contention", 4), ("normal", 4), ("cpu_contention", 4), ("normal", 4)],
                   [Ep(11, 15, {11: "cpu_contention"}), Ep(19, 23, {19: "cpu_contention"})], warmup=4)
    # Phase 1's hog was pid 900 and is named; phase 3's was pid 901, but pid 77 is named at the phase's end.
    out = [replace(o, culprit=900 if o.phase == 1 else 901 if o.phase == 3 else None,
                   top_neighbour=900 if 10 <= i <= 15 else (77 if 19 <= i <= 23 else None)) for i, o in enumerate(out)]
    s = summarize([score_run("s", out)])
    assert s["culprit_top1"] == 0.5 and s["attribution_top1"] == 1.0


def test_culprit_top1_counts_a_phase_named_by_any_of_the_processes_its_fault_started() -> None:
    from dataclasses import replace

    out = timeline([("normal", 10), ("cpu_contention", 4), ("normal", 4), ("cpu_contention", 4), ("normal", 4)],
                   [Ep(11, 15, {11: "cpu_contention"}), Ep(19, 23, {19: "cpu_contention"})], warmup=4)
    # Both phases' hogs were four spinners of one job; phase 1 names its third, phase 3 a tenant (pid 77).
    out = [replace(o, culprit=(900, 901, 902, 903) if o.phase == 1 else (910, 911) if o.phase == 3 else None,
                   top_neighbour=902 if 10 <= i <= 15 else (77 if 19 <= i <= 23 else None)) for i, o in enumerate(out)]
    run = score_run("s", out)
    assert [p.culprit_named for p in run.fault_phases] == [True, False]
    assert summarize([run])["culprit_top1"] == 0.5


def test_culprit_top1_is_not_measured_where_no_phase_recorded_a_culprit() -> None:
    run = score_run("s", timeline([("normal", 10), ("gc", 4), ("normal", 6)], [Ep(11, 15, {11: "gc"})], warmup=4))
    assert summarize([run])["culprit_top1"] is None
