"""The `memory` cause: the server's cgroup stalled on memory (PSI) and its pages read back from disk."""

from __future__ import annotations

from analysis.detector import LatencyDetector
from analysis.features import extract
from analysis.window import PressureReading, Window
from tests.analysis import synth
from tests.analysis.synth import Load


def _with_pressure(w: Window, memory_some: float, faults_per_second: float, io_some: float = 0.002) -> Window:
    d = w.duration
    psi = {"cpu": {"some": 0.05 * d, "full": 0.0}, "memory": {"some": memory_some * d, "full": memory_some * d / 2},
           "io": {"some": io_some * d, "full": io_some * d / 2}}
    w.pressure = PressureReading(host=psi, cgroup=psi, cgroup_path="/srv", major_faults=int(faults_per_second * d),
                                 reclaimed_pages=0)
    return w


def test_reclaim_of_the_servers_pages_is_named_memory():
    det = LatencyDetector()
    for w in synth.windows(0, 60):
        det.update(_with_pressure(w, memory_some=0.001, faults_per_second=0.5))
    faulty = [_with_pressure(w, memory_some=0.35, faults_per_second=400) for w in
              synth.windows(60, 10, Load(slowdown=2.0))]
    opened = [v.regression for v in map(det.update, faulty) if v.regression is not None]
    assert opened, "the stall was not detected"
    top = opened[-1].causes[0]
    assert top.label == "memory", opened[-1].causes
    assert "memory stall" in top.evidence or "major page faults" in top.evidence


def test_a_window_without_pressure_leaves_memory_unmeasured_not_zero():
    from analysis.cause_signals import read_all

    values = read_all(extract(synth.window(3)))
    assert values["memory_pressure"] is None and values["major_faults"] is None and values["io_pressure"] is None


def test_the_memory_cause_names_who_grew_and_keeps_them_through_json_and_the_saved_state():
    import json

    from analysis.regression import regression_from_dict, regression_to_dict
    from analysis.window import MemoryGrower

    det = LatencyDetector()
    for w in synth.windows(0, 60):
        det.update(_with_pressure(w, memory_some=0.001, faults_per_second=0.5))
    faulty = []
    for i, w in enumerate(synth.windows(60, 10, Load(slowdown=2.0))):
        w = _with_pressure(w, memory_some=0.35, faults_per_second=400)
        w.pressure.growers = [
            MemoryGrower(pid=9911, comm="python3", grew_bytes=(2 + i) << 30, rss_bytes=(3 + i) << 30, seconds=60.0,
                         cmdline="python3 alloc.py --token ***", user="bob"),
            MemoryGrower(pid=w.pid, comm="srv", grew_bytes=40 << 20, rss_bytes=1 << 30, seconds=60.0, member=True)]
        faulty.append(w)
    reg = [v.regression for v in map(det.update, faulty) if v.regression is not None][-1]
    top = reg.causes[0]
    assert top.label == "memory"
    assert [(g.pid, g.member) for g in top.growers] == [(9911, False), (faulty[0].pid, True)]
    assert top.growers[0].grew_bytes == 11 << 30  # its largest reading over the episode's windows
    assert "pid 9911 `python3 alloc.py --token ***` (user bob) grew by 11264 MiB in 60 s" in top.evidence
    assert "the server's own pid" in top.evidence
    back = regression_from_dict(json.loads(json.dumps(regression_to_dict(reg))))
    assert back.causes[0].growers == top.growers
    restored = LatencyDetector()
    restored.set_state(json.loads(json.dumps(det.get_state())))
    assert restored.get_state() == det.get_state()


def test_other_causes_and_windows_that_read_no_growers_are_left_as_they_are():
    from analysis import memory_growers
    from analysis.regression import Cause

    gc = Cause("gc", 3.0, "GC pause x4")
    assert memory_growers.named(gc, [{"growers": [{"pid": 1, "comm": "a", "grew_bytes": 1, "seconds": 1.0,
                                                   "member": False, "cmdline": None, "user": None}]}]) == gc
    memory = Cause("memory", 3.0, "memory stall x9")
    assert memory_growers.named(memory, [{}, {"growers": []}]) == memory
