"""Expected latency for the current load, fitted on baseline windows, and the residual tests of one window."""

from __future__ import annotations

import functools
import importlib
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from analysis.robust import mad_sigma, median

# The model's fits are a few hundred rows by two columns: a second BLAS thread never pays for itself, and OpenBLAS's
# idle threads spin on the other cores after every call. One BLAS thread for numpy's BLAS here, and for scipy's when
# scikit-learn loads it (`_huber_class`): the detector's CPU over the `recorded` replay 6.9 s -> 1.9 s on this 2-core
# host (docs/BENCHMARKS.md, "One BLAS thread").
threadpool_limits(limits=1, user_api="blas")


# scikit-learn's import in steps, largest parts first (what `sklearn.linear_model` imports anyway, in this order):
# between two steps the agent gives back the library pages the last one touched only to load (agent/memory.py).
IMPORT_STEPS = ("scipy.linalg", "scipy.sparse", "scipy.special", "scipy.optimize", "scipy.stats", "sklearn.base")
_import_step: Callable[[], object] | None = None


def set_import_step(step: Callable[[], object] | None) -> None:
    """Call `step()` after each of IMPORT_STEPS when scikit-learn loads (process-wide; None: import in one go)."""
    global _import_step
    _import_step = step


@functools.cache
def _huber_class() -> type:
    """scikit-learn's HuberRegressor, imported at the first fit rather than with this module. scikit-learn with the
    scipy it loads is ~90 MiB of the agent's memory, and the agent imports this module (through the page's change
    report) before it compiles its BPF programs, whose compiler holds ~80 MiB more for a moment: imported at start,
    the two stacked to a 257 MiB peak (docs/BENCHMARKS.md, "Memory"). With an import step set (the agent's), the
    import's own peak is ~20 MiB lower: the file pages each step touched leave before the next step's arrive."""
    step = _import_step
    if step is not None:
        for name in IMPORT_STEPS:
            importlib.import_module(name)
            step()
    from sklearn.linear_model import HuberRegressor

    threadpool_limits(limits=1, user_api="blas")  # scipy's own BLAS, loaded just now
    return HuberRegressor


# Load inputs of the model, as logs so the fit is a power law (latency ~ rate^a * tokens^b). Both are
# offered load: queue length and running batch are left out on purpose, they grow *because* a server
# slowed down and would explain a regression away (docs/detector.md).
LOAD_INPUTS = ("rate", "tpr")
TARGETS = ("mean", "p50", "p99")


@dataclass(frozen=True)
class Row:
    """What the latency model keeps of one baseline window."""

    n: float
    rate: float | None
    tpr: float | None
    mean: float | None
    p50: float | None
    p99: float | None
    buckets: tuple[tuple[float, float], ...]
    # Seconds per request the server's threads spent runnable but not running (Little's law: run-queue s/s over
    # requests/s); None where the run queue was not measured.
    cpu_wait: float | None = None


def exceed_count(buckets: tuple[tuple[float, float], ...], threshold: float) -> float:
    """Requests above threshold, interpolating linearly inside the bucket that straddles it (as histogram_quantile)."""
    above, lower = 0.0, 0.0
    for upper, count in buckets:
        if count > 0:
            if math.isinf(upper) or threshold <= lower:
                above += count
            elif threshold < upper:
                above += count * (upper - threshold) / (upper - lower)
        lower = upper
    return above


def _quantile_bound(pooled: list[tuple[float, float]], q: float) -> float:
    """The value below which a fraction q of pooled (bound, count) mass lies, interpolated in normalised space."""
    total = sum(c for _, c in pooled)
    target, seen, lower = q * total, 0.0, 0.0
    for upper, count in pooled:
        if seen + count >= target and count > 0:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (target - seen) / count
        seen += count
        lower = upper
    return lower


class ExpectedLatency:
    """Huber fits of log latency on log load; residual centre and per-request scale; the tail threshold."""

    def __init__(self, max_elasticity: float = 2.0, tail_quantile: float = 0.9, min_log_scale: float = 0.05,
                 load_allowance: float = 1.0, load_quantile: float = 0.9, min_net_rows: int = 6,
                 min_net_scale: float = 0.2) -> None:
        self.min_net_scale = min_net_scale
        self.min_net_rows = min_net_rows
        self.max_elasticity = max_elasticity
        self.load_quantile = load_quantile
        self.load_allowance = load_allowance
        self.tail_quantile = tail_quantile
        self.min_log_scale = min_log_scale

    def fit(self, rows: list[Row]) -> ExpectedLatency:
        rows = [r for r in rows if r.mean is not None and r.mean > 0 and r.n > 0]
        if len(rows) < 3:
            raise ValueError(f"the latency model needs at least 3 windows with requests, got {len(rows)}")
        self.inputs_ = [name for name in LOAD_INPUTS
                        if sum(getattr(r, name) is not None and getattr(r, name) > 0 for r in rows) >= len(rows) / 2]
        self.fill_ = {name: median(getattr(r, name) for r in rows if getattr(r, name) and getattr(r, name) > 0)
                      for name in self.inputs_}
        x = self._design(rows)
        # The highest load the baseline routinely saw: within it the fit speaks, beyond it the allowance does.
        self.load_ref_ = np.quantile(x, self.load_quantile, axis=0) if len(self.inputs_) else np.zeros(0)
        self.coef_: dict[str, np.ndarray] = {}
        self.intercept_: dict[str, float] = {}
        for target in TARGETS:
            pairs = [(i, math.log(getattr(r, target))) for i, r in enumerate(rows)
                     if getattr(r, target) is not None and getattr(r, target) > 0]
            if len(pairs) < 3:
                continue
            idx = [i for i, _ in pairs]
            y = np.array([v for _, v in pairs])
            self.coef_[target], self.intercept_[target] = self._fit_one(x[idx], y)
        # Residuals of the mean scaled by sqrt(requests): a window's mean of n requests varies as 1/sqrt(n).
        res = [(math.log(r.mean) - self._predict_log("mean", x[i]), r.n) for i, r in enumerate(rows)]
        self.center_ = median(e for e, _ in res)
        self.typical_n_ = median(r.n for r in rows)
        self.unit_scale_ = mad_sigma((e - self.center_) * math.sqrt(n) for e, n in res)
        # Latency net of CPU waits, in units of the expected mean: on a shared host most of the baseline's spread is
        # time spent waiting for a CPU, which the run queue measures; what is left is the server's own time.
        net = [((r.mean - r.cpu_wait) / math.exp(self._predict_log("mean", x[i])), r.n) for i, r in enumerate(rows)
               if r.cpu_wait is not None]
        self.net_center_: float | None = None
        self.net_unit_scale_ = 0.0
        if len(net) >= self.min_net_rows:
            self.net_center_ = median(v for v, _ in net)
            self.net_unit_scale_ = mad_sigma((v - self.net_center_) * math.sqrt(n) for v, n in net)
        # Tail: pool every baseline histogram in units of its window's expected mean, take its q-quantile.
        pooled: dict[float, float] = {}
        scaled_rows = []
        for i, r in enumerate(rows):
            scale = math.exp(self._predict_log("mean", x[i]))
            norm = tuple((u / scale if not math.isinf(u) else u, c) for u, c in r.buckets)
            scaled_rows.append(norm)
            for u, c in norm:
                pooled[u] = pooled.get(u, 0.0) + c
        self.tail_bound_: float | None = None
        self.dispersion_ = 1.0
        if sum(pooled.values()) > 0:
            self.tail_bound_ = _quantile_bound(sorted(pooled.items()), self.tail_quantile)
            p0 = 1 - self.tail_quantile
            chis = [(exceed_count(b, self.tail_bound_) - n * p0) ** 2 / (n * p0 * (1 - p0))
                    for b, n in ((b, sum(c for _, c in b)) for b in scaled_rows) if n > 0]
            # Requests in one window share batches, so they are not independent: widen the binomial by the
            # baseline's own over-dispersion (median chi-square over its median under independence, 0.455).
            if chis:
                self.dispersion_ = max(1.0, median(chis) / 0.455)
        return self

    def _design(self, rows: list[Row]) -> np.ndarray:
        cols = [[math.log(getattr(r, n) if getattr(r, n) and getattr(r, n) > 0 else self.fill_[n]) for n in self.inputs_]
                for r in rows]
        return np.array(cols, dtype=float).reshape(len(rows), len(self.inputs_))

    def _fit_one(self, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
        coef = np.zeros(x.shape[1])
        # A load input that did not vary in the baseline says nothing about its slope (it is the intercept):
        # its elasticity stays 0 and only the load allowance speaks for it.
        varied = x.std(axis=0) > 1e-6
        if varied.any():
            model = _huber_class()(max_iter=200)
            with warnings.catch_warnings():
                from sklearn.exceptions import ConvergenceWarning

                warnings.simplefilter("ignore", ConvergenceWarning)
                model.fit(x[:, varied], y)
            # Latency does not fall as offered load rises, and a short warm-up cannot support a steep slope:
            # clamp each elasticity into [0, max_elasticity] and re-centre the intercept robustly.
            coef[varied] = np.clip(model.coef_, 0.0, self.max_elasticity)
        return coef, float(np.median(y - x @ coef))

    def _predict_log(self, target: str, xrow: np.ndarray) -> float:
        return float(self.intercept_[target] + xrow @ self.coef_[target])

    def expected(self, rate: float | None, tpr: float | None) -> dict[str, float]:
        """Expected latency in seconds for this load: keys of TARGETS that the baseline could fit.

        A steady baseline cannot show how latency grows with load (its slope fits to ~0), so load beyond the
        baseline's load_quantile may raise the expectation by up to (load / that load) ** load_allowance over
        the fit there; lower load never lowers it. A benign load step then does not read as a regression.
        """
        xrow = self._design([Row(n=1, rate=rate, tpr=tpr, mean=None, p50=None, p99=None, buckets=())])[0]
        out = {}
        for t in self.coef_:
            fitted = self._predict_log(t, xrow)
            allowed = self._predict_log(t, self.load_ref_) + self.load_allowance * float(
                np.maximum(xrow - self.load_ref_, 0.0).sum())
            out[t] = math.exp(max(fitted, allowed))
        return out

    def z_mean(self, mean: float, n: float, expected_mean: float) -> float:
        """Robust z of this window's log mean latency against the expectation, scaled for its request count."""
        # Fewer requests than a typical baseline window: wider. More: no narrower than a typical window, because
        # requests that share batches and a busy host are not independent, so noise does not shrink as 1/sqrt(n).
        scale = max(self.unit_scale_ / math.sqrt(min(n, self.typical_n_)), self.min_log_scale)
        return (math.log(mean) - math.log(expected_mean) - self.center_) / scale

    def z_net(self, mean: float, cpu_wait: float | None, n: float, expected_mean: float) -> float | None:
        """Robust z of this window's latency net of CPU waits, against the baseline's, in units of the expected mean;
        None when the run queue was not measured here or in enough baseline windows."""
        if cpu_wait is None or self.net_center_ is None:
            return None
        scale = max(self.net_unit_scale_ / math.sqrt(min(n, self.typical_n_)), self.min_net_scale)
        return ((mean - cpu_wait) / expected_mean - self.net_center_) / scale

    def z_tail(self, buckets: tuple[tuple[float, float], ...], expected_mean: float) -> float | None:
        """Over-dispersed binomial z of how many requests passed the baseline's tail bound scaled to this load."""
        n = sum(c for _, c in buckets)
        if self.tail_bound_ is None or n <= 0:
            return None
        p0 = 1 - self.tail_quantile
        k = exceed_count(buckets, self.tail_bound_ * expected_mean)
        # As in z_mean: a window larger than the typical baseline window is not trusted more than one.
        n_eff = min(n, self.typical_n_)
        return (k / n - p0) * math.sqrt(n_eff) / math.sqrt(self.dispersion_ * p0 * (1 - p0))
