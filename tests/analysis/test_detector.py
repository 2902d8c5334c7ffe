"""LatencyDetector on synthetic windows: warm-up, every rule at its edge, every label, missing sections, persistence."""

import functools
import json
import re
from collections import deque
from dataclasses import replace

import pytest

from analysis.cause_signals import read_all
from analysis.detector import LatencyDetector, Verdict
from analysis.features import extract
from analysis.window import DeliveryReading
from tests.analysis import synth
from tests.analysis.synth import Load

WARM = 24
FAULTS = {
    "gc": Load(slowdown=2.0, gc_pause=0.05),
    "lock": Load(slowdown=2.0, lock_wait_threads=0.6),
    "blocked": Load(slowdown=2.0, fsync=0.4),
    "syscalls": Load(slowdown=2.0, syscalls_per_request=50000),
    "network": Load(slowdown=2.0, retransmits=50),
    "cpu_contention": Load(slowdown=2.0, runq_per_cpu=3.0),
    "compute": Load(slowdown=2.0, cpu_per_token=0.006, hot_function="attention_without_cache"),
}


def feed(det: LatencyDetector, windows) -> list[Verdict]:
    return [det.update(w) for w in windows]


@functools.cache
def _armed_state(seed: int, count: int) -> str:
    det = LatencyDetector()
    feed(det, synth.windows(0, count, seed=seed))
    return json.dumps(det.get_state())


def armed(seed: int = 0, count: int = 60, **params) -> LatencyDetector:
    """A detector that has seen `count` healthy windows (built once per seed, then restored: it is the slow part)."""
    det = LatencyDetector(**params)
    det.set_state(json.loads(_armed_state(seed, count)))
    return det


def opened(verdicts: list[Verdict]) -> list[int]:
    return [i for i, v in enumerate(verdicts) if v.opened is not None]


def test_warm_up_counts_windows_with_requests_and_arms_after_warmup_windows():
    det = LatencyDetector(warmup_windows=WARM)
    idle = [synth.window(i, Load(rate=0.0)) for i in range(5)]  # no request finished: not a baseline window
    vs = feed(det, idle + synth.windows(5, WARM))
    assert all(v.state == "warmup" and v.score is None and v.expected == {} for v in vs)
    after = det.update(synth.window(5 + WARM))
    assert after.state == "healthy" and after.score is not None and set(after.expected) == {"p50", "p99"}
    # A healthy window joins the baseline only once sustained_windows later windows were healthy too.
    assert len(det.baseline_) == WARM and len(det.pending_) == 1
    feed(det, synth.windows(6 + WARM, det.sustained_windows))
    assert len(det.baseline_) == WARM + 1


def test_default_warm_up_arms_within_a_few_minutes_at_a_5_s_interval():
    assert LatencyDetector().warmup_windows * 5 <= 180


@pytest.mark.parametrize("seed", range(2))
def test_steady_load_and_benign_load_steps_of_plus_and_minus_half_never_open(seed):
    det = LatencyDetector()
    ws = (synth.windows(0, 100, seed=seed) + synth.windows(100, 40, Load(rate=6.0), seed)
          + synth.windows(140, 40, Load(rate=2.0), seed) + synth.windows(180, 40, Load(tokens=48.0), seed))
    vs = feed(det, ws)
    assert opened(vs) == [] and all(v.state != "regression" for v in vs)


@pytest.mark.parametrize("label", sorted(FAULTS))
def test_every_label_is_found_and_ranked_first(label):
    det = armed(seed=3)
    vs = feed(det, synth.windows(60, 12, FAULTS[label], seed=3))
    first = opened(vs)
    assert len(first) == 1 and first[0] <= 4
    reg = vs[-1].regression
    assert reg is not None and reg.top_cause == label, reg.causes
    assert any(ch.isdigit() for ch in reg.causes[0].evidence)


def test_a_sigstop_reads_as_blocked():
    det = armed(seed=5)
    vs = feed(det, synth.windows(60, 10, Load(slowdown=2.0, stopped=8.0), seed=5))
    assert vs[-1].regression.top_cause == "blocked" and "8" in vs[-1].regression.causes[0].evidence


def test_k_of_m_debouncing_opens_on_the_kth_anomalous_window_and_opened_at_is_its_end():
    bad = Load(slowdown=4.0, gc_pause=0.05)
    for k, m in ((2, 3), (3, 3), (1, 1)):
        det = armed(k=k, m=m)
        vs = feed(det, synth.windows(60, 5, bad))
        assert opened(vs) == [k - 1]
        assert all(v.state == "healthy" for v in vs[: k - 1])
        reg = vs[k - 1].opened
        end = synth.window(60 + k - 1).end
        assert reg.opened_at == end and reg.id == f"t-{int(end)}" and reg.is_open


def test_k_of_m_needs_k_anomalous_within_the_last_m_scored_windows():
    bad, ok = Load(slowdown=4.0, gc_pause=0.05), Load()
    det = armed(k=2, m=3)
    seq = [synth.window(60, bad), synth.window(61, ok), synth.window(62, bad)]  # 2 of 3: opens on the third
    assert opened(feed(det, seq)) == [2]
    det = armed(k=2, m=3)
    seq = [synth.window(60, bad), synth.window(61, ok), synth.window(62, ok), synth.window(63, bad)]  # 1 of 3
    assert opened(feed(det, seq)) == []


def test_close_after_close_windows_calm_windows_and_a_noisy_one_resets_the_count():
    det = armed(close_windows=3)
    feed(det, synth.windows(60, 4, Load(slowdown=4.0, gc_pause=0.05)))
    calm = feed(det, synth.windows(64, 2))
    assert all(v.state == "regression" and v.closed is None for v in calm)
    again = det.update(synth.window(66, Load(slowdown=4.0, gc_pause=0.05)))
    assert again.state == "regression"
    vs = feed(det, synth.windows(67, 3))
    assert [v.closed is not None for v in vs] == [False, False, True]
    closed = vs[-1].closed
    assert closed.closed_at == synth.window(69).end and not closed.is_open and vs[-1].regression is None


def test_hysteresis_a_window_between_close_and_open_score_keeps_the_episode_open():
    # close_score far below any normal score: no window is calm enough, so normal traffic never closes it.
    det = armed(close_score=-50.0)
    feed(det, synth.windows(60, 4, Load(slowdown=4.0, gc_pause=0.05)))
    vs = feed(det, synth.windows(64, 20))
    assert all(v.state == "regression" and v.score < det.open_score for v in vs)


def test_baseline_is_frozen_while_open_and_learns_while_healthy():
    det = armed()
    size = len(det.baseline_)
    feed(det, synth.windows(60, 6, Load(slowdown=4.0, gc_pause=0.05)))
    assert len(det.baseline_) == size
    feed(det, synth.windows(66, 20))
    assert len(det.baseline_) > size


def test_baseline_refits_every_refit_every_healthy_windows():
    det = armed(refit_every=5)
    det.since_refit_ = 0
    model = det.model_
    feed(det, synth.windows(60, 4))
    assert det.model_ is model and det.since_refit_ == 4
    feed(det, synth.windows(64, 1))
    assert det.model_ is not model and det.since_refit_ == 0


@pytest.mark.parametrize(("slowdown", "severity"), [(1.8, "warning"), (4.0, "critical")])
def test_severity_by_latency_ratio(slowdown, severity):
    det = armed()
    vs = feed(det, synth.windows(60, 4, Load(slowdown=slowdown, gc_pause=0.05)))
    assert vs[opened(vs)[0]].opened.severity == severity


def test_critical_ratio_and_critical_score_edges():
    det = armed(critical_ratio=1.01, critical_score=1000.0)
    vs = feed(det, synth.windows(60, 4, Load(slowdown=1.8, gc_pause=0.05)))
    assert vs[opened(vs)[0]].opened.severity == "critical"
    det = armed(critical_ratio=1000.0, critical_score=4.0)
    vs = feed(det, synth.windows(60, 4, Load(slowdown=1.8, gc_pause=0.05)))
    assert vs[opened(vs)[0]].opened.severity == "critical"


def test_an_unexplained_slowdown_opens_only_past_the_unexplained_score_and_reads_unknown():
    mild = Load(slowdown=1.8)  # scores ~4-6: past open_score, short of the unexplained score
    assert opened(feed(armed(), synth.windows(60, 8, mild))) == []
    vs = feed(armed(unexplained_open_score=4.0), synth.windows(60, 8, mild))
    assert opened(vs) and vs[-1].regression.top_cause == "unknown"
    vs = feed(armed(), synth.windows(60, 8, Load(slowdown=4.0)))
    assert opened(vs) and vs[-1].regression.top_cause == "unknown"


def test_missing_sections_the_detector_keeps_working_and_says_what_it_could_not_measure():
    blind = ("gc", "offcpu", "stacks")
    det = LatencyDetector()
    feed(det, [synth.strip(w, *blind) for w in synth.windows(0, 60)])
    vs = feed(det, [synth.strip(w, *blind) for w in synth.windows(60, 8, Load(slowdown=4.0, gc_pause=0.05))])
    reg = vs[-1].regression
    assert reg is not None and reg.top_cause == "unknown"
    assert "gc: gc probe failed (test)" in reg.causes[0].evidence
    assert "offcpu: offcpu probe failed (test)" in reg.causes[0].evidence
    # The same run with py-spy alone missing still finds a GC regression.
    det = LatencyDetector()
    feed(det, [synth.strip(w, "stacks") for w in synth.windows(0, 60)])
    vs = feed(det, [synth.strip(w, "stacks") for w in synth.windows(60, 8, Load(slowdown=4.0, gc_pause=0.05))])
    assert vs[-1].regression.top_cause == "gc" and vs[-1].regression.functions == []


def test_no_latency_source_no_score_no_episode():
    det = armed()
    vs = feed(det, [synth.strip(w, "latency") for w in synth.windows(60, 10, Load(gc_pause=0.05))])
    assert all(v.score is None and v.state == "healthy" for v in vs)


def test_a_stall_with_retransmits_opens_a_critical_network_regression_and_silence_alone_does_not():
    det = armed()
    vs = feed(det, synth.windows(60, 4, Load(rate=0.0, retransmits=70)))
    assert opened(vs) == [1]
    reg = vs[1].opened
    assert reg.severity == "critical" and reg.top_cause == "network" and vs[1].score is None
    quiet = armed()
    assert opened(feed(quiet, synth.windows(60, 6, Load(rate=0.0)))) == []


def test_a_server_that_answers_nothing_while_its_threads_are_stopped_opens_a_critical_blocked_regression():
    # SIGSTOP for 30 s: no scrape is answered, so no latency and no request count; the off-CPU probe sees every
    # thread stopped (35 s/s), cut at each window's boundary.
    det = armed()
    vs = feed(det, [synth.unanswered(w) for w in synth.windows(60, 4, Load(stopped=35.0, stuck_threads=35))])
    assert opened(vs) == [1]
    reg = vs[1].opened
    assert reg.severity == "critical" and reg.top_cause == "blocked" and vs[1].score is None
    # Where the off-CPU probe cannot run (no root, no BPF), the threads' state from /proc names it alone.
    no_bpf = [synth.unanswered(synth.strip(w, "offcpu")) for w in synth.windows(60, 4, Load(stuck_threads=35))]
    vs = feed(armed(), no_bpf)
    assert opened(vs) == [1] and vs[1].opened.top_cause == "blocked"
    assert "threads stopped or in disk sleep" in vs[1].opened.causes[0].evidence
    # An endpoint that does not answer, with nothing else moving, is no regression: scrapes fail for their own
    # reasons (a restart, a network hiccup on the agent's side).
    assert opened(feed(armed(), [synth.unanswered(w) for w in synth.windows(60, 6)])) == []
    # Latency unread for another reason (the source failed, a wrong answer) is no stall, whatever else moved.
    stripped = [synth.strip(w, "latency") for w in synth.windows(60, 6, Load(stopped=35.0, stuck_threads=35))]
    assert opened(feed(armed(), stripped)) == []


def test_a_port_nothing_reaches_opens_a_critical_network_regression_with_no_retransmit():
    # A partition: every SYN to the server's port dropped. With no connection open the server retransmits
    # nothing and is simply idle; the agent's own scrape, refused or timed out at connect, is the witness.
    det = armed()
    idle = Load(rate=0.0)
    vs = feed(det, [synth.unanswered(w, connect=True) for w in synth.windows(60, 4, idle)])
    assert opened(vs) == [1]
    reg = vs[1].opened
    assert reg.severity == "critical" and reg.top_cause == "network" and vs[1].score is None
    assert reg.causes[0].evidence.startswith("share of scrapes that could not connect to the server's port 1 vs 0 "
                                             "baseline (x20 against the 0.05 floor"), reg.causes[0].evidence
    # Connected, then no reply (a stopped server's backlog), with nothing else moving: no cause, nothing opens.
    assert opened(feed(armed(), [synth.unanswered(w) for w in synth.windows(60, 6, idle)])) == []


def test_a_few_threads_caught_stopped_with_latency_as_usual_is_no_regression():
    # The state is one instant per window: a thread caught in a brief disk wait must not open anything alone.
    det = armed()
    assert opened(feed(det, synth.windows(60, 12, Load(stuck_threads=1)))) == []


def test_a_stop_caught_at_a_windows_end_explains_the_next_windows_latency():
    # Stops that come and go (1 s every 4 s), where the off-CPU probe cannot run: the threads' state is read at each
    # window's end and catches a stop now and then; the requests a stop held up finish, and count their latency, in
    # the next window, whose own reading caught nothing. Latency x1.8 alone (score 5-6) is no regression unexplained.
    caught = [synth.strip(w, "offcpu") for w in synth.windows(60, 1, Load(slowdown=1.2, stuck_threads=35))]
    after = [synth.strip(w, "offcpu") for w in synth.windows(61, 1, Load(slowdown=1.8))]
    vs = feed(armed(), caught + after)
    assert opened(vs) == [1] and vs[1].opened.top_cause == "blocked"
    assert 4.0 <= vs[1].score < 8.0
    # The same latency after a window that caught nothing stays healthy: it is the stop that explains it.
    missed = [synth.strip(w, "offcpu") for w in synth.windows(60, 1, Load(slowdown=1.2))]
    vs = feed(armed(), missed + after)
    assert opened(vs) == [] and vs[1].state == "healthy" and vs[1].score >= 4.0
    # The reading explains one window after it, not the one after that.
    vs = feed(armed(), caught + [synth.strip(w, "offcpu") for w in synth.windows(61, 2, Load(slowdown=1.0))]
              + [synth.strip(w, "offcpu") for w in synth.windows(63, 1, Load(slowdown=1.8))])
    assert opened(vs) == []


def test_stall_fraction_edge():
    # Baseline: ~20 requests per window. A window with 3 requests is a stall at fraction 0.2, not at 0.1.
    w = synth.window(60, Load(rate=0.6, retransmits=70))
    assert w.latency.requests < 4
    assert armed(stall_fraction=0.2, min_requests=5)._stalled(extract(w))
    assert not armed(stall_fraction=0.1, min_requests=5)._stalled(extract(w))


def test_functions_that_grew_and_the_baseline_interval_are_on_the_regression():
    det = armed()
    vs = feed(det, synth.windows(60, 6, FAULTS["compute"]))
    reg = vs[-1].regression
    assert reg.functions and reg.functions[0].function == "attention_without_cache (app/hot.py)"
    assert reg.functions[0].delta > 0.3
    # The six healthy windows before the opening were still waiting to be learned: the opening drops them (they
    # may be the onset of a slow regression), so the baseline ends where they begin.
    assert reg.baseline_start == synth.window(0).start
    assert reg.baseline_end == synth.window(59 - det.sustained_windows).end


def test_causes_are_reranked_while_the_episode_is_open():
    # A second cause joins the first: the same regression, now led by the stronger one, the first still named.
    det = armed()
    feed(det, synth.windows(60, 5, FAULTS["gc"]))
    both = Load(slowdown=2.5, gc_pause=0.05, syscalls_per_request=500000)
    vs = feed(det, synth.windows(65, 8, both))
    assert opened(vs) == [] and [v.closed for v in vs if v.closed] == []
    assert len({v.regression.id for v in vs}) == 1
    assert vs[-1].regression.top_cause == "syscalls" and "gc" in {c.label for c in vs[-1].regression.causes}


def _gone_windows(det: LatencyDetector, windows, first: str) -> list[int]:
    """Indexes of the windows whose re-ranked causes no longer name `first` and name another cause first."""
    gone = []
    for i, v in enumerate(feed(det, windows)):
        labels = [c.label for c in v.regression.causes] if v.regression else []
        if labels and labels[0] not in ("unknown", first) and first not in labels:
            gone.append(i)
    return gone


@pytest.mark.parametrize("n", [1, 2, 3])
def test_a_fault_that_gives_way_to_another_is_two_regressions(n):
    # gc stops and the syscalls start with no calm window between them: the gc regression closes and a syscalls one
    # opens, after cause_change_windows windows in a row whose causes no longer name gc.
    before, after = synth.windows(60, 5, FAULTS["gc"]), synth.windows(65, 10, FAULTS["syscalls"])
    never = armed(cause_change_windows=10**6)
    feed(never, before)
    gone = _gone_windows(never, after, "gc")
    assert gone[: n] == list(range(gone[0], gone[0] + n)) and gone[0] <= 3
    det = armed(cause_change_windows=n)
    first = feed(det, before)[-1].regression
    vs = feed(det, after)
    splits = [i for i, v in enumerate(vs) if v.closed is not None]
    assert splits == [gone[0] + n - 1]
    v = vs[splits[0]]
    assert v.closed.id == first.id and v.closed.top_cause == "gc" and v.closed.closed_at == after[splits[0]].start
    assert v.opened is v.regression and v.opened.id != first.id and v.opened.top_cause == "syscalls"
    assert v.state == "regression" and vs[-1].regression.id == v.opened.id


def test_a_regression_closed_by_the_next_one_keeps_the_causes_its_own_cause_led():
    # gc, then syscalls join and lead while gc is still named, then gc is gone: the gc regression closes as gc (the
    # ranking its cause last led), not with the ranking the syscalls already led.
    det = armed(cause_change_windows=2)
    first = feed(det, synth.windows(60, 5, FAULTS["gc"]))[-1].regression
    both = Load(slowdown=2.5, gc_pause=0.05, syscalls_per_request=500000)
    joined = feed(det, synth.windows(65, 4, both))
    assert joined[-1].regression.top_cause == "syscalls" and "gc" in {c.label for c in joined[-1].regression.causes}
    vs = feed(det, synth.windows(69, 10, FAULTS["syscalls"]))
    split = [v for v in vs if v.closed]
    assert len(split) == 1 and split[0].closed.id == first.id
    assert split[0].closed.top_cause == "gc" and split[0].opened.top_cause == "syscalls"


@pytest.mark.parametrize("n", [1, 2])
def test_the_next_regression_is_told_by_its_own_windows_not_the_fault_before(n):
    # A code change (hot function) gives way to a syscall storm: the syscalls regression's causes and functions come
    # from the windows that showed it, not from the code change's CPU per token and hot function (the k-of-m run
    # still holds code-change windows when the split comes after one window).
    det = armed(cause_change_windows=n)
    first = feed(det, synth.windows(60, 5, FAULTS["compute"]))[-1].regression
    assert first.top_cause == "compute" and first.functions[0].function.startswith("attention_without_cache")
    vs = feed(det, synth.windows(65, 10, FAULTS["syscalls"]))
    split = next(v for v in vs if v.closed)
    assert split.closed.id == first.id and split.closed.top_cause == "compute"
    assert split.closed.functions[0].function.startswith("attention_without_cache")
    new = split.opened
    assert new.top_cause == "syscalls" and "compute" not in {c.label for c in new.causes}
    assert not any(fn.function.startswith("attention_without_cache") for fn in new.functions)


def test_a_cause_that_changes_every_window_does_not_split_the_regression():
    # gc gone, and the windows after it name syscalls and network by turns: no one cause took over, so the
    # regression stays one (re-ranked) instead of closing on whichever cause the second window named.
    det = armed(cause_change_windows=2)
    first = feed(det, synth.windows(60, 5, FAULTS["gc"]))[-1].regression
    turns = [synth.window(65 + i, FAULTS["syscalls"] if i % 2 == 0 else FAULTS["network"]) for i in range(10)]
    vs = feed(det, turns)
    tops = [v.regression.top_cause for v in vs]
    assert {"syscalls", "network"} <= set(tops) and "gc" not in tops[-6:]
    assert [v for v in vs if v.closed] == [] and {v.regression.id for v in vs} == {first.id}


def test_an_episode_that_finds_its_cause_late_is_the_same_regression():
    # Opened unexplained (latency far off, nothing moved yet), then gc shows: named, not split.
    det = armed()
    vs = feed(det, synth.windows(60, 3, Load(slowdown=4.0)) + synth.windows(63, 6, FAULTS["gc"]))
    assert opened(vs) and [v.closed for v in vs if v.closed] == []
    assert len({v.regression.id for v in vs if v.regression}) == 1 and vs[-1].regression.top_cause == "gc"


def test_a_cause_change_counted_before_a_restart_completes_after_it():
    before, after = synth.windows(60, 5, FAULTS["gc"]), synth.windows(65, 10, FAULTS["syscalls"])
    det = armed(cause_change_windows=3)
    feed(det, before)
    verdicts = []
    for w in after:
        verdicts.append(det.update(w))
        if det.moved_ == 1:
            break
    restored = LatencyDetector(cause_change_windows=3)
    restored.set_state(json.loads(json.dumps(det.get_state())))
    rest = after[len(verdicts):]
    a, b = feed(det, rest), feed(restored, rest)
    assert [(v.closed.id, v.opened.id) for v in a if v.closed] == [(v.closed.id, v.opened.id) for v in b if v.closed]
    assert len([v for v in b if v.closed]) == 1


def test_get_state_set_state_through_json_keeps_the_baseline_no_second_warm_up():
    det = armed(seed=7)
    restored = LatencyDetector()
    restored.set_state(json.loads(json.dumps(det.get_state())))
    later = synth.windows(60, 30, seed=7) + synth.windows(90, 6, FAULTS["lock"], seed=7)
    a, b = feed(det, later), feed(restored, later)
    assert b[0].state == "healthy"
    assert [(v.state, v.score, v.expected) for v in a] == [(v.state, v.score, v.expected) for v in b]


def test_an_open_regression_stays_open_across_a_restart_and_closes_like_the_original():
    det = armed(seed=8)
    feed(det, synth.windows(60, 4, FAULTS["gc"], seed=8))
    assert det.episode_ is not None
    restored = LatencyDetector()
    restored.set_state(json.loads(json.dumps(det.get_state())))
    assert restored.episode_ == det.episode_
    after = synth.windows(64, 8, seed=8)
    a, b = feed(det, after), feed(restored, after)
    assert b[0].state == "regression" and b[0].regression.id == a[0].regression.id
    closes_a = [v.closed.closed_at for v in a if v.closed]
    closes_b = [v.closed.closed_at for v in b if v.closed]
    assert closes_a == closes_b and len(closes_b) == 1


def test_state_of_a_detector_still_warming_up_resumes_its_warm_up():
    det = LatencyDetector(warmup_windows=WARM)
    feed(det, synth.windows(0, 10))
    restored = LatencyDetector(warmup_windows=WARM)
    restored.set_state(json.loads(json.dumps(det.get_state())))
    vs = feed(restored, synth.windows(10, WARM - 10))
    assert vs[-1].state == "warmup" and restored.update(synth.window(WARM)).state == "healthy"


def test_reset_forgets_the_baseline_and_any_open_episode():
    det = armed()
    feed(det, synth.windows(60, 4, FAULTS["gc"]))
    det.reset()
    assert det.episode_ is None and len(det.baseline_) == 0
    assert det.update(synth.window(64)).state == "warmup"


@pytest.mark.parametrize("state", [{}, {"version": 99}, [], "x"])
def test_a_state_of_another_version_or_shape_is_one_clear_error(state):
    with pytest.raises(ValueError, match="version"):
        LatencyDetector().set_state(state)


@pytest.mark.parametrize(("params", "words"), [
    ({"warmup_windows": 2}, "warmup_windows"),
    ({"k": 4, "m": 3}, "k <= m"),
    ({"close_score": 5.0, "open_score": 4.0}, "close_score < open_score"),
    ({"unexplained_open_score": 3.0}, "unexplained_open_score"),
    ({"close_windows": 0}, "close_windows"),
    ({"baseline_windows": 10}, "baseline_windows"),
    ({"sustained_min_windows": 7}, "sustained_min_windows"),
    ({"sustained_min_windows": 0}, "sustained_min_windows"),
    ({"high_quantile": 1.0}, "high_quantile"),
])
def test_bad_parameters_are_one_clear_error(params, words):
    with pytest.raises(ValueError, match=words):
        LatencyDetector(**params)


def test_ids_are_unique_per_target_even_for_two_episodes_in_one_second():
    det = armed()
    end = synth.window(61).end
    det.last_id_ = f"t-{int(end)}"  # an episode already opened in this very second (sub-second windows)
    vs = feed(det, synth.windows(60, 2, Load(slowdown=4.0, gc_pause=0.05)))
    assert vs[1].opened.id == f"t-{end:.3f}" == det.last_id_
    assert LatencyDetector().get_state()["last_id"] is None


def score_of(window, **params) -> float:
    return armed(**params).update(window).score


def test_open_score_edge():
    w = synth.window(60, Load(slowdown=2.0, gc_pause=0.006))  # corroborated: GC moved x6, below the strong bar
    s = score_of(w)
    assert armed(k=1, m=1, open_score=s).update(w).opened is not None
    assert armed(k=1, m=1, open_score=s + 0.01).update(w).opened is None


def test_strong_open_score_edge():
    # GC x50 is a strong move: latency need only be no better than expected, not open_score sigma worse.
    w = synth.window(60, Load(slowdown=1.1, gc_pause=0.05))
    s = score_of(w)
    assert s < 4.0
    assert armed(k=1, m=1, strong_open_score=s).update(w).opened is not None
    assert armed(k=1, m=1, strong_open_score=s + 0.01).update(w).opened is None


def test_strong_cause_score_edge():
    w = synth.window(60, Load(slowdown=1.1, gc_pause=0.05))
    det = armed()
    strength = det._corroboration({**read_all(extract(w)), "jsd": None})
    assert strength > 4.0  # log2(50 ms/s / the 1 ms/s floor)
    assert armed(k=1, m=1, strong_open_score=-5.0, strong_cause_score=strength).update(w).opened is not None
    assert armed(k=1, m=1, strong_open_score=-5.0, strong_cause_score=strength + 0.01).update(w).opened is None


def test_a_strong_move_with_latency_better_than_expected_is_no_regression():
    vs = feed(armed(), synth.windows(60, 6, Load(slowdown=0.6, gc_pause=0.05)))
    assert opened(vs) == []


def test_retransmits_beyond_the_baseline_cost_clients_rto_min_each_and_count_as_latency():
    w = synth.window(60, Load(retransmits=60))  # 12 /s at 4 req/s: 0.6 s per request at the 200 ms RTO min
    f = extract(w)
    det = armed()
    base = det.baseline_.stats()["retransmits"].median
    cost = det._retransmit_cost(f, read_all(f))
    assert cost == pytest.approx((12.0 - base) * 0.2 / f.request_rate)
    assert armed(rto_min_seconds=0.0)._retransmit_cost(f, read_all(f)) == 0.0
    assert score_of(w) > score_of(w, rto_min_seconds=0.0) + 4.0
    # At the baseline's own rate there is no cost: normal retransmits are already in what "normal" means.
    quiet = synth.window(60, Load(retransmits=base * 5))
    assert det._retransmit_cost(extract(quiet), read_all(extract(quiet))) == 0.0


def test_strong_open_score_must_not_exceed_open_score():
    with pytest.raises(ValueError, match="strong_open_score"):
        LatencyDetector(strong_open_score=5.0)


def test_unexplained_open_score_edge():
    w = synth.window(60, Load(slowdown=2.5))  # nothing but latency moved
    s = score_of(w)
    assert armed(k=1, m=1, unexplained_open_score=s).update(w).opened is not None
    assert armed(k=1, m=1, unexplained_open_score=s + 0.01).update(w).opened is None


def test_close_score_edge():
    bad = Load(slowdown=4.0, gc_pause=0.05)
    calm = synth.window(70)
    s = score_of(calm)
    for close_score, closes in ((s + 0.01, True), (s, False)):  # calm means strictly below close_score
        det = armed(close_windows=1, close_score=close_score, open_score=max(4.0, close_score + 1))
        feed(det, synth.windows(60, 3, bad))
        assert (det.update(calm).closed is not None) is closes


def test_min_requests_edge():
    w = synth.window(60)
    n = int(w.latency.requests)
    assert armed(min_requests=n).update(w).score is not None
    assert armed(min_requests=n + 1).update(w).score is None


def test_a_malformed_state_is_one_clear_error_and_leaves_a_fresh_detector():
    state = json.loads(_armed_state(0, 60))
    state["baseline"]["rows"][0] = {"start": 1.0}
    det = LatencyDetector()
    with pytest.raises(ValueError, match="malformed"):
        det.set_state(state)
    assert len(det.baseline_) == 0 and det.update(synth.window(0)).state == "warmup"


def test_state_is_strict_json_without_infinity():
    det = armed()
    feed(det, synth.windows(60, 4, FAULTS["gc"]))
    json.dumps(det.get_state(), allow_nan=False)
    from analysis.baseline import BaselineRow
    from analysis.latency_model import Row
    row = BaselineRow(0.0, 5.0, Row(n=3, rate=0.6, tpr=32, mean=20.0, p50=20.0, p99=20.0,
                                    buckets=((10.0, 1.0), (float("inf"), 2.0))))
    text = json.dumps(row.to_dict(), allow_nan=False)
    assert '"+Inf"' in text and BaselineRow.from_dict(json.loads(text)) == row


def test_baseline_rows_keep_only_the_buckets_that_matter_and_count_the_same():
    from analysis.baseline import trim
    from analysis.latency_model import exceed_count
    full = extract(synth.window(3)).buckets
    short = trim(full)
    assert len(short) < len(full)
    for t in (0.05, 0.1, 0.13, 0.4, 3.0):
        assert exceed_count(short, t) == pytest.approx(exceed_count(full, t))
    assert trim(((0.1, 0.0), (float("inf"), 0.0))) == ()


def test_a_stall_counts_only_with_a_strong_cause_and_strong_cause_score_is_its_edge():
    stall = synth.windows(60, 4, Load(rate=0.0, retransmits=10))  # 2 /s: x10 the 0.2 /s floor, log2 3.3
    strength = armed()._corroboration({**read_all(extract(stall[0])), "jsd": None})
    assert 3.0 < strength < 4.0
    assert opened(feed(armed(), stall)) == []  # a weak move and silence: clients may just have left
    assert opened(feed(armed(strong_cause_score=strength), stall)) == [1]
    assert opened(feed(armed(strong_cause_score=strength + 0.01), stall)) == []


# -- the sustained-shift test: small shifts no single window shows ---------------------------------------------------

SMALL = {"blocked": Load(slowdown=1.25, fsync=0.03), "cpu_contention": Load(slowdown=1.25, runq_per_cpu=0.6)}


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("label", sorted(SMALL))
def test_a_small_sustained_shift_with_a_persistent_cause_opens_after_sustained_min_windows(label, seed):
    det = armed(seed=seed)
    vs = feed(det, synth.windows(60, 12, SMALL[label], seed=seed))
    # No window alone passes the per-window tests: its cause signal moved less than that signal's min_change.
    assert all(not det._attributor().rank(read_all(extract(w)), det.baseline_.stats())[0].label == label
               for w in synth.windows(60, 12, SMALL[label], seed=seed))
    assert opened(vs) == [det.sustained_min_windows - 1]
    reg = vs[det.sustained_min_windows - 1].opened
    assert reg.top_cause == label and reg.severity == "warning"
    assert f"in {det.sustained_min_windows} of {det.sustained_windows} windows" in reg.causes[0].evidence


@pytest.mark.parametrize("seed", range(4))
def test_the_same_latency_shift_without_a_persistent_cause_never_opens(seed):
    det = armed(seed=seed)
    assert opened(feed(det, synth.windows(60, 30, Load(slowdown=1.25), seed=seed))) == []


@pytest.mark.parametrize("seed", range(4))
def test_a_persistent_cause_without_a_latency_shift_never_opens_and_the_baseline_learns_it(seed):
    det = armed(seed=seed)
    assert opened(feed(det, synth.windows(60, 40, Load(fsync=0.03), seed=seed))) == []
    # Healthy with the new wait: after a while it is part of the baseline (its usual high moved up to it).
    assert det.baseline_.stats()["blocked"].high > 0.02


def test_sustained_shift_is_its_edge():
    windows = synth.windows(60, 12, SMALL["blocked"])
    det = armed()
    shift = _shifts(det, windows[:det.sustained_windows])[-1]
    assert opened(feed(armed(sustained_shift=shift - 1e-3), windows)) != []
    assert opened(feed(armed(sustained_shift=shift + 1e-3), windows[:det.sustained_windows])) == []


def _shifts(det: LatencyDetector, windows) -> list[float | None]:
    """The six-window mean score shift after each window, as the sustained test reads it: the mean of the last
    sustained_windows scores the verdicts gave, above the baseline windows' own median score (score_ref_); None
    until the windows given here have scored sustained_windows times."""
    scores: deque[float] = deque(maxlen=det.sustained_windows)
    out: list[float | None] = []
    for w in windows:
        if (score := det.update(w).score) is not None:
            scores.append(score)
        out.append(sum(scores) / len(scores) - det.score_ref_ if len(scores) == scores.maxlen else None)
    return out


# (seed, slowdown): weaker runs of the small fault whose six-window mean dips below the opening bar after it opened.
DIPS = [(0, 1.15), (2, 1.18)]


@pytest.mark.parametrize(("seed", "slowdown"), DIPS)
def test_a_sustained_episode_stays_open_while_the_shift_stays_above_the_close_bar(seed, slowdown):
    # The same small fault, a little weaker after it opened: its six-window mean wanders below the opening bar. With
    # hysteresis it stays one regression; with one bar (close = open) it resolves within the fault.
    onset = synth.windows(60, 8, SMALL["cpu_contention"], seed=seed)
    weaker = synth.windows(68, 24, replace(SMALL["cpu_contention"], slowdown=slowdown), seed=seed)
    probe = armed(seed=seed, sustained_shift=10.0)  # never opens: reads the shifts the weaker windows give
    feed(probe, onset)
    det = armed(seed=seed)
    shifts = _shifts(probe, weaker)[6:]
    assert None not in shifts and min(shifts) < det.sustained_shift
    vs = feed(det, onset + weaker)
    assert len(opened(vs)) == 1 and [v for v in vs if v.closed] == [] and vs[-1].state == "regression"
    flat = armed(seed=seed, sustained_close_shift=det.sustained_shift)
    assert [v for v in feed(flat, onset + weaker) if v.closed]


@pytest.mark.parametrize("seed", range(3))
def test_a_sustained_episode_closes_once_the_shift_is_gone(seed):
    det = armed(seed=seed)
    vs = feed(det, synth.windows(60, 10, SMALL["cpu_contention"], seed=seed) + synth.windows(70, 20, seed=seed))
    closed = [i for i, v in enumerate(vs) if v.closed]
    assert opened(vs) and len(closed) == 1 and closed[0] <= 10 + det.sustained_windows + det.close_windows


def test_sustained_min_z_silences_the_test_on_a_baseline_too_noisy_to_tell():
    assert opened(feed(armed(sustained_min_z=1e6), synth.windows(60, 12, SMALL["blocked"]))) == []


def test_a_regression_opened_by_persistence_keeps_its_named_cause_when_later_windows_move_too_little():
    det = armed()
    feed(det, synth.windows(60, 6, SMALL["blocked"]))
    assert det.episode_ is not None and det.episode_.top_cause == "blocked"
    # Latency stays up but the wait fades below every gate: no new evidence is not evidence of another cause.
    vs = feed(det, synth.windows(66, 2, Load(slowdown=1.8)))
    assert vs[-1].state == "regression" and vs[-1].regression.top_cause == "blocked"


def test_the_onset_of_a_regression_never_joins_the_baseline():
    det = armed()
    rows = len(det.baseline_)
    feed(det, synth.windows(60, 6, SMALL["blocked"]))
    assert det.episode_ is not None and det.pending_ == deque() and len(det.baseline_) <= rows + 1
    assert all(r.signals["blocked"] < 0.01 for r in det.baseline_.rows)


def test_a_restart_in_the_middle_of_a_slow_onset_opens_where_the_uninterrupted_detector_does():
    det = armed(seed=3)
    onset = synth.windows(60, 12, SMALL["cpu_contention"], seed=3)
    feed(det, onset[:3])
    restored = LatencyDetector()
    restored.set_state(json.loads(json.dumps(det.get_state())))
    a, b = feed(det, onset[3:]), feed(restored, onset[3:])
    # The restored detector refits its model on restore (the model itself is not stored), so scores may differ a
    # little; what the restart must not change is where the episode opens and what it names.
    assert opened(a) == opened(b) != []
    assert [v.state for v in a] == [v.state for v in b]
    assert a[opened(a)[0]].opened.causes == b[opened(b)[0]].opened.causes


def test_a_cause_named_by_persistence_needs_at_least_two_windows_above_its_usual_high():
    once = [synth.window(60, Load(slowdown=3.0, fsync=0.03)), synth.window(61, Load(slowdown=3.0))]
    twice = [synth.window(60, Load(slowdown=3.0, fsync=0.03)), synth.window(61, Load(slowdown=3.0, fsync=0.03))]
    a, b = feed(armed(), once), feed(armed(), twice)
    assert opened(a) == opened(b) == [1]
    assert a[1].opened.top_cause == "unknown"
    assert b[1].opened.top_cause == "blocked" and "in 2 of 2 windows" in b[1].opened.causes[0].evidence


@functools.cache
def _armed_with_delivery() -> str:
    det = LatencyDetector()
    feed(det, synth.windows(0, 60, Load(delivery=True)))
    return json.dumps(det.get_state())


@pytest.mark.parametrize(("loss", "by"), [(0.1, 2), (0.2, 1)])
def test_loss_on_replies_alone_opens_network_on_the_clients_latency_within_two_windows(loss, by):
    """The server's own latency does not move (it stops at the write); 10-20 % of replies wait for an RTO. The
    clients' latency (server + measured delivery) does: a regression named network by the window after the
    detector's 2-of-3 rule allows (at 10 %, 20 requests a window, one window in this seed had no lost reply)."""
    det = LatencyDetector()
    det.set_state(json.loads(_armed_with_delivery()))
    vs = feed(det, synth.windows(60, 4, Load(reply_loss=loss)))
    first = opened(vs)
    assert first and first[0] <= by, [v.state for v in vs]
    cause = vs[first[0]].opened.causes[0]
    assert cause.label == "network", cause
    # What the clients lost, in the words the issue asks for.
    assert re.match(r"replies delivered 0\.\d+ s later at p99 \(x\d+(\.\d+)?\), \d+ % of replies retransmitted, "
                    r"RTO stalls [\d.]+ s/s; ", cause.evidence), cause.evidence


@pytest.mark.parametrize(("loss", "by"), [(0.1, 2), (0.2, 1)])
def test_lost_syn_acks_alone_open_network_within_two_windows(loss, by):
    """A client per connection, 10-20 % of SYN-ACKs lost: those clients wait 1 s to connect, before any reply exists,
    so neither the server's latency nor the replies' delivery moves. The connection setup wait the delivery probe
    measures does: a regression named network within 2 windows, the wait in its evidence."""
    det = LatencyDetector()
    det.set_state(json.loads(_armed_with_delivery()))
    vs = feed(det, synth.windows(60, 4, Load(delivery=True, synack_loss=loss)))
    first = opened(vs)
    assert first and first[0] <= by, [v.state for v in vs]
    cause = vs[first[0]].opened.causes[0]
    assert cause.label == "network", cause
    assert re.search(r"connections waited [\d.]+ s per request for SYN-ACK retransmits", cause.evidence), cause.evidence


def test_healthy_delivery_opens_nothing_and_older_windows_without_it_score_as_before():
    det = LatencyDetector()
    det.set_state(json.loads(_armed_with_delivery()))
    assert opened(feed(det, synth.windows(60, 30, Load(delivery=True), seed=7))) == []
    # Without the delivery reading (recordings before it), the score is the server's alone, unchanged.
    w = synth.window(60, Load(reply_loss=0.2))
    bare = replace(w, delivery=None)
    assert score_of(bare) == score_of(replace(synth.window(60), tcp=bare.tcp))


@functools.cache
def _armed_on_a_noisy_host(seed: int) -> str:
    det = LatencyDetector()
    feed(det, synth.windows(0, 60, NOISY, seed=seed))
    return json.dumps(det.get_state())


# A shared host (analysis/network_part.py): the server's latency of each window x exp(N(0, 0.5)), 0.3 s mean.
NOISY = Load(delivery=True, host_noise=0.5, base_latency=0.3)


@pytest.mark.parametrize("seed", range(6))
def test_on_a_noisy_host_lost_syn_acks_open_network_within_two_windows(seed):
    """15 % of connections wait 1 s for a resent SYN-ACK (the recorded reply-loss scenario's signal): the clients'
    mean rises by about half the expected latency, inside the server's own window-to-window spread, so their
    latency alone opened after 2-5 windows or never in these seeds. Given the server's latency, the network's part
    is far outside its own spread: open by the second window after onset."""
    det = LatencyDetector()
    det.set_state(json.loads(_armed_on_a_noisy_host(seed)))
    vs = feed(det, synth.windows(60, 4, replace(NOISY, synack_loss=0.15), seed=seed))
    first = opened(vs)
    assert first and first[0] <= 2, [v.score for v in vs]
    assert vs[first[0]].opened.top_cause == "network"


@pytest.mark.parametrize("seed", range(4))
def test_on_a_noisy_host_healthy_delivery_opens_nothing(seed):
    det = LatencyDetector()
    det.set_state(json.loads(_armed_on_a_noisy_host(seed)))
    assert opened(feed(det, synth.windows(60, 120, NOISY, seed=seed))) == []


@pytest.mark.parametrize("seed", range(6))
def test_a_loss_burst_shorter_than_a_window_opens_network_on_its_one_window(seed):
    """A few seconds of loss leave one window: 40 % of its connections waited 1 s for a resent SYN-ACK, measured by
    the server's kernel, and the next windows are healthy. The 2-of-3 rule needs two anomalous windows; one is enough
    when the delivery probe measured the clients' extra wait itself far outside its spread (_decisive)."""
    det = LatencyDetector()
    det.set_state(json.loads(_armed_on_a_noisy_host(seed)))
    burst = [synth.window(60, replace(NOISY, synack_loss=0.4), seed=seed)]
    vs = feed(det, burst + synth.windows(61, 6, NOISY, seed=seed))
    assert opened(vs) == [0], [v.score for v in vs]
    assert vs[0].opened.top_cause == "network"
    assert "connections waited" in vs[0].opened.causes[0].evidence


def test_one_window_without_the_kernels_measure_of_the_clients_wait_still_needs_two():
    """The same window's server latency x3 with a cause beside it, or retransmits counted with no reply measured
    late: either is a latency estimate or a count, not the clients' wait measured, so the 2-of-3 rule stands."""
    det = armed()
    vs = feed(det, [synth.window(60, Load(slowdown=3.0, fsync=0.03))] + synth.windows(61, 4))
    assert opened(vs) == []
    det = armed()
    vs = feed(det, [synth.window(60, Load(slowdown=3.0, retransmits=70))] + synth.windows(61, 4))
    assert opened(vs) == []


def test_a_stalled_window_whose_replies_the_kernel_saw_crawl_opens_network_at_once():
    """A policer on the server's port: no scrape is answered, and the one reply acknowledged in the window took 3 s
    (a LAN's take well under 10 ms). The stall alone needs a strong cause and two windows; with the delivery probe's
    measure of the wait, the first window opens a critical network regression."""
    det = LatencyDetector()
    det.set_state(json.loads(_armed_with_delivery()))
    w = synth.unanswered(synth.window(60, Load(delivery=True)))
    crawl = DeliveryReading(replies=1, buckets={**dict.fromkeys(w.delivery.buckets, 0.0), "5.0": 1.0},
                            delivery_seconds=3.1, srtt_mean_seconds=0.0005)
    vs = feed(det, [replace(w, delivery=crawl)])
    assert opened(vs) == [0]
    assert vs[0].opened.severity == "critical" and vs[0].opened.top_cause == "network"
