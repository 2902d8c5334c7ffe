"""Outside disk contention: a `blocked` cause whose I/O stall moved names the processes that wrote most while it
stalled (analysis.disk_writers), on the page (evidence), in the alert, the regression JSON and the eval's culprit."""

from __future__ import annotations

import json

from analysis import disk_writers
from analysis.detector import LatencyDetector
from analysis.regression import Cause, Writer, regression_from_dict, regression_to_dict
from analysis.window import DiskWriter, PressureReading, Window
from tests.analysis import synth
from tests.analysis.synth import Load

MiB = 1 << 20


def _with_io(w: Window, io_some: float, writers: list[DiskWriter] | None = None) -> Window:
    d = w.duration
    psi = {"cpu": {"some": 0.05 * d, "full": 0.0}, "memory": {"some": 0.001 * d, "full": 0.0},
           "io": {"some": io_some * d, "full": io_some * d / 2}}
    w.pressure = PressureReading(host=psi, cgroup=psi, cgroup_path="/srv", major_faults=0, reclaimed_pages=0,
                                 writers=writers)
    return w


def _disk_episode(io_some: float = 0.4, baseline_writers: bool = True):
    det = LatencyDetector()
    for w in synth.windows(0, 60):
        # The server's own small writes are there all along, as in the disk scenario (its `io` switch).
        own = [DiskWriter(pid=w.pid, comm="srv", written_bytes=2 * MiB, seconds=w.duration, member=True)]
        det.update(_with_io(w, 0.01, own if baseline_writers else None))
    faulty = []
    for w in synth.windows(60, 10, Load(slowdown=2.0)):
        faulty.append(_with_io(w, io_some, [
            DiskWriter(pid=9911, comm="python3", written_bytes=600 * MiB, seconds=w.duration,
                       cmdline="python3 diskhog.py 90 --token ***", user="bob"),
            DiskWriter(pid=w.pid, comm="srv", written_bytes=2 * MiB, seconds=w.duration, member=True)]))
    return det, faulty, [v.regression for v in map(det.update, faulty) if v.regression is not None]


def test_a_disk_stall_names_the_neighbour_that_wrote_and_keeps_it_through_json_and_the_saved_state():
    det, faulty, opened = _disk_episode()
    assert opened, "the disk stall was not detected"
    reg = opened[-1]
    top = reg.causes[0]
    assert top.label == "blocked", reg.causes
    assert [(w.pid, w.member) for w in top.writers] == [(9911, False), (faulty[0].pid, True)]
    named = [s["writers"]["top"] for s in det.episode_values_ if isinstance(s.get("writers"), dict)]
    windows = sum(1 for top_ in named if any(w["pid"] == 9911 for w in top_))
    assert top.writers[0].written_bytes == 600 * MiB * windows  # summed over the episode's windows
    assert top.writers[0].seconds == faulty[0].duration * windows  # over the windows it wrote in, not all
    assert "pid 9911 `python3 diskhog.py 90 --token ***` (user bob) wrote" in top.evidence
    assert "MiB/s" in top.evidence and "the server's own pid" in top.evidence
    back = regression_from_dict(json.loads(json.dumps(regression_to_dict(reg))))
    assert back.causes[0].writers == top.writers
    restored = LatencyDetector()
    restored.set_state(json.loads(json.dumps(det.get_state())))
    assert restored.get_state() == det.get_state()


def test_the_eval_scores_the_top_writer_and_the_alert_names_it():
    from agent.alerts.payloads import alert_annotations
    from agent.evaluation.detection import _top_neighbour

    _, _, opened = _disk_episode()
    reg = opened[-1]
    assert _top_neighbour(reg) == 9911
    summary = alert_annotations(reg, "http://agent:9090", reg.opened_at + 10)["summary"]
    assert "while pid 9911 (`python3 diskhog.py 90 --token ***`, user bob) wrote" in summary, summary


def test_a_stall_that_did_not_move_the_io_names_nobody():
    blocked = Cause("blocked", 3.0, "off-CPU in sleep x9")
    read = {"seconds": 5.0, "top": [{"pid": 7, "comm": "dd", "written_bytes": 900 * MiB, "member": False,
                                     "cmdline": None, "user": None}]}
    # A stop or a sleep on a host whose disk is as busy as usual: the writers were read, but the I/O stall stayed.
    assert disk_writers.named(blocked, [{"io_pressure": 0.05, "writers": read}] * 4, usual_io=0.04) == blocked
    # Below the floor, even from a quiet baseline.
    assert disk_writers.named(blocked, [{"io_pressure": 0.005, "writers": read}] * 4, usual_io=0.0) == blocked
    # Not measured (no PSI): nothing to judge it by, nobody named.
    assert disk_writers.named(blocked, [{"io_pressure": None, "writers": read}] * 4, usual_io=None) == blocked
    moved = disk_writers.named(blocked, [{"io_pressure": 0.09, "writers": read}] * 4, usual_io=0.04)
    assert [w.pid for w in moved.writers] == [7] and moved.writers[0].written_bytes == 3600 * MiB


def test_a_writer_that_started_within_the_episode_is_said_at_its_own_rate():
    # The live disk take (docs/BENCHMARKS.md, session 20): 3,184 MiB the diskhog wrote in its first 25 s was said
    # "in 45 s, 70.8 MiB/s": the episode's earlier readings of the server alone, and its first reading's 25 s since
    # the scan before (it started 5 s before that reading), counted as its time. It wrote 128 MiB/s.
    own = {"pid": 8, "comm": "srv", "written_bytes": 20 * MiB, "member": True, "cmdline": None, "user": None}
    hog = {"pid": 7, "comm": "dd", "written_bytes": 640 * MiB, "member": False, "cmdline": None, "user": None}
    samples = ([{"io_pressure": 0.05, "writers": {"seconds": 5.0, "top": [{**own, "seconds": 5.0}]}}] * 4
               + [{"io_pressure": 0.05, "writers": {"seconds": 25.0, "top": [{**hog, "seconds": 5.0},
                                                                          {**own, "seconds": 25.0}]}}]
               + [{"io_pressure": 0.05, "writers": {"seconds": 5.0, "top": [{**hog, "seconds": 5.0},
                                                                         {**own, "seconds": 5.0}]}}] * 4)
    moved = disk_writers.named(Cause("blocked", 3.0, "I/O stall x5"), samples, usual_io=0.01)
    assert [(w.pid, w.written_bytes, w.seconds) for w in moved.writers] == [(7, 3200 * MiB, 25.0), (8, 180 * MiB, 65.0)]
    assert "wrote 3200 MiB in 25 s, 128.0 MiB/s" in moved.evidence
    # A state saved before the readings kept their own seconds: each reading's seconds, as before.
    old = [{**s, "writers": {**s["writers"], "top": [{k: v for k, v in w.items() if k != "seconds"}
                                                    for w in s["writers"]["top"]]}} for s in samples]
    back = disk_writers.named(Cause("blocked", 3.0, "I/O stall x5"), old, usual_io=0.01)
    assert [(w.pid, w.seconds) for w in back.writers] == [(7, 45.0), (8, 65.0)]


def test_other_causes_and_windows_that_read_no_writers_are_left_as_they_are():
    read = {"seconds": 5.0, "top": [{"pid": 7, "comm": "dd", "written_bytes": 900 * MiB, "member": False,
                                     "cmdline": None, "user": None}]}
    gc = Cause("gc", 3.0, "GC pause x4")
    assert disk_writers.named(gc, [{"io_pressure": 0.5, "writers": read}], usual_io=0.01) == gc
    blocked = Cause("blocked", 3.0, "I/O stall x9")
    assert disk_writers.named(blocked, [{"io_pressure": 0.5}, {"io_pressure": 0.5, "writers": {"seconds": 5.0,
                                                                                              "top": []}}],
                              usual_io=0.01) == blocked


def test_a_change_does_not_explain_a_stall_a_neighbour_wrote_but_does_one_the_server_wrote():
    from analysis.change_cause import _outside

    w = Writer(pid=7, comm="dd", written_bytes=1, seconds=1.0)
    assert _outside(Cause("blocked", 3.0, "I/O stall", writers=(w,)))
    assert not _outside(Cause("blocked", 3.0, "I/O stall", writers=(Writer(8, "srv", 1, 1.0, member=True),)))
    assert not _outside(Cause("blocked", 3.0, "off-CPU in sleep"))


def test_windows_recorded_before_writers_were_kept_read_as_none():
    w = synth.window(3)
    assert disk_writers.sample(w) is None
    back = Window.from_json(_with_io(synth.window(4), 0.1).to_json())
    assert back.pressure.writers is None
