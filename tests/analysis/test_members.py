"""A family's causes name the member their evidence is in (analysis.members), by growth over the member's own
usual level, not by which member is biggest; the member baseline survives get_state/set_state and a restart."""

from __future__ import annotations

import json

import pytest

from analysis.detector import LatencyDetector
from analysis.window import MemberReading, Window
from tests.analysis import synth
from tests.analysis.synth import Load

API, ENGINE = (100, "infersight-api"), (101, "infersight::EngineCore")
# Of a healthy window's figures, the API's share; the engine has the rest (it is the bigger process).
API_SHARE = 0.25
HEALTHY = synth.window(0, Load(), seed=1)


def _split(w: Window, hot: tuple[int, str], engine_pid: int = ENGINE[0], api_share: float = API_SHARE) -> Window:
    """`w` as a two-process family: each member has its usual share of a healthy window's figures, and whatever
    `w` has beyond a healthy window goes to `hot`."""
    def parts(now: float, usual: float) -> dict[str, float]:
        extra = max(now - usual, 0.0)
        api, engine = api_share * min(now, usual), (1 - api_share) * min(now, usual)
        return {API[1]: api + (extra if hot[1] == API[1] else 0.0),
                ENGINE[1]: engine + (extra if hot[1] == ENGINE[1] else 0.0)}

    gc = parts(w.gc.pause_seconds, HEALTHY.gc.pause_seconds)
    cpu = parts(w.process.cpu_seconds, HEALTHY.process.cpu_seconds)
    w.members = [MemberReading(pid=pid, role=role, cpu_seconds=cpu[role], gc_pause_seconds=gc[role], gc_collections=1)
                 for pid, role in ((API[0], API[1]), (engine_pid, ENGINE[1]))]
    return w


def _armed(seed: int = 3, api_share: float = API_SHARE) -> LatencyDetector:
    det = LatencyDetector()
    for w in synth.windows(0, 60, seed=seed):
        det.update(_split(w, ENGINE, api_share=api_share))
    return det


@pytest.mark.parametrize("hot", [ENGINE, API])
def test_a_gc_fault_names_the_member_it_is_in(hot):
    det = _armed()
    verdicts = [det.update(_split(w, hot)) for w in synth.windows(60, 10, Load(slowdown=2.0, gc_pause=0.05), seed=3)]
    reg = verdicts[-1].regression
    assert reg is not None and reg.top_cause == "gc", reg
    cause = reg.causes[0]
    assert (cause.pid, cause.process) == hot
    assert f"in pid {hot[0]} ({hot[1]})" in cause.evidence


def test_compute_names_the_member_that_grew_not_the_one_that_is_biggest():
    det = _armed(api_share=0.1)
    fault = Load(slowdown=2.0, cpu_per_token=0.0035, hot_function="attention_without_cache")
    verdicts = [det.update(_split(w, API, api_share=0.1)) for w in synth.windows(60, 10, fault, seed=3)]
    reg = verdicts[-1].regression
    compute = next(c for c in reg.causes if c.label == "compute")
    # The engine still uses more CPU than the API in every window; the API is where it grew.
    last = synth.window(69, fault, seed=3)
    members = {m.role: m.cpu_seconds for m in _split(last, API, api_share=0.1).members}
    assert members[ENGINE[1]] > members[API[1]]
    assert (compute.pid, compute.process) == API, compute


def test_a_member_restarted_under_a_new_pid_keeps_its_baseline_across_a_saved_state():
    det = _armed()
    restored = LatencyDetector()
    restored.set_state(json.loads(json.dumps(det.get_state())))
    assert restored.members_base_.usual == det.members_base_.usual and restored.members_base_.usual
    new_pid = 555
    verdicts = [restored.update(_split(w, ENGINE, engine_pid=new_pid))
                for w in synth.windows(60, 10, Load(slowdown=2.0, gc_pause=0.05), seed=3)]
    cause = verdicts[-1].regression.causes[0]
    assert (cause.pid, cause.process) == (new_pid, ENGINE[1])
    assert "usual" in cause.evidence  # judged against the role's baseline, not as a stranger


def test_a_single_process_target_has_no_member_in_its_causes():
    det = LatencyDetector()
    for w in synth.windows(0, 60, seed=3):
        det.update(w)
    verdicts = [det.update(w) for w in synth.windows(60, 10, Load(slowdown=2.0, gc_pause=0.05), seed=3)]
    cause = verdicts[-1].regression.causes[0]
    assert cause.pid is None and cause.process is None and "in pid" not in cause.evidence


def _workers(w: Window, hot_pid: int, pids=(201, 202, 203, 204)) -> Window:
    """`w` as a pre-fork server: four workers of one role share a healthy window's GC; `hot_pid` gets the rest."""
    usual = HEALTHY.gc.pause_seconds / len(pids)
    extra = max(w.gc.pause_seconds - HEALTHY.gc.pause_seconds, 0.0)
    w.members = [MemberReading(pid=pid, role="gunicorn: worker [app]", cpu_seconds=0.3,
                               gc_pause_seconds=usual + (extra if pid == hot_pid else 0.0), gc_collections=1)
                 for pid in pids]
    return w


def test_workers_sharing_a_role_the_one_with_the_fault_is_named_by_its_pid():
    det = LatencyDetector()
    for w in synth.windows(0, 60, seed=3):
        det.update(_workers(w, hot_pid=0))
    verdicts = [det.update(_workers(w, hot_pid=203))
                for w in synth.windows(60, 10, Load(slowdown=2.0, gc_pause=0.05), seed=3)]
    cause = verdicts[-1].regression.causes[0]
    assert cause.label == "gc" and (cause.pid, cause.process) == (203, "gunicorn: worker [app]"), cause


def test_a_family_of_one_process_names_no_member():
    det = LatencyDetector()

    def one(w: Window) -> Window:
        w.members = [MemberReading(pid=7, role="python", gc_pause_seconds=w.gc.pause_seconds)]
        return w

    for w in synth.windows(0, 60, seed=3):
        det.update(one(w))
    verdicts = [det.update(one(w)) for w in synth.windows(60, 10, Load(slowdown=2.0, gc_pause=0.05), seed=3)]
    cause = verdicts[-1].regression.causes[0]
    assert cause.label == "gc" and cause.pid is None and "in pid" not in cause.evidence


def test_a_familys_threads_waiting_in_their_own_code_are_each_members_own_summed():
    """Members are sampled each at its own rate: the engine's waiting thread over the family's ticks would read as
    half a thread in a family of two."""
    from analysis.family import member_summary
    from analysis.features import extract
    from analysis.window import StackReading

    engine = StackReading(idle={"main;Scheduler.step (engine.py:80)": 5}, rate_hz=1.0, samples=5)
    api = StackReading(idle={"main;serve (api.py:9)": 0}, rate_hz=1.0, samples=5)
    w = synth.window(0, Load(), seed=1)
    w.members = [member_summary(1, "api", {"stacks": api}, {}), member_summary(2, "engine", {"stacks": engine}, {})]
    assert w.members[1].app_wait_threads == 1.0 and w.members[0].app_wait_threads == 0.0
    assert extract(w).app_wait_threads == 1.0


# The engine's usual futex wait per second; the API process's idle HTTP threads hold the rest of the family's (30 s/s
# in the synthetic server), as in the live engine-process suite (33 s/s beside the engine's 1.9).
ENGINE_FUTEX = 1.8


def _futex_split(w: Window, extra_per_s: float) -> Window:
    """`w` as a two-process family whose futex wait is mostly the API's idle threads; the engine has its usual
    ENGINE_FUTEX plus `extra_per_s` (a lock in the engine)."""
    from tests.analysis.synth import FUTEX
    total, dur = w.offcpu.stacks[FUTEX] / 1e6, w.duration
    engine = (ENGINE_FUTEX + extra_per_s) * dur
    w.members = [MemberReading(pid=API[0], role=API[1], cpu_seconds=0.1, offcpu_by_kind={"futex": total - engine}),
                 MemberReading(pid=ENGINE[0], role=ENGINE[1], cpu_seconds=w.process.cpu_seconds - 0.1,
                               offcpu_by_kind={"futex": engine})]
    return w


def _lock_in_the_engine(det: LatencyDetector, seed: int = 3):
    fault = Load(slowdown=2.0, futex_extra=1.0)
    return [det.update(_futex_split(w, 1.0)) for w in synth.windows(60, 10, fault, seed=seed)][-1].regression


def test_a_move_in_one_member_that_the_familys_total_dilutes_is_named_from_that_members_own_signals():
    """A lock in the engine: its futex wait x1.55, the family's total x1.03 (under the ratio gate). The member's own
    signals against its role's healthy windows name `lock` in the engine; the family's totals alone say `unknown`."""
    det = LatencyDetector()
    for w in synth.windows(0, 60, seed=3):
        det.update(_futex_split(w, 0.0))
    reg = _lock_in_the_engine(det)
    assert reg is not None
    cause = reg.causes[0]
    assert cause.label == "lock" and (cause.pid, cause.process) == ENGINE, reg.causes
    assert f"in pid {ENGINE[0]} ({ENGINE[1]})" in cause.evidence and "futex" in cause.evidence


def test_a_members_own_signal_baseline_survives_a_saved_state():
    det = LatencyDetector()
    for w in synth.windows(0, 60, seed=3):
        det.update(_futex_split(w, 0.0))
    restored = LatencyDetector()
    restored.set_state(json.loads(json.dumps(det.get_state())))
    assert restored.members_base_.signal_stats(ENGINE[1]) == det.members_base_.signal_stats(ENGINE[1])
    assert restored.members_base_.signal_stats(ENGINE[1])["futex"] is not None
    assert _lock_in_the_engine(restored).causes[0].label == "lock"


def test_a_healthy_family_opens_nothing_with_members_signals_ranked():
    det = LatencyDetector()
    verdicts = [det.update(_futex_split(w, 0.0)) for w in synth.windows(0, 200, seed=5)]
    assert not [v for v in verdicts if v.opened is not None]


# The API's own run-queue wait in every window, seconds: large and steady, so the family's total dilutes the engine's.
API_RUNQ = 6.0


def _runq_split(w: Window) -> Window:
    """`w` as a two-process family whose run-queue wait is mostly the API's steady API_RUNQ; the engine has the
    window's own wait (a hog's on top when there is one), charged 70 % to a neighbour, the rest to a cron job."""
    from analysis.window import Culprit
    engine = w.runqueue.total_seconds
    w.runqueue.total_seconds = API_RUNQ + engine
    w.runqueue.charged_seconds = w.runqueue.total_seconds
    w.runqueue.culprits = [Culprit(pid=9911, comm="python3", seconds=0.7 * w.runqueue.total_seconds,
                                   cmdline="python3 hog.py", user="bob"),
                           Culprit(pid=77, comm="cron", seconds=0.3 * w.runqueue.total_seconds, user="root")]
    w.members = [MemberReading(pid=API[0], role=API[1], cpu_seconds=0.1, runqueue_seconds=API_RUNQ),
                 MemberReading(pid=ENGINE[0], role=ENGINE[1], cpu_seconds=w.process.cpu_seconds - 0.1,
                               runqueue_seconds=engine)]
    return w


def test_a_cpu_contention_named_from_one_member_still_names_the_neighbours():
    """The hog delays the engine; the family's total wait moves less than the engine's own, so the member's
    cpu_contention replaces the family's. It must still carry the neighbours that held the CPU."""
    det = LatencyDetector()
    for w in synth.windows(0, 60, seed=3):
        det.update(_runq_split(w))
    fault = Load(slowdown=2.0, runq_per_cpu=3.0)
    reg = [det.update(_runq_split(w)) for w in synth.windows(60, 10, fault, seed=3)][-1].regression
    assert reg is not None
    cause = next(c for c in reg.causes if c.label == "cpu_contention")
    assert (cause.pid, cause.process) == ENGINE, reg.causes
    assert [n.pid for n in cause.neighbours] == [9911, 77]
    assert "pid 9911 `python3 hog.py` (user bob)" in cause.evidence
