"""LatencyDetector: per-target online baseline, expected-latency residual test, k-of-m episodes and attribution."""

from __future__ import annotations

import dataclasses
import math
from collections import deque

from analysis import culprits, disk_writers, memory_growers, stall_events
from analysis.attribution import Attributor, Moved, evidence
from analysis.baseline import Baseline, BaselineRow, cpu_wait, jsd_size
from analysis.cause_signals import BY_NAME, SIGNALS, read_all
from analysis.features import Features, extract
from analysis.latency_model import ExpectedLatency
from analysis.members import MemberBaseline, locate, member_measures, rank_in_members
from analysis.network_part import INDIRECT, PARTS, direct_strength, network_z
from analysis.profile import leaf_counts, merge, top_shifts
from analysis.regression import Cause, FunctionShift, Regression
from analysis.robust import median, robust_z
from analysis.sampling import EVENTS, FROM, RECORDINGS, TICKS, pooled
from analysis.steady_stacks import SteadyStacks, lock_waits, ticks_of
from analysis.verdict import Verdict
from analysis.window import Window

STATE_VERSION = 1


class LatencyDetector:
    """One per target. Parameters only in __init__ (docs/detector.md explains every default); feed windows in order."""

    def __init__(self, warmup_windows: int = 24, min_requests: int = 3, open_score: float = 4.0,
                 close_score: float = 1.5, unexplained_open_score: float = 8.0, k: int = 2, m: int = 3,
                 close_windows: int = 3, load_allowance: float = 1.0, load_quantile: float = 0.9,
                 stall_fraction: float = 0.2,
                 min_stall_requests: float = 10.0,
                 critical_score: float = 12.0, critical_ratio: float = 3.0, baseline_windows: int = 720,
                 refit_every: int = 12, profile_decay: float = 0.98, attribution_windows: int = 3,
                 max_elasticity: float = 2.0, tail_quantile: float = 0.9, min_log_scale: float = 0.05,
                 min_cause_z: float = 3.0, min_cause_ratio: float = 1.5, compute_weight: float = 0.5,
                 lock_blocked_discount: float = 0.5, profile_min_jsd: float = 0.1, max_causes: int = 4,
                 max_functions: int = 10, strong_cause_score: float = 4.0, strong_open_score: float = 0.0,
                 rto_min_seconds: float = 0.2, min_net_scale: float = 0.2, sustained_windows: int = 6,
                 sustained_min_windows: int = 5, sustained_shift: float = 0.75, sustained_change_fraction: float = 0.1,
                 sustained_min_z: float = 6.0, high_quantile: float = 0.9, cause_change_windows: int = 2,
                 sustained_close_shift: float = 0.375, contention_stall_ratio: float = 2.0,
                 contention_lead: float = 2.0, contention_onset_windows: int = 12,
                 stall_event_alpha: float = 1e-5, sampling_noise: bool = True) -> None:
        self.warmup_windows = warmup_windows
        self.min_requests = min_requests
        self.open_score = open_score
        self.close_score = close_score
        self.unexplained_open_score = unexplained_open_score
        self.load_allowance = load_allowance
        self.load_quantile = load_quantile
        self.stall_fraction = stall_fraction
        self.min_stall_requests = min_stall_requests
        self.k = k
        self.m = m
        self.close_windows = close_windows
        self.critical_score = critical_score
        self.critical_ratio = critical_ratio
        self.baseline_windows = baseline_windows
        self.refit_every = refit_every
        self.profile_decay = profile_decay
        self.attribution_windows = attribution_windows
        self.max_elasticity = max_elasticity
        self.tail_quantile = tail_quantile
        self.min_log_scale = min_log_scale
        self.min_cause_z = min_cause_z
        self.min_cause_ratio = min_cause_ratio
        self.compute_weight = compute_weight
        self.lock_blocked_discount = lock_blocked_discount
        self.profile_min_jsd = profile_min_jsd
        self.max_causes = max_causes
        self.max_functions = max_functions
        self.strong_cause_score = strong_cause_score
        self.strong_open_score = strong_open_score
        self.rto_min_seconds = rto_min_seconds
        self.min_net_scale = min_net_scale
        self.sustained_windows = sustained_windows
        self.sustained_min_windows = sustained_min_windows
        self.sustained_shift = sustained_shift
        self.sustained_close_shift = sustained_close_shift
        self.sustained_change_fraction = sustained_change_fraction
        self.sustained_min_z = sustained_min_z
        self.high_quantile = high_quantile
        self.cause_change_windows = cause_change_windows
        self.contention_stall_ratio = contention_stall_ratio
        self.contention_lead = contention_lead
        self.contention_onset_windows = contention_onset_windows
        self.stall_event_alpha = stall_event_alpha
        # Judge the stack signals against the sampling noise of the ticks they were read from (analysis.sampling);
        # False replays the detector without those gates (docs/BENCHMARKS.md "Stack signals against their sampling
        # noise").
        self.sampling_noise = sampling_noise
        self._check_params()
        self.reset()

    def _check_params(self) -> None:
        if self.warmup_windows < 3:
            raise ValueError(f"warmup_windows must be >= 3, got {self.warmup_windows!r}")
        if not 1 <= self.k <= self.m:
            raise ValueError(f"need 1 <= k <= m, got k={self.k!r}, m={self.m!r}")
        if not self.close_score < self.open_score <= self.unexplained_open_score:
            raise ValueError("need close_score < open_score <= unexplained_open_score, got "
                             f"{self.close_score!r}, {self.open_score!r}, {self.unexplained_open_score!r}")
        if not self.strong_open_score <= self.open_score:
            raise ValueError(f"need strong_open_score <= open_score, got {self.strong_open_score!r}")
        if self.rto_min_seconds < 0:
            raise ValueError(f"rto_min_seconds must be >= 0, got {self.rto_min_seconds!r}")
        if self.close_windows < 1:
            raise ValueError(f"close_windows must be >= 1, got {self.close_windows!r}")
        if self.cause_change_windows < 1:
            raise ValueError(f"cause_change_windows must be >= 1, got {self.cause_change_windows!r}")
        if not 1 <= self.sustained_min_windows <= self.sustained_windows:
            raise ValueError("need 1 <= sustained_min_windows <= sustained_windows, got "
                             f"{self.sustained_min_windows!r}, {self.sustained_windows!r}")
        if not 0.5 <= self.high_quantile < 1:
            raise ValueError(f"high_quantile must be in [0.5, 1), got {self.high_quantile!r}")
        if self.contention_onset_windows < self.sustained_windows:
            raise ValueError(f"contention_onset_windows must be >= sustained_windows, got {self.contention_onset_windows!r}")
        if self.contention_stall_ratio < 1 or self.contention_lead < 1:
            raise ValueError("contention_stall_ratio and contention_lead must be >= 1, got "
                             f"{self.contention_stall_ratio!r}, {self.contention_lead!r}")
        if not 0 < self.stall_event_alpha < 1:
            raise ValueError(f"stall_event_alpha must be in (0, 1), got {self.stall_event_alpha!r}")
        if self.baseline_windows < self.warmup_windows:
            raise ValueError(f"baseline_windows must be >= warmup_windows, got {self.baseline_windows!r}")

    # -- state -------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the baseline and any open episode; the next windows are a new warm-up."""
        self.baseline_ = Baseline(self.baseline_windows, self.profile_decay, self.high_quantile)
        self.model_: ExpectedLatency | None = None
        self.score_ref_ = 0.0  # the median score of the baseline's own windows under the current fit
        # The last scored windows (score and signals), for the sustained-shift test.
        self.recent_: deque[dict] = deque(maxlen=self.sustained_windows)
        # Healthy windows wait here until as many windows after them are healthy too before they join the
        # baseline: the first windows of a slow regression must not teach the baseline that it is normal.
        self.pending_: deque[tuple[BaselineRow, dict[str, float] | None]] = deque()
        self.since_refit_ = 0
        self.history_: deque[bool] = deque(maxlen=self.m)
        self.run_: deque[dict] = deque(maxlen=self.m)  # signals of the anomalous windows in the k-of-m run
        self.episode_: Regression | None = None
        self.episode_values_: deque[dict] = deque(maxlen=self.attribution_windows)
        # The open episode's run-queue culprits summed over all its windows (analysis.culprits.pooled): who is named.
        self.episode_culprits_: dict | None = None
        self.episode_leaves_: dict[str, float] = {}
        self.calm_ = 0
        # Windows between two steady py-spy recordings read the latest one's stack signals (analysis.steady_stacks).
        self.steady_stacks_ = SteadyStacks()
        # The last window's instant readings (Signal.instant), which explain the next window's latency too.
        self.instant_: dict[str, float] = {}
        # The open episode's first named cause, and the consecutive windows since whose causes name another cause
        # and no longer that one (see _cause_moved).
        self.named_for_ = "unknown"
        self.named_causes_: list[Cause] = []  # the causes as last ranked while they still named named_for_
        self.moved_ = 0
        self.moved_to_ = "unknown"  # the cause those windows name first
        self.moved_leaves_: list[dict[str, float]] = []  # those windows' stacks: the next regression's functions
        self.last_id_: str | None = None
        self.members_base_ = MemberBaseline(self.high_quantile)
        # Scored windows in a row, up to this one, whose CPU stall was the stall's min_change above the baseline's
        # median: how long ago the stall began (the contention rule opens only on a stall that began with the latency
        # shift). The median, not the usual high: the high climbs as a stall that stays joins the baseline, and a
        # window that dips under it would make an old stall look new.
        self.stalled_for_ = 0

    def get_state(self) -> dict:
        """JSON-serialisable: baseline rows, profile, and the open episode with its debouncing state."""
        return {
            "version": STATE_VERSION,
            "baseline": self.baseline_.to_dict(),
            "armed": self.model_ is not None,
            "since_refit": self.since_refit_,
            "history": list(self.history_),
            "run": list(self.run_),
            "episode": dataclasses.asdict(self.episode_) if self.episode_ is not None else None,
            "episode_values": list(self.episode_values_),
            "episode_culprits": self.episode_culprits_,
            "episode_leaves": dict(self.episode_leaves_),
            "calm": self.calm_,
            "named_for": self.named_for_,
            "named_causes": [dataclasses.asdict(c) for c in self.named_causes_],
            "moved": self.moved_,
            "moved_to": self.moved_to_,
            "moved_leaves": list(self.moved_leaves_),
            "last_id": self.last_id_,
            "members_base": self.members_base_.to_dict(),
            "members_rows": self.members_base_.rows_to_dict(),
            "recent": list(self.recent_),
            "stalled_for": self.stalled_for_,
            "instant": dict(self.instant_),
            "pending": [{"row": row.to_dict(), "leaves": leaves} for row, leaves in self.pending_],
        }

    def set_state(self, state: dict) -> None:
        """Restore get_state()'s output: an armed baseline needs no new warm-up; an open episode stays open."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            got = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"detector state must be a dict of version {STATE_VERSION}, got {got!r}")
        self.reset()
        try:
            self._restore(state)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            self.reset()
            raise ValueError(f"detector state is malformed ({type(exc).__name__}: {exc}); reset the baseline") from None

    def _restore(self, state: dict) -> None:
        self.baseline_.load(state["baseline"])
        if state.get("armed") and len(self.baseline_) >= 3:
            self._refit()
        self.since_refit_ = int(state.get("since_refit", 0))
        self.history_.extend(bool(x) for x in state.get("history", []))
        self.run_.extend(state.get("run", []))
        if (ep := state.get("episode")) is not None:
            ep = dict(ep)
            ep["causes"] = [Cause(**c) for c in ep.get("causes", [])]
            ep["functions"] = [FunctionShift(**f) for f in ep.get("functions", [])]
            self.episode_ = Regression(**ep)
        self.episode_values_.extend(state.get("episode_values", []))
        self.episode_culprits_ = state.get("episode_culprits")
        self.episode_leaves_ = {str(k): float(v) for k, v in state.get("episode_leaves", {}).items()}
        self.calm_ = int(state.get("calm", 0))
        self.named_for_ = str(state.get("named_for", self.episode_.top_cause if self.episode_ else "unknown"))
        self.named_causes_ = ([Cause(**c) for c in state["named_causes"]] if "named_causes" in state
                              else list(self.episode_.causes) if self.episode_ else [])
        self.moved_ = int(state.get("moved", 0))
        self.moved_to_ = str(state.get("moved_to", "unknown"))
        self.moved_leaves_ = [{str(k): float(v) for k, v in leaves.items()} for leaves in state.get("moved_leaves", [])]
        self.last_id_ = state.get("last_id")
        self.members_base_.load(state.get("members_base", {}), state.get("members_rows", {}))
        self.recent_.extend(state.get("recent", []))
        self.stalled_for_ = int(state.get("stalled_for", 0))
        self.instant_ = {str(k): float(v) for k, v in state.get("instant", {}).items()}
        self.pending_.extend((BaselineRow.from_dict(p["row"]), p.get("leaves")) for p in state.get("pending", []))

    def interrupt(self, at: float) -> Regression | None:
        """The target stopped being there (its process ended): the open episode, if any, ends at `at` and is
        returned; the windows of the run before it are forgotten, since the next ones come from another process
        and must not join them in a k-of-m run, a sustained shift or the pending healthy windows. The baseline
        stays: a server that restarts as it was is judged against what it was."""
        closed = dataclasses.replace(self.episode_, closed_at=at) if self.episode_ is not None else None
        self.episode_ = None
        self.history_.clear()
        self.run_.clear()
        self.recent_.clear()
        self.pending_.clear()
        self.episode_values_.clear()
        self.episode_culprits_ = None
        self.episode_leaves_ = {}
        self.calm_ = 0
        self.steady_stacks_.clear()
        self.instant_ = {}
        self._forget_move()
        return closed

    # -- the per-window step -----------------------------------------------------------------------

    def update(self, window: Window) -> Verdict:
        f = extract(window)
        leaves = leaf_counts(window.stacks.active) if window.stacks is not None and window.stacks.active else None
        own = read_all(f)
        ticks = ticks_of(window)
        carried = self.steady_stacks_.read(window, f.app_wait_threads, leaves, own["blocked"], ticks)
        span = self.steady_stacks_.span  # windows this window's recording spanned (analysis.steady_stacks)
        usable = (f.requests is not None and f.requests >= self.min_requests and f.mean_seconds is not None
                  and f.mean_seconds > 0)
        if self.model_ is None:
            if usable:
                self.baseline_.add(window.start, window.end, f, leaves, span)
                if window.members:  # the warm-up's windows are each member's first healthy ones too
                    self.members_base_.learn(member_measures(window, f))
                if len(self.baseline_) >= self.warmup_windows:
                    self._refit()
            return Verdict("warmup", None, {}, None, None, None)

        model = self.model_
        expected_all = model.expected(f.request_rate, f.tokens_per_request)
        expected = {q: v for q, v in expected_all.items() if q in ("p50", "p99")}
        values = {**own, **stall_events.read_counts(f), "jsd": self.baseline_.jsd(leaves, span)}
        if leaves and self.sampling_noise:
            values["jsd_size"] = jsd_size(leaves, span)
        if ticks is not None and f.app_wait_threads is not None and self.sampling_noise:
            values.update({TICKS.format("app_wait"): ticks, FROM: window.end})
        # The lock signal net of the threads the kernel saw in non-lock waits over the windows its recording spanned
        # (analysis.steady_stacks.lock_waits): a recording taken while threads stalled on page faults is no lock.
        usual = self.baseline_.stats().get("blocked")
        usual_blocked = None if usual is None else usual.median
        values["app_wait"] = lock_waits(values["app_wait"], self.steady_stacks_.span_blocked, usual_blocked)
        if carried is not None:
            # Signals only: the baseline learns each recording once, from the window it came with.
            values.update(read_all(dataclasses.replace(f, app_wait_threads=carried.app_wait_threads)),
                          jsd=self.baseline_.jsd(carried.leaves, carried.span), stacks_carried_from=carried.at)
            if carried.leaves and self.sampling_noise:
                values["jsd_size"] = jsd_size(carried.leaves, carried.span)
            if carried.ticks is not None and carried.app_wait_threads is not None and self.sampling_noise:
                values.update({TICKS.format("app_wait"): carried.ticks, FROM: carried.at})
            values["app_wait"] = lock_waits(values["app_wait"], carried.blocked, usual_blocked)
        if window.members:
            values["members"] = member_measures(window, f)  # where a family's causes live (analysis.members)
        if (kept := culprits.sample(window)) is not None:
            values["culprits"] = kept  # who held the CPU while the target waited (analysis.culprits)
        if (grown := memory_growers.sample(window)) is not None:
            values["growers"] = grown  # who grew in memory while it stalled (analysis.memory_growers)
        if (wrote := disk_writers.sample(window)) is not None:
            values["writers"] = wrote  # who wrote to the disks while its I/O stalled (analysis.disk_writers)
        score = self._score(f, expected_all, values) if usable else None
        strength = self._corroboration(values)
        # A window's latency rise is explained by its own cause signals, or by a wait the previous window caught under
        # way at its end (an instant reading: Signal.instant): the requests that wait held up finish in this window,
        # and a fault that comes and goes (stops every few seconds) is caught at a window's end only now and then.
        # Only to explain a rise past open_score: a strong cause opens on any latency in its own window alone.
        explained = strength > 0 or (score is not None and score >= self.open_score and bool(self.instant_)
                                     and self._corroboration(self.instant_) > 0)
        self.instant_ = {s.name: values[s.name] for s in SIGNALS if s.instant and values.get(s.name) is not None}
        # Silence is the weakest latency evidence (clients may have left), so it needs the strongest mechanism.
        stalled = not usable and self._stalled(f) and strength >= self.strong_cause_score
        anomalous = stalled or (score is not None and (
            score >= self.unexplained_open_score
            or (explained and score >= self.open_score)
            or (strength >= self.strong_cause_score and score >= self.strong_open_score)))
        decisive = anomalous and self._decisive(values, expected_all["mean"], stalled)
        if score is not None or stalled:
            self.history_.append(anomalous)
        if score is not None:
            self.recent_.append({"score": score, **values})
            self.stalled_for_ = self.stalled_for_ + 1 if self._cpu_stalled(values.get("cpu_pressure"), False) else 0
        # A small shift that no single window shows: latency a little above its usual level over the last windows,
        # with a cause signal above its baseline's usual high in nearly all of them.
        sustained = self._sustained(self.sustained_shift, True) if score is not None and not anomalous else []
        if anomalous:
            self.run_.append({**values, "leaves": leaves or {}})
        elif not any(self.history_):
            self.run_.clear()  # the run is over: its windows must not colour a later episode's causes

        if self.episode_ is None:
            if anomalous and (sum(self.history_) >= self.k or decisive):
                reg = self._open(window, f, score, expected_all)
                return Verdict("regression", score, expected, reg, reg, None)
            if sustained:
                reg = self._open(window, f, score, expected_all, [{k: v for k, v in r.items() if k != "score"}
                                                                  for r in self.recent_])
                return Verdict("regression", score, expected, reg, reg, None)
            if score is not None and score < self.close_score and not any(self.history_):
                self._learn_later(window, f, leaves, span)
                if "members" in values:
                    self.members_base_.learn(values["members"])
            return Verdict("healthy", score, expected, None, None, None)

        closed = None
        # Hysteresis for the sustained test too: a small shift's six-window mean wanders around the opening bar, and
        # an episode that closed whenever it dipped would resolve and fire again within the same fault.
        if stalled or (score is not None and (score >= self.close_score
                                              or self._sustained(self.sustained_close_shift))):
            self.calm_ = 0
            self.episode_values_.append(values)
            self.episode_culprits_ = culprits.pooled([values], self.episode_culprits_)
            if leaves:
                merge(self.episode_leaves_, leaves)
            self.episode_ = self._rerank(self.episode_, window, f, score, expected_all)
            if self._cause_moved(self.episode_.causes, leaves) and anomalous and sum(self.history_) >= self.k:
                # One regression has ended and another begun without a calm window between them: two
                # incidents, each with its own alert and its own cause, not one that silently changes its name.
                # The new one's causes are the ones just ranked (they no longer name the old fault); its functions
                # are those that grew in the windows that showed its cause, not in the old fault's.
                closed = dataclasses.replace(self.episode_, causes=self.named_causes_, closed_at=window.start)
                reg = self._open(window, f, score, expected_all, list(self.episode_values_), self.moved_leaves_)
                return Verdict("regression", score, expected, reg, reg, closed)
        elif score is not None:
            self._forget_move()
            self.calm_ += 1
            if self.calm_ >= self.close_windows:
                closed = dataclasses.replace(self.episode_, closed_at=window.end)
                self.episode_ = None
                self.episode_culprits_ = None
                self.history_.clear()
                self.run_.clear()
                self.recent_.clear()
                return Verdict("healthy", score, expected, None, None, closed)
        return Verdict("regression", score, expected, self.episode_, None, None)

    # -- pieces --------------------------------------------------------------------------------------

    def _score(self, f: Features, expected: dict[str, float], values: dict[str, float | None]) -> float | None:
        assert f.mean_seconds is not None and f.requests is not None
        mean = f.mean_seconds + self._retransmit_cost(f, values)
        server = self._latency_z(mean, f.mean_seconds, f.requests, f.buckets, cpu_wait(f), expected["mean"])
        if not f.client_buckets:
            return server
        # The clients' latency (server + delivery) against the same expectation: a fault on the way to the clients
        # moves only this one. And given the server's latency, measured in the same window, the network's part
        # against its own spread, not the host's (analysis/network_part.py).
        clients = self._latency_z(mean, f.mean_seconds, f.requests, f.client_buckets, cpu_wait(f), expected["mean"])
        given = network_z(values, self.baseline_.stats(), expected["mean"], self.min_log_scale)
        return max(server, clients, -math.inf if given is None else round(given, 4))

    def _latency_z(self, mean: float, server_mean: float, n: float, buckets: tuple[tuple[float, float], ...],
                   wait: float | None, expected_mean: float) -> float:
        model = self.model_
        assert model is not None
        parts = [model.z_mean(mean, n, expected_mean)]
        if (zt := model.z_tail(buckets, expected_mean)) is not None:
            parts.append(zt)
        # The mean (exact, from the histogram's sum) and the tail count (from bucket deltas) see different
        # failures; averaging their z keeps one noisy estimate from alarming alone.
        gross = sum(parts) / len(parts)
        # The same latency net of the time the server waited for a CPU: on a shared host that wait is most of the
        # noise, and a fault that does not take CPUs away (a lock, GC, disk) stands out of what is left. CPU
        # contention itself shows in the gross test.
        net = model.z_net(server_mean, wait, n, expected_mean)
        return round(gross if net is None else max(gross, net), 4)

    def _sustained(self, min_shift: float, opening: bool = False) -> list[Cause]:
        """The causes of a sustained small shift over the last sustained_windows scored windows, [] when there is
        none: their mean score at least min_shift (sustained_shift to open, sustained_close_shift to stay open) above
        the baseline windows' own median score, and a cause signal persistently above its baseline's high quantile
        (Attributor.persistent)."""
        if len(self.recent_) < self.sustained_windows or self._recent_shift() < min_shift:
            return []
        causes = self._attributor().rank_persistent(list(self.recent_), self.baseline_.stats(),
                                                    self.sustained_min_windows, self.sustained_change_fraction,
                                                    self.sustained_min_z)
        if causes[0].label != "unknown":
            return causes
        if opening and self.stalled_for_ > self.contention_onset_windows:
            return []  # the stall was there long before the latency moved: not what moved it (see _contention)
        found = self._contention(list(self.recent_), self.sustained_min_windows)
        return [] if found is None else [found]

    def _cpu_stalled(self, x: float | None, above_high: bool = True) -> bool:
        """This CPU stall (s/s) lies the stall's min_change above the baseline's median and (above_high) above its
        usual high."""
        sig = BY_NAME["cpu_pressure"]
        stats = self.baseline_.stats().get(sig.name)
        return (stats is not None and stats.high is not None and x is not None and math.isfinite(x)
                and (x > stats.high or not above_high) and x - stats.median >= sig.min_change)

    def _contention(self, samples: list[dict], min_windows: int) -> Cause | None:
        """`cpu_contention` from direct evidence over a run of windows, None without it: the CPU stall of the server's
        cgroup (PSI some; the host's where the server runs in the root cgroup) above its baseline's usual high and
        min_change above its median in at least min_windows of them, their median contention_stall_ratio times the
        baseline's; and one neighbour that led the server's run-queue wait (analysis.culprits.leader: present in
        min_windows of them, charged contention_lead times the next neighbour). Neither alone: the stall is any busy
        tenant's, and a shared host always has a neighbour that leads. The latency shift is the caller's test (the
        sustained bar): a busier host with a named neighbour is not a regression unless the server's latency moved.
        Both must hold in the newest window too: a fault that has already passed is not one to open now. To open
        (not to name), the stall must also have begun at most contention_onset_windows windows ago: a stall that
        was there while the latency stayed as usual did not move it, and a busy neighbour that stays would otherwise
        be named at every chance latency shift until the baseline learnt it.
        No z gate (the sustained test's sustained_min_z): on a host whose tenants come and go the stall's baseline
        spread is wide, and the neighbour named by the kernel is the corroboration the z gate stood in for."""
        sig = BY_NAME["cpu_pressure"]
        stats = self.baseline_.stats().get(sig.name)
        if stats is None or stats.high is None:
            return None
        xs = [x for x in (s.get(sig.name) for s in samples) if x is not None and math.isfinite(x)]
        above = sum(map(self._cpu_stalled, xs))
        # Still there in the newest window: a burst of tenants that has passed is no fault to open now.
        if above < min_windows or not samples or not self._cpu_stalled(samples[-1].get(sig.name)):
            return None
        value = median(xs)
        ratio = value / max(stats.median, sig.floor)
        if ratio < self.contention_stall_ratio:
            return None
        who = culprits.leader(samples, min_windows, self.contention_lead)
        if who is None or not culprits.present(samples[-1], who.pid):
            return None
        moved = Moved(sig, value, stats.median, ratio, robust_z(value, stats.median, stats.sigma, sig.min_change / 4))
        words = (f"{evidence(moved)}, above the baseline's usual high ({stats.high:.3g} s/s) in {above} of "
                 f"{len(samples)} windows; {who.words()}")
        return Cause("cpu_contention", round(moved.score, 4), words, value, stats.median)

    def _recent_shift(self) -> float:
        """How far the last scored windows' mean score lies above the baseline windows' own median score."""
        return sum(r["score"] for r in self.recent_) / len(self.recent_) - self.score_ref_

    def _retransmit_cost(self, f: Features, values: dict[str, float | None]) -> float:
        """Seconds per request that retransmissions beyond the baseline's rate cost the clients, at least.

        The server's histogram ends when it hands the reply to the kernel; a lost segment of that reply (or of the
        request) costs its client at least one retransmission timeout (Linux RTO min, 200 ms) that the server never
        sees. Spread over the window's requests that is a lower bound on the latency users lost to the network."""
        rate, now = f.request_rate, values.get("retransmits")
        stats = self.baseline_.stats().get("retransmits")
        if rate is None or rate <= 0 or now is None or stats is None:
            return self._delivery_cost(values)
        return max(max(0.0, now - stats.median) * self.rto_min_seconds / rate, self._delivery_cost(values))

    def _delivery_cost(self, values: dict[str, float | None]) -> float:
        """Seconds per request the clients waited for their replies beyond the baseline's usual delivery, measured
        (probes/delivery.py): the clients' latency is the server's plus this, so a regression opens on either with
        the same expectation and false-alarm rules. 0 where delivery is not measured (older recordings)."""
        cost = 0.0
        for name in PARTS:  # a reply's delivery; the SYN-ACK waits before a request
            if name in INDIRECT:
                continue  # heavy-tailed: judged apart, against its own spread (network_z), not the latency's
            now, stats = values.get(name), self.baseline_.stats().get(name)
            if now is not None and stats is not None:
                cost += max(0.0, now - stats.median)
        return cost

    def _decisive(self, values: dict[str, float | None], expected_mean: float, stalled: bool) -> bool:
        """One anomalous window opens a regression when the kernel measured the clients' extra wait itself: a delivery
        signal (a per-reply figure whose healthy spread is milliseconds, not a latency estimate from a window's ~20
        requests) moved by x2^strong_cause_score, or a count of stall events (connections that waited for a resent
        SYN-ACK) that the baseline's rate of them makes less likely than stall_event_alpha; and the network's part
        per request lies critical_score of its spreads above its baseline, or the server answered no scrape (a
        stall). A loss burst shorter than a window leaves one such window, and the k-of-m rule would need k
        (docs/detector.md)."""
        stats = self.baseline_.stats()
        if (direct_strength(values, stats, self._attributor()) < self.strong_cause_score
                and self.stall_event_chance(values) > self.stall_event_alpha):
            return False
        given = network_z(values, stats, expected_mean, self.min_log_scale)
        return stalled or (given is not None and given >= self.critical_score)

    def stall_event_chance(self, values: dict[str, float | None]) -> float:
        """The chance that a healthy window shows this window's count of stall events or more, given the baseline's
        events and trials (analysis/stall_events.py); the least over the kinds of event, 1 where none was counted."""
        best = 1.0
        for events, trials in stall_events.EVENTS:
            k, n = values.get(events), values.get(trials)
            if k is None or n is None or k < 1:
                continue
            base_k, base_n = stall_events.baseline_counts((r.signals for r in self.baseline_.rows), events, trials)
            best = min(best, stall_events.tail(int(k), n, base_k, base_n))
        return best

    def _stalled(self, f: Features) -> bool:
        """Far fewer requests finished than the baseline's usual count, or the server did not answer the scrape that
        counts them: a server (or its network) that stalls shows no latency, only silence, and a stopped or cut-off
        one answers nothing at all. Alone neither is a regression (clients may have left, a scrape may fail for its
        own reasons): update() asks for a strong cause beside it."""
        ns = [r.latency.n / (r.end - r.start) for r in self.baseline_.rows if r.end > r.start]
        if not ns:
            return False
        if f.requests is None:
            # Unread is not zero: nothing is known about this window's requests. Only a server that did not answer
            # at all (a timeout, a refused or reset connection; not a wrong answer or a source switched off) is
            # news, and no Poisson bound applies to it, so no minimum count.
            return f.latency_unanswered
        expected = median(ns) * f.duration
        return expected >= self.min_stall_requests and f.requests < self.stall_fraction * expected

    def _corroboration(self, values: dict[str, float | None]) -> float:
        """How far this window's strongest cause signal moved (its score, log2 of the ratio to the baseline), 0 when
        none passed the gates: corroboration that lets a smaller latency rise count."""
        stats = self.baseline_.stats()
        causes = self._attributor().rank({k: v for k, v in values.items() if k != "jsd"}, stats, values.get("jsd"),
                                         stats.get("jsd"), jsd_noise=self._jsd_noise(values.get("jsd_size")))
        return 0.0 if causes[0].label == "unknown" else max(causes[0].score, 1e-9)

    def _jsd_noise(self, size: float | None):
        """What a profile of `size` samples drawn from the baseline's own reads (analysis.sampling.jsd_noise), as a
        call made only when a shift passed the other gates; None without a size."""
        if size is None or not math.isfinite(size):
            return None
        return lambda: self.baseline_.jsd_noise(max(1, round(size)), self.min_cause_z)

    def _refit(self) -> None:
        rows = self.baseline_.latency_rows()
        model = ExpectedLatency(self.max_elasticity, self.tail_quantile, self.min_log_scale, self.load_allowance,
                                self.load_quantile, min_net_scale=self.min_net_scale).fit(rows)
        self.model_ = model
        self.since_refit_ = 0
        # The level the baseline's own windows score at under this fit: the score is not centred on 0 (the tail
        # count of a 10-request window is mostly 0, below its expectation), so a shift is measured from here.
        scores = [self._latency_z(r.mean, r.mean, r.n, r.buckets, r.cpu_wait, model.expected(r.rate, r.tpr)["mean"])
                  for r in rows if r.mean is not None and r.mean > 0 and r.n >= self.min_requests]
        self.score_ref_ = median(scores) if scores else 0.0

    def _learn_later(self, window: Window, f: Features, leaves: dict[str, float] | None, span: int = 1) -> None:
        self.pending_.append((self.baseline_.row(window.start, window.end, f, leaves, span), leaves))
        while len(self.pending_) > self.sustained_windows:
            row, row_leaves = self.pending_.popleft()
            self.baseline_.add_row(row, row_leaves)
            self.since_refit_ += 1
            if self.since_refit_ >= self.refit_every:
                self._refit()

    def _severity(self, f: Features, score: float | None, expected: dict[str, float]) -> str:
        if score is None:  # a stall: nothing finished at all, the worst latency there is
            return "critical"
        ratio = (f.mean_seconds or 0.0) / expected["mean"] if expected.get("mean") else 0.0
        return "critical" if score >= self.critical_score or ratio >= self.critical_ratio else "warning"

    def _attributor(self) -> Attributor:
        return Attributor(min_z=self.min_cause_z, min_ratio=self.min_cause_ratio, compute_weight=self.compute_weight,
                          lock_blocked_discount=self.lock_blocked_discount, profile_min_jsd=self.profile_min_jsd,
                          max_causes=self.max_causes)

    def _causes(self, samples: list[dict], window: Window) -> list[Cause]:
        family = [self._placed(c, samples) for c in self._ranked_causes(samples, window)]
        # Neighbours are named last: a member's own cpu_contention may replace the family's, and it needs them too.
        usual = self.baseline_.stats().get("io_pressure")
        usual_io = None if usual is None else usual.median
        # Neighbours are named from the whole open episode's culprits, the other causes from the windows ranked.
        who = [{"culprits": self.episode_culprits_}] if self.episode_culprits_ is not None else samples
        return [disk_writers.named(memory_growers.named(culprits.named(c, who), samples), samples, usual_io)
                for c in self._with_members(family, samples)]

    def _with_members(self, family: list[Cause], samples: list[dict]) -> list[Cause]:
        """The family's causes, each label replaced by the one a member's own signals show when that scores higher
        (a move in one process that the family's totals dilute; analysis.members.rank_in_members)."""
        inside = rank_in_members(samples, self.members_base_, self._attributor())
        if not inside:
            return family
        by_label = {c.label: c for c in family if c.label != "unknown"}
        for c in inside:
            if c.label not in by_label or c.score > by_label[c.label].score:
                by_label[c.label] = c
        ranked = sorted(by_label.values(), key=lambda c: (-c.score, c.label))[: self.max_causes]
        return ranked or family

    def _placed(self, cause: Cause, samples: list[dict]) -> Cause:
        """A family's cause with the member its evidence is in (analysis.members); others as they are."""
        found = locate(cause.label, samples, self.members_base_)
        if found is None:
            return cause
        return dataclasses.replace(cause, evidence=f"{cause.evidence}; {found.words(cause.label)}", pid=found.pid,
                                   process=found.role)

    def _ranked_causes(self, samples: list[dict], window: Window) -> list[Cause]:
        agg: dict[str, float | None] = {}
        for name in [s.name for s in SIGNALS] + ["jsd", "jsd_size"]:
            xs = [v[name] for v in samples if v.get(name) is not None and math.isfinite(v[name])]
            agg[name] = median(xs) if xs else None
        for sig in SIGNALS:
            # A per-tick signal's median is judged at the ticks of the windows' recordings, each counted once.
            if sig.per_tick and agg.get(sig.name) is not None and (c := pooled(sig.name, samples)) is not None:
                agg.update({TICKS.format(sig.name): c[1], EVENTS.format(sig.name): agg[sig.name] * c[1],
                            RECORDINGS.format(sig.name): c[2]})
        stats = self.baseline_.stats()
        not_measured: dict[str, str] = {}
        for label in {s.label for s in SIGNALS}:
            sigs = [s for s in SIGNALS if s.label == label]
            if all(agg.get(s.name) is None for s in sigs):
                not_measured[label] = "; ".join(sorted({f"{s.source}: {window.errors.get(s.source, 'no reading')}"
                                                        for s in sigs}))
        causes = self._attributor().rank({k: v for k, v in agg.items() if k != "jsd"}, stats, agg.get("jsd"),
                                         stats.get("jsd"), not_measured, self._jsd_noise(agg.get("jsd_size")))
        if causes[0].label != "unknown" or not samples:
            return causes
        # No signal's median moved past the per-window gates: a small shift may still persist in every window
        # (the sustained test's evidence), allowing the same number of misses as that test; one window above its
        # usual high is no persistence, so at least two.
        allowed_misses = self.sustained_windows - self.sustained_min_windows
        if len(samples) < 2:
            return causes
        persistent = self._attributor().rank_persistent(samples, stats, max(2, len(samples) - allowed_misses),
                                                        self.sustained_change_fraction, self.sustained_min_z,
                                                        not_measured, noise_floor=False)
        if persistent[0].label != "unknown":
            return persistent
        # Nor by persisting: the direct evidence of an outside CPU hog, the stall and the neighbour behind it.
        found = self._contention(samples, max(2, len(samples) - allowed_misses))
        return causes if found is None else [found]

    def _functions(self) -> list[FunctionShift]:
        if not self.episode_leaves_ or not self.baseline_.profile:
            return []
        return top_shifts(self.baseline_.profile, self.episode_leaves_, self.max_functions)

    def _open(self, window: Window, f: Features, score: float | None, expected: dict[str, float],
              samples: list[dict] | None = None, leaves: list[dict[str, float]] | None = None) -> Regression:
        self.pending_.clear()  # the windows before the opening were its onset, not healthy traffic
        self.episode_values_.clear()
        if samples is not None:
            self.episode_values_.extend(samples)
        else:
            self.episode_values_.extend({k: v for k, v in run.items() if k != "leaves"} for run in self.run_)
        self.episode_culprits_ = culprits.pooled(samples or list(self.episode_values_))
        self.episode_leaves_ = {}
        for window_leaves in ([run.get("leaves", {}) for run in self.run_] if leaves is None else leaves):
            merge(self.episode_leaves_, window_leaves)
        self.calm_ = 0
        self._forget_move()
        rid = f"{window.target}-{int(window.end)}"
        if self.last_id_ is not None and self.last_id_.startswith(rid):
            rid = f"{window.target}-{window.end:.3f}"
        self.last_id_ = rid
        self.episode_ = Regression(id=rid, target=window.target, pid=window.pid, opened_at=window.end,
                                   severity=self._severity(f, score, expected),
                                   score=self.critical_score if score is None else score,
                                   causes=self._causes(samples or list(self.episode_values_), window),
                                   functions=self._functions(), baseline_start=self.baseline_.start,
                                   baseline_end=self.baseline_.end)
        self.named_for_ = self.episode_.top_cause
        self.named_causes_ = list(self.episode_.causes)
        return self.episode_

    def _cause_moved(self, causes: list[Cause], leaves: dict[str, float] | None) -> bool:
        """True when, for cause_change_windows windows in a row, the causes name the same other cause first and no
        longer the episode's first named cause: its evidence is gone, not merely outranked (two faults at once stay
        one regression), and what replaced it is one cause, not each window's noise. An episode opened as `unknown`
        that finds its cause later is the same regression, named. The regression that then closes keeps the causes
        it had while its cause still led them (named_causes_), not the next one's."""
        top = causes[0].label if causes else "unknown"
        if self.named_for_ == "unknown":
            self.named_for_ = top
        still_named = any(c.label == self.named_for_ for c in causes)
        if top == self.named_for_:
            # Only a ranking its cause still leads: one that a second cause already leads would close this regression
            # under the next one's name (packet loss that gave way to stops, told as `blocked`).
            self.named_causes_ = list(causes)
        if still_named or top == "unknown":
            self._forget_move()
            return False
        if top != self.moved_to_:
            self._forget_move()
            self.moved_to_ = top
        self.moved_ += 1
        self.moved_leaves_.append(dict(leaves or {}))
        del self.moved_leaves_[:-self.attribution_windows]  # as many as the causes are ranked on
        return self.moved_ >= self.cause_change_windows

    def _forget_move(self) -> None:
        """No cause change under way: the count of windows that named another cause starts again."""
        self.moved_ = 0
        self.moved_leaves_ = []

    def _rerank(self, reg: Regression, window: Window, f: Features, score: float | None,
                expected: dict[str, float]) -> Regression:
        severity = "critical" if reg.severity == "critical" else self._severity(f, score, expected)
        causes = self._causes(list(self.episode_values_), window)
        if causes[0].label == "unknown" and reg.causes and reg.causes[0].label != "unknown":
            # The latest windows moved too little to name a cause again: that is not evidence the cause went away
            # (a small shift named by persisting needs more windows than these), so the named causes stand.
            causes = reg.causes
        return dataclasses.replace(reg, severity=severity, score=max(reg.score, self.critical_score if score is None
                                                                     else score),
                                   causes=causes, functions=self._functions())
