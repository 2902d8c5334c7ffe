"""Profile shift: leaf-function distributions of Python stacks, their Jensen-Shannon divergence, and what grew."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from analysis.regression import FunctionShift

_LINE = re.compile(r":\d+\)$")


def leaf_function(stack: str) -> str:
    """The leaf frame of a folded py-spy stack without its line number: 'func (file.py)'."""
    return _LINE.sub(")", stack.rsplit(";", 1)[-1])


def leaf_counts(stacks: Mapping[str, int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for stack, n in stacks.items():
        key = leaf_function(stack)
        out[key] = out.get(key, 0.0) + float(n)
    return out


def normalise(counts: Mapping[str, float]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items() if v > 0} if total > 0 else {}


def jensen_shannon(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """Jensen-Shannon divergence in bits (0 = same distribution, 1 = disjoint); inputs need not be normalised."""
    p, q = normalise(p), normalise(q)
    if not p or not q:
        raise ValueError("Jensen-Shannon divergence needs two non-empty distributions")
    js = 0.0
    for key in set(p) | set(q):
        a, b = p.get(key, 0.0), q.get(key, 0.0)
        m = (a + b) / 2
        if a > 0:
            js += 0.5 * a * math.log2(a / m)
        if b > 0:
            js += 0.5 * b * math.log2(b / m)
    return min(max(js, 0.0), 1.0)


def jensen_shannon_of_share(p: Mapping[str, float], counts: Mapping[str, float], size: int) -> float:
    """The Jensen-Shannon divergence (bits) between p and a random `size` of the samples in `counts`, expected over
    every such draw without replacement: what a recording holding `size` of those samples would read.

    The divergence of a sample from its own distribution shrinks as the sample grows (a few samples fall on few
    functions), so a profile shift measured on a recording that spans several windows reads lower than the same
    shift on one window's recording. Exact: the divergence is a sum over functions of a term in that function's two
    shares, so its expectation is the sum of each term's expectation over the hypergeometric count of that function
    in the draw. At `size` >= the samples held it is the divergence of `counts` itself."""
    p = normalise(p)
    held = {k: round(v) for k, v in counts.items() if round(v) > 0}
    n = sum(held.values())
    if not p or n == 0:
        raise ValueError("Jensen-Shannon divergence needs two non-empty distributions")
    if size >= n:
        return jensen_shannon(p, held)
    size = max(size, 1)
    # Functions of p absent from the samples are absent from every draw: each adds p/2 bits.
    js = 0.5 * sum(v for k, v in p.items() if k not in held)
    log_total = _log_comb(n, size)
    for key, x_held in held.items():
        b = p.get(key, 0.0)
        for x in range(max(0, size - (n - x_held)), min(x_held, size) + 1):
            weight = math.exp(_log_comb(x_held, x) + _log_comb(n - x_held, size - x) - log_total)
            js += weight * _term(x / size, b)
    return min(max(js, 0.0), 1.0)


def _term(a: float, b: float) -> float:
    """One function's part of the Jensen-Shannon divergence (bits), its shares a and b."""
    m = (a + b) / 2
    return (0.5 * a * math.log2(a / m) if a > 0 else 0.0) + (0.5 * b * math.log2(b / m) if b > 0 else 0.0)


def _log_comb(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def top_shifts(baseline: Mapping[str, float], current: Mapping[str, float], limit: int = 10,
               min_delta: float = 0.02) -> list[FunctionShift]:
    """Functions whose share of samples grew most, largest growth first; growth below min_delta is left out."""
    p, q = normalise(baseline), normalise(current)
    shifts = [FunctionShift(function=k, baseline_share=p.get(k, 0.0), current_share=q.get(k, 0.0)) for k in q]
    grown = [s for s in shifts if s.delta >= min_delta]
    return sorted(grown, key=lambda s: (-s.delta, s.function))[:limit]


def merge(into: dict[str, float], counts: Mapping[str, float], decay: float = 1.0) -> None:
    """Add counts into a running distribution, first scaling what is there by decay (1 = plain sum)."""
    if decay != 1.0:
        for k in list(into):
            into[k] *= decay
            if into[k] < 1e-6:
                del into[k]
    for k, v in counts.items():
        into[k] = into.get(k, 0.0) + v
