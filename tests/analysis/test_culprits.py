"""The run-queue culprits as the detector reads them: the agent's own share out, a family's merged, named in words."""

import json

import pytest

from analysis import culprits
from analysis.features import extract
from analysis.regression import Cause
from analysis.window import Culprit, RunQueueReading
from tests.analysis import synth


def test_the_wait_the_agent_caused_is_not_the_targets_run_queue_feature():
    w = synth.window(3)
    w.runqueue = RunQueueReading(total_seconds=1.0, charged_seconds=1.0, culprits=[
        Culprit(pid=50, comm="hog", seconds=0.4), Culprit(pid=60, comm="py-spy", seconds=0.5, kind="agent"),
        Culprit(pid=0, comm="swapper/0", seconds=0.1, kind="idle")])
    assert extract(w).runqueue_per_second == pytest.approx(0.5 / w.duration)


def test_a_window_recorded_before_culprits_keeps_its_whole_wait():
    w = synth.window(3)
    w.runqueue = RunQueueReading(total_seconds=1.0)
    assert w.runqueue.charged_seconds is None
    assert extract(w).runqueue_per_second == pytest.approx(1.0 / w.duration)


def test_a_family_merges_culprits_by_pid_and_a_member_is_its_own_work():
    api = [Culprit(pid=9, comm="hog", seconds=1.0), Culprit(pid=20, comm="engine", seconds=0.5)]
    engine = [Culprit(pid=9, comm="hog", seconds=2.0), Culprit(pid=11, comm="cron", seconds=0.1)]
    merged = culprits.merge([api, engine], members={10, 20}, top=1)
    assert [(c.pid, c.seconds, c.kind) for c in merged] == [(9, 3.0, ""), (20, 0.5, "self")]
    assert api[0].seconds == 1.0  # the members' own readings are left as they were


def test_a_culprit_is_named_with_its_command_user_and_share_of_the_wait():
    c = Culprit(pid=9911, comm="python3", seconds=3.55, cmdline="python3 hog.py", user="bob")
    text = culprits.describe(c, wait_seconds=5.0, duration=5.0)
    assert text == ("pid 9911 `python3 hog.py` (user bob) ran during 71 % of the server's run-queue wait "
                    "(0.71 s of waiting per second)")
    gone = Culprit(pid=7, comm="job", seconds=1.0, reason="exited before the window's end")
    assert "`job` [exited before the window's end]" in culprits.describe(gone, 2.0, 5.0)


def _hogged(window, hog_share: float = 0.7):
    """The window with its run-queue wait charged 70 % to a hog, the rest to a cron job and to py-spy (the agent)."""
    wait = window.runqueue.total_seconds
    window.runqueue.culprits = [
        Culprit(pid=9911, comm="python3", seconds=hog_share * wait, cmdline="python3 hog.py", user="bob"),
        Culprit(pid=77, comm="cron", seconds=(0.9 - hog_share) * wait, user="root"),
        Culprit(pid=5, comm="py-spy", seconds=0.1 * wait, kind="agent")]
    window.runqueue.charged_seconds = wait
    return window


def test_a_cpu_contention_regression_names_the_neighbour_in_its_evidence_and_json():
    from analysis.detector import LatencyDetector
    from analysis.regression import regression_from_dict, regression_to_dict
    from tests.analysis.test_detector import FAULTS, armed

    det = armed()
    verdicts = [det.update(_hogged(w)) for w in synth.windows(60, 10, FAULTS["cpu_contention"])]
    found = [v.regression for v in verdicts if v.regression is not None]
    assert found, "the hog was not detected"
    cause = found[-1].causes[0]
    assert cause.label == "cpu_contention"
    assert [n.pid for n in cause.neighbours] == [9911, 77]  # never the agent's own py-spy
    hog = cause.neighbours[0]
    # Its share of the wait less the agent's own part: 0.7 / 0.9.
    assert hog.share == pytest.approx(0.7 / 0.9, abs=0.01) and hog.user == "bob"
    assert "pid 9911 `python3 hog.py` (user bob) ran during 78 % of the server's run-queue wait" in cause.evidence
    back = regression_from_dict(json.loads(json.dumps(regression_to_dict(found[-1]))))
    assert back.causes[0].neighbours == cause.neighbours
    restored = LatencyDetector()
    restored.set_state(json.loads(json.dumps(det.get_state())))  # the saved state keeps them too
    assert restored.get_state() == det.get_state()


def test_causes_other_than_cpu_contention_and_windows_without_culprits_are_left_as_they_are():
    from analysis.regression import Cause

    gc = Cause("gc", 1.0, "GC pause")
    assert culprits.named(gc, [{"culprits": {"wait": 1.0, "duration": 5.0, "top": []}}]) is gc
    cpu = Cause("cpu_contention", 1.0, "run-queue wait")
    assert culprits.named(cpu, [{"runqueue": 1.0}]) is cpu  # an older recording: not measured, nothing named


def _kept(wait: float, top: list[tuple[int, float]]) -> dict:
    return {"culprits": {"wait": wait, "duration": 5.0, "top": [
        {"pid": pid, "comm": f"p{pid}", "cmdline": f"p{pid}", "user": "u", "seconds": s} for pid, s in top]}}


def test_an_episodes_culprits_are_pooled_over_all_its_windows_and_name_who_held_the_cpu_throughout():
    # Four spinners hold 0.6 s each in every window; a tenant bursts 2.1 s in the last one. From the last window the
    # tenant leads; pooled over the episode, each spinner does.
    spinners = [(101, 0.6), (102, 0.6), (103, 0.6), (104, 0.6)]
    windows = [_kept(2.4, spinners) for _ in range(5)] + [_kept(4.5, [*spinners, (770, 2.1)])]
    acc = None
    for w in windows:
        acc = culprits.pooled([w], acc)
    assert acc == culprits.pooled(windows)
    assert acc["wait"] == pytest.approx(16.5) and acc["duration"] == pytest.approx(30.0)
    cause = Cause("cpu_contention", 5.0, "run-queue wait x4")
    assert culprits.named(cause, windows[-1:]).neighbours[0].pid == 770
    pooled = culprits.named(cause, [{"culprits": acc}])
    assert pooled.neighbours[0].pid in {101, 102, 103, 104}
    assert pooled.neighbours[0].seconds == pytest.approx(3.6) and pooled.neighbours[-1].pid == 770
    assert json.loads(json.dumps(acc)) == acc  # it travels in the detector's saved state


def test_pooled_culprits_are_bounded_and_absent_when_nothing_was_measured():
    assert culprits.pooled([{}, {"culprits": None}]) is None
    assert culprits.pooled([], None) is None
    many = [_kept(1.0, [(pid, 0.01 * (pid + 1))]) for pid in range(200)]
    acc = culprits.pooled(many)
    assert len(acc["top"]) == culprits.POOLED and acc["top"][0]["pid"] == 199
    before = culprits.pooled(many[:1])
    culprits.pooled(many[1:], before)
    assert len(before["top"]) == 1  # what it is added to is left as it was
