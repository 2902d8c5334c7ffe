"""`cpu_contention` from direct evidence (LatencyDetector._contention): a small latency shift beside the CPU stall of
the server's cgroup and the one neighbour the kernel charged the server's run-queue wait to. Each gate alone, and the
load-aware rule: a busier host with a hog on it is not a regression unless the server's latency moved."""

from __future__ import annotations

import functools
import json
import random

import pytest

from analysis import culprits
from analysis.detector import LatencyDetector
from analysis.window import Culprit, PressureReading, Window
from tests.analysis import synth
from tests.analysis.synth import Load

HOG = 9911
AGENT = 5
# The small shift the sustained test reads (tests/analysis/test_detector.py SMALL) with no run-queue rise: alone it
# never opens (test_the_same_latency_shift_without_a_persistent_cause_never_opens).
SHIFT = Load(slowdown=1.25)


def shared(w: Window, stall: float, hog: float | None, seed: int = 0, agent: float = 0.0) -> Window:
    """The window on a shared host: the CPU stall of the server's (root) cgroup `stall` s/s give or take 0.05, its
    run-queue wait charged to three short-lived tenants (new pids each window), the load generator, and `hog` of it
    to one process that stays (None: no hog); `agent` more of it to infersight's own py-spy."""
    rng = random.Random(seed * 7919 + int(w.start))
    d = w.duration
    psi = {"cpu": {"some": max(stall + rng.uniform(-0.05, 0.05), 0.0) * d, "full": 0.0},
           "memory": {"some": 0.0, "full": 0.0}, "io": {"some": 0.002 * d, "full": 0.001 * d}}
    w.pressure = PressureReading(host=psi, cgroup=psi, cgroup_path="/", major_faults=0, reclaimed_pages=0)
    wait = w.runqueue.total_seconds
    rest = 1.0 - (hog or 0.0)
    tenants = [Culprit(pid=20000 + int(w.start) * 4 + k, comm="pytest", seconds=rest * rng.uniform(0.05, 0.25) * wait,
                       user="ci") for k in range(3)]
    rows = tenants + [Culprit(pid=300, comm="loadgen", seconds=0.05 * rest * wait, user="bob"),
                      Culprit(pid=4242, comm="srv", seconds=0.2 * rest * wait, kind="self")]
    if hog:
        rows.append(Culprit(pid=HOG, comm="python3", seconds=hog * wait, cmdline="python3 hog.py", user="bob"))
    if agent:
        rows.append(Culprit(pid=AGENT, comm="py-spy", seconds=agent * wait, kind="agent"))
        w.runqueue.total_seconds += agent * wait
    w.runqueue.culprits = sorted(rows, key=lambda c: -c.seconds)
    w.runqueue.charged_seconds = w.runqueue.total_seconds
    return w


@functools.cache
def _armed_state(seed: int) -> str:
    det = LatencyDetector()
    for w in synth.windows(0, 60, seed=seed):
        det.update(shared(w, stall=0.25, hog=None, seed=seed))
    return json.dumps(det.get_state())


def armed(seed: int = 0, **params) -> LatencyDetector:
    """A detector whose baseline saw 60 windows of the shared host: stall 0.2-0.3 s/s, tenants that come and go."""
    det = LatencyDetector(**params)
    det.set_state(json.loads(_armed_state(seed)))
    return det


def run(det: LatencyDetector, load: Load, stall: float, hog: float | None, seed: int = 0, count: int = 12,
        agent: float = 0.0):
    return [det.update(shared(w, stall, hog, seed, agent)) for w in synth.windows(60, count, load, seed=seed)]


def opened(verdicts) -> list:
    return [v.opened for v in verdicts if v.opened is not None]


@pytest.mark.parametrize("seed", range(4))
def test_a_small_shift_beside_a_stalled_cgroup_and_one_leading_neighbour_opens_cpu_contention_naming_it(seed):
    det = armed(seed)
    vs = run(det, SHIFT, stall=0.8, hog=0.4, seed=seed)
    (reg,) = opened(vs)
    assert vs.index(next(v for v in vs if v.opened)) == det.sustained_min_windows - 1
    top = reg.causes[0]
    assert top.label == "cpu_contention" and reg.severity == "warning"
    assert top.neighbours[0].pid == HOG and top.neighbours[0].cmdline == "python3 hog.py"
    assert "CPU stall of the server's cgroup (PSI some)" in top.evidence
    assert f"pid {HOG} `python3`, among its neighbours in" in top.evidence
    assert "pid 9911 `python3 hog.py` (user bob) ran during" in top.evidence


@pytest.mark.parametrize("seed", range(4))
def test_a_busier_host_with_a_hog_on_it_is_no_regression_while_the_servers_latency_did_not_move(seed):
    det = armed(seed)
    assert opened(run(det, Load(), stall=0.8, hog=0.4, seed=seed, count=30)) == []


@pytest.mark.parametrize("seed", range(4))
def test_the_shift_and_the_stall_without_one_neighbour_to_blame_open_nothing(seed):
    # The stall rose and the latency moved, but the wait is spread over tenants that come and go: no one to name.
    assert opened(run(armed(seed), SHIFT, stall=0.8, hog=None, seed=seed, count=20)) == []
    # The load generator stays all along and is charged a little each window: without the lead it would be named.
    (reg,) = opened(run(armed(seed, contention_lead=1.0), SHIFT, stall=0.8, hog=None, seed=seed, count=20))
    assert reg.causes[0].neighbours[0].comm == "loadgen"


@pytest.mark.parametrize("seed", range(4))
def test_the_shift_and_a_leading_neighbour_without_the_stall_open_nothing(seed):
    # A neighbour that leads the server's wait but took no more CPU than the baseline's tenants did: not evidence.
    assert opened(run(armed(seed), SHIFT, stall=0.25, hog=0.4, seed=seed, count=20)) == []


def test_the_agent_itself_is_never_the_neighbour_to_blame():
    # Infersight's own py-spy charged with most of the wait is not a neighbour (culprits.sample leaves it out).
    assert opened(run(armed(), SHIFT, stall=0.8, hog=None, agent=3.0, count=20)) == []


def test_windows_without_pressure_readings_never_open_by_this_rule():
    det = armed()
    vs = []
    for w in synth.windows(60, 20, SHIFT):
        w = shared(w, 0.8, 0.4)
        w.pressure = None  # a kernel without PSI: not measured, not zero
        vs.append(det.update(w))
    assert opened(vs) == []


def test_the_rule_is_its_edges():
    """Each gate at its edge: the stall's ratio to the baseline and the leader's lead over the next neighbour."""
    det = armed()
    onset = det.sustained_min_windows  # it opens on the last of these (the first test)
    (reg,) = opened(run(det, SHIFT, stall=0.8, hog=0.4, count=onset))
    ratio = reg.causes[0].value / det.baseline_.stats()["cpu_pressure"].median
    assert opened(run(armed(contention_stall_ratio=ratio * 0.99), SHIFT, stall=0.8, hog=0.4, count=onset)) != []
    assert opened(run(armed(contention_stall_ratio=ratio * 1.01), SHIFT, stall=0.8, hog=0.4, count=onset)) == []
    samples = [{"culprits": culprits.sample(shared(w, 0.8, 0.4))} for w in synth.windows(60, 6, SHIFT)]
    who = culprits.leader(samples, 5, 1.0)
    lead = who.seconds / who.runner_up
    assert culprits.leader(samples, 5, lead * 0.99).pid == HOG and culprits.leader(samples, 5, lead * 1.01) is None


def test_a_leader_must_persist_across_the_windows():
    samples = [{"culprits": culprits.sample(shared(w, 0.8, 0.4 if i < 4 else None))}
               for i, w in enumerate(synth.windows(60, 6))]
    assert culprits.leader(samples, 4, 2.0).pid == HOG and culprits.leader(samples, 5, 2.0) is None
    assert culprits.leader([{"runqueue": 1.0}] * 6, 5, 2.0) is None  # an older recording: no culprits measured


def test_the_regression_and_the_saved_state_round_trip():
    from analysis.regression import regression_from_dict, regression_to_dict

    det = armed()
    (reg,) = opened(run(det, SHIFT, stall=0.8, hog=0.4))
    back = regression_from_dict(json.loads(json.dumps(regression_to_dict(reg))))
    assert back.causes == reg.causes
    restored = LatencyDetector()
    restored.set_state(json.loads(json.dumps(det.get_state())))
    assert restored.get_state() == det.get_state()


@pytest.mark.parametrize("params", [{"contention_stall_ratio": 0.5}, {"contention_lead": 0.9}])
def test_gates_below_one_are_refused(params):
    with pytest.raises(ValueError, match="contention_stall_ratio and contention_lead"):
        LatencyDetector(**params)


def test_a_burst_that_has_passed_by_the_newest_window_opens_nothing():
    # Five windows of stall and a leading hog, then a calm one: the evidence is in five of six (enough), but the
    # fault is over. Opening now would name a regression that has already passed (a tenants' burst in the shared
    # recording's normal traffic did exactly this before the rule asked for the newest window).
    from analysis.cause_signals import read_all
    from analysis.features import extract

    def values(w: Window) -> dict:
        return {**read_all(extract(w)), "culprits": culprits.sample(w)}

    det = armed()
    hogged = [values(shared(w, 0.8, 0.4)) for w in synth.windows(60, 5, SHIFT)]
    calm = values(shared(synth.window(65, SHIFT), 0.25, None))
    assert det._contention([*hogged, values(shared(synth.window(65, SHIFT), 0.8, 0.4))], 5) is not None
    assert det._contention([*hogged, calm], 5) is None
    gone = values(shared(synth.window(65, SHIFT), 0.8, None))  # the stall stays, the hog is no longer there
    assert det._contention([*hogged, gone], 5) is None


def test_a_stall_that_began_long_before_the_latency_moved_does_not_open():
    # The hog and the stall came 14 windows before the shift, while the latency stayed as usual: the stall did not
    # move it. Without the onset gate the same windows open (and would at every chance shift while the hog stays).
    def feed(det: LatencyDetector) -> list:
        early = [det.update(shared(w, 0.8, 0.4)) for w in synth.windows(60, 14)]
        return early + [det.update(shared(w, 0.8, 0.4)) for w in synth.windows(74, 12, SHIFT)]

    assert opened(feed(armed())) == []
    assert opened(feed(armed(contention_onset_windows=100))) != []
    with pytest.raises(ValueError, match="contention_onset_windows"):
        LatencyDetector(contention_onset_windows=5)
