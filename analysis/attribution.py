"""Attribution: rank the causes of a regression by how far each cause's signal moved from its baseline."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from analysis.cause_signals import SIGNALS, Signal, tail_center, tail_sigma
from analysis.network_evidence import delivery_words
from analysis.regression import Cause
from analysis.robust import median, robust_z
from analysis.sampling import beyond_noise, counts, noise_sigma, pooled


@dataclass(frozen=True)
class SignalStats:
    """A signal's baseline: median, MAD-sigma, how many baseline windows measured it, its high quantile (the
    value few healthy windows exceed; None when not computed) and its mean (a per-tick signal's rate, which the
    median of sparse counts is not: analysis.sampling; None when not computed)."""

    median: float
    sigma: float
    count: int
    high: float | None = None
    mean: float | None = None


@dataclass(frozen=True)
class Moved:
    signal: Signal
    value: float
    baseline: float
    ratio: float
    z: float

    @property
    def score(self) -> float:
        return math.log2(self.ratio)


def _fmt(value: float, sig: Signal) -> str:
    v = value * sig.scale
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def evidence(m: Moved) -> str:
    s = m.signal
    unit = f" {s.unit}" if s.unit else ""  # a share has none
    floored = f" against the {_fmt(s.floor, s)}{unit} floor" if m.baseline < s.floor else ""
    return (f"{s.what} {_fmt(m.value, s)}{unit} vs {_fmt(m.baseline, s)}{unit} baseline "
            f"(x{m.ratio:.3g}{floored}, z {m.z:.1f})")


class Attributor:
    """Compares a regression's signal values with the baseline; parameters only, stateless between calls."""

    def __init__(self, min_z: float = 3.0, min_ratio: float = 1.5, compute_weight: float = 0.5,
                 lock_blocked_discount: float = 0.5, profile_min_jsd: float = 0.1, max_causes: int = 4) -> None:
        self.min_z = min_z
        self.min_ratio = min_ratio
        self.compute_weight = compute_weight
        self.lock_blocked_discount = lock_blocked_discount
        self.profile_min_jsd = profile_min_jsd
        self.max_causes = max_causes

    def moved(self, sig: Signal, value: float | None, stats: SignalStats | None,
              ticks: tuple[float, float, int] | None = None) -> Moved | None:
        """The signal's move when it passes every gate (absolute change, z, ratio; and for a per-tick signal read
        from `ticks` = (events, ticks, recordings), its sampling noise: analysis.sampling), else None."""
        if value is None or stats is None or not math.isfinite(value):
            return None
        center = tail_center(sig, stats.median, stats.high)
        base = max(center, sig.floor)
        ratio = value / base
        # The sigma floor is a quarter of min_change so a flat baseline cannot make noise look significant.
        sigma = max(tail_sigma(sig, stats.median, stats.sigma, stats.high), self._noise_sigma(sig, stats, ticks))
        z = robust_z(value, center, sigma, sig.min_change / 4)
        if value - center < sig.min_change or z < self.min_z or ratio < self.min_ratio:
            return None
        if not self._beyond_noise(sig, stats, ticks):
            return None
        return Moved(sig, value, center, ratio, z)

    def _beyond_noise(self, sig: Signal, stats: SignalStats, ticks: tuple[float, float, int] | None) -> bool:
        """A per-tick signal's count lies beyond the chance of the baseline's rate at its ticks (analysis.sampling);
        True for other signals and where the ticks or the rate are unknown."""
        if not sig.per_tick or ticks is None or stats.mean is None:
            return True
        return beyond_noise(ticks[0], ticks[1], stats.mean, self.min_z)

    @staticmethod
    def _noise_sigma(sig: Signal, stats: SignalStats, ticks: tuple[float, float, int] | None) -> float:
        """A per-tick signal's spread per recording at the baseline's rate and the recordings' ticks (a floor under
        its MAD-sigma, which sparse counts collapse to 0: analysis.sampling); 0 for other signals or unknown ticks."""
        if not sig.per_tick or ticks is None or stats.mean is None:
            return 0.0
        return noise_sigma(stats.mean, ticks[1] / max(ticks[2], 1))

    def rank(self, values: Mapping[str, float | None], stats: Mapping[str, SignalStats | None],
             jsd: float | None = None, jsd_stats: SignalStats | None = None,
             not_measured: Mapping[str, str] | None = None,
             jsd_noise: Callable[[], float | None] | None = None) -> list[Cause]:
        """Ranked causes, best first; a single `unknown` when nothing moved (its evidence names what was not measured).
        A per-tick signal is judged at the ticks `values` holds for it (analysis.sampling.counts); `jsd_noise`, when
        given, says what an unchanged profile reads at the shift's sample size (analysis.sampling.jsd_noise)."""
        best: dict[str, tuple[float, Moved]] = {}
        for sig in SIGNALS:
            self._keep(best, self.moved(sig, values.get(sig.name), stats.get(sig.name),
                                        counts(sig.name, values) if sig.per_tick else None))
        causes = self._causes(best, lambda m: evidence(m))
        self._add_profile(causes, jsd, jsd_stats, jsd_noise)
        if "network" in causes and (words := delivery_words(values, stats)) is not None:
            c = causes["network"]
            causes["network"] = Cause("network", c.score, f"{words}; {c.evidence}", c.value, c.baseline)
        return self._ranked(causes, not_measured)

    def persistent(self, sig: Signal, samples: Sequence[float | None], stats: SignalStats | None,
                   min_windows: int, change_fraction: float, min_z: float,
                   ticks: tuple[float, float, int] | None = None,
                   noise_floor: bool = True) -> tuple[Moved, int] | None:
        """The signal's move when it stayed above the baseline's high quantile (and change_fraction of its
        min_change above the median) in at least min_windows of the samples, and their median passes the ratio
        gate and lies min_z baseline sigmas above the baseline's median; with the count of windows above.

        A per-window move too small for `moved` shows here by persisting: healthy windows exceed the high quantile
        one time in ten, several in a row hardly ever. The z gate keeps it to baselines quiet enough to tell a small
        shift from drift: on a host where other tenants make the signal wander, only the per-window gates speak.
        A per-tick signal's windows often carry one recording's reading (three windows, one measurement): its count
        pooled over the distinct recordings (`ticks`) must also lie beyond sampling noise (analysis.sampling).

        To open a regression on persistence (noise_floor), the z gate's spread is also at least one recording's
        sampling noise: min_z of it asks far more than the Poisson tail does, as a latency shift that only a sparse
        count explains should. To name an episode that its latency has opened already (noise_floor False), the
        question is which cause, and the pooled count's Poisson tail at the attribution's z is the sampling noise's
        whole test: one recording's spread at min_z would ask ~1e-9 of a median that several recordings back, which
        a lock's few waits per recording can never give (a lock after a gc fault in tests/scenarios/variants waited
        for 5 windows of it)."""
        if stats is None or stats.high is None:
            return None
        xs = [x for x in samples if x is not None and math.isfinite(x)]
        if len(xs) < min_windows:
            return None
        above = sum(x > stats.high and x - stats.median >= sig.min_change * change_fraction for x in xs)
        value = median(xs)
        ratio = value / max(stats.median, sig.floor)
        if above < min_windows or ratio < self.min_ratio:
            return None
        sigma = max(stats.sigma, self._noise_sigma(sig, stats, ticks)) if noise_floor else stats.sigma
        z = robust_z(value, stats.median, sigma, sig.min_change * change_fraction / 4)
        if z < min_z or not self._beyond_noise(sig, stats, ticks):
            return None
        return Moved(sig, value, stats.median, ratio, z), above

    def rank_persistent(self, samples: Sequence[Mapping[str, float | None]], stats: Mapping[str, SignalStats | None],
                        min_windows: int, change_fraction: float, min_z: float,
                        not_measured: Mapping[str, str] | None = None, noise_floor: bool = True) -> list[Cause]:
        """As rank, for a run of windows: the signals that moved by persisting (see `persistent`, and there for
        noise_floor), ranked by their log ratio; a single `unknown` when none did."""
        best: dict[str, tuple[float, Moved]] = {}
        counts: dict[str, int] = {}
        for sig in SIGNALS:
            hit = self.persistent(sig, [s.get(sig.name) for s in samples], stats.get(sig.name), min_windows,
                                  change_fraction, min_z, pooled(sig.name, samples) if sig.per_tick else None,
                                  noise_floor)
            if hit is not None:
                counts[sig.name] = hit[1]
                self._keep(best, hit[0])
        n = len(samples)
        causes = self._causes(best, lambda m: (f"{evidence(m)}, above the baseline's usual high "
                                               f"({_fmt(stats[m.signal.name].high, m.signal)} {m.signal.unit}) in "
                                               f"{counts[m.signal.name]} of {n} windows"))
        return self._ranked(causes, not_measured)

    def _keep(self, best: dict[str, tuple[float, Moved]], m: Moved | None) -> None:
        if m is None:
            return
        score = m.score * (self.compute_weight if m.signal.label == "compute" else 1.0)
        if m.signal.label not in best or score > best[m.signal.label][0]:
            best[m.signal.label] = (score, m)

    def _causes(self, best: dict[str, tuple[float, Moved]], words: Callable[[Moved], str]) -> dict[str, Cause]:
        causes: dict[str, Cause] = {}
        for label, (score, m) in best.items():
            causes[label] = Cause(label=label, score=round(score, 4), evidence=words(m), value=m.value,
                                  baseline=m.baseline)
        # py-spy sees threads waiting in their own code whatever they wait on; when the kernel says the new
        # waits are sleeps, disk or a stop (blocked moved), that waiting is not evidence of a lock.
        if "lock" in causes and "blocked" in causes and best["lock"][1].signal.name == "app_wait":
            c = causes["lock"]
            causes["lock"] = Cause("lock", round(c.score * self.lock_blocked_discount, 4), c.evidence, c.value, c.baseline)
        # Run-queue wait per CPU second is the witness of contention only while the server's own work per token is
        # unchanged: a server that needs k times the CPU per token queues behind its own extra work about k times
        # as long. So contention keeps only the run-queue growth beyond the growth of CPU per token (log ratios).
        if "cpu_contention" in causes and "compute" in causes and best["cpu_contention"][1].signal.name == "runqueue":
            c = causes["cpu_contention"]
            own = best["compute"][1].score  # log2 of the CPU-per-token ratio, before compute_weight
            causes["cpu_contention"] = Cause("cpu_contention", round(max(c.score - own, 0.0), 4),
                                             f"{c.evidence}; less CPU per token x{2 ** own:.3g}", c.value, c.baseline)
        return causes

    def _ranked(self, causes: dict[str, Cause], not_measured: Mapping[str, str] | None) -> list[Cause]:
        ranked = sorted(causes.values(), key=lambda c: (-c.score, c.label))[: self.max_causes]
        if ranked:
            return ranked
        missing = "; ".join(f"{k}: {v}" for k, v in sorted((not_measured or {}).items()))
        text = "latency regressed and no measured signal moved beyond its baseline"
        return [Cause("unknown", 0.0, text + (f" (not measured: {missing})" if missing else ""))]

    def _add_profile(self, causes: dict[str, Cause], jsd: float | None, jsd_stats: SignalStats | None,
                     jsd_noise: Callable[[], float | None] | None = None) -> None:
        if jsd is None or jsd_stats is None or jsd < self.profile_min_jsd:
            return
        base = max(jsd_stats.median, 0.01)
        z = robust_z(jsd, jsd_stats.median, jsd_stats.sigma, 0.02)
        if z < self.min_z or jsd / base < self.min_ratio:
            return
        # What a draw of as many samples from the baseline's own profile reads: a shift within it is sampling noise.
        if jsd_noise is not None and (noise := jsd_noise()) is not None and jsd <= noise:
            return
        score = round(math.log2(jsd / base) * self.compute_weight, 4)
        text = f"Python profile shift (Jensen-Shannon) {jsd:.2f} vs {jsd_stats.median:.2f} baseline (z {z:.1f})"
        old = causes.get("compute")
        if old is None:
            causes["compute"] = Cause("compute", score, text, jsd, jsd_stats.median)
        elif score > old.score:
            causes["compute"] = Cause("compute", score, f"{text}; {old.evidence}", jsd, jsd_stats.median)
        else:
            causes["compute"] = Cause("compute", old.score, f"{old.evidence}; {text}", old.value, old.baseline)
