"""The documented reason the outside hog is missed on a shared host (docs/detector.md, "Sensitivity floor"): no
joint bar on latency shift and run-queue z finds it in both shared-host recordings within the false-alarm bound.
If a detector change or a new recording moves these figures, the docs are stale and this fails."""

import json
import subprocess
import sys
from pathlib import Path

from analysis.detector import LatencyDetector
from tests.scenarios.hog_bar import Block, alarms

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def test_adjacent_caught_blocks_are_one_alarm_and_a_gap_or_another_run_starts_another():
    b = [Block("normal", "a", i, 1.0, 3.0) for i in (3, 4, 5, 9)] + [Block("normal", "b", 10, 1.0, 3.0)]
    assert alarms(b) == 3 and alarms([]) == 0


def test_no_joint_bar_finds_the_outside_hog_on_both_shared_hosts_within_one_false_alarm_an_hour():
    proc = subprocess.run([sys.executable, "-m", "tests.scenarios.hog_bar", str(HERE / "recorded"),
                           str(HERE / "recorded-neighbours"), "--json"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=True)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    det = LatencyDetector()
    # The run queue never reaches the persistent gate's sigmas. Beside the neighbours (`outside` re-recorded
    # 2026-12-04) the latency shift passed the sustained test's bar, but the run queue the neighbours had already
    # spread stayed far below its own.
    assert all(h["runq_z"] < det.sustained_min_z for h in result["hog_highest"].values()), result
    assert result["hog_highest"]["recorded-neighbours"]["shift"] >= det.sustained_shift, result
    assert result["hog_highest"]["recorded-neighbours"]["runq_z"] < 1.0, result
    # Together, the best bar that finds it in both also opens on normal traffic more than the issue allows.
    assert result["normal_blocks"] > 1000 and result["alarms_per_hour"] > 1.0, result
