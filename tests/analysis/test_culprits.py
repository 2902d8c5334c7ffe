"""The run-queue culprits as the detector reads them: the agent's own share out, a family's merged, named in words."""

import pytest

from analysis import culprits
from analysis.features import extract
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
