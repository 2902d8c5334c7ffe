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
