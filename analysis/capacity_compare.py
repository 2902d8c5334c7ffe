"""Before/after comparison of two load tests, with run-to-run noise measured from their repeated steps."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from analysis.capacity import Knee, Slo, StepFigures, find_knee, verdict

NOISE_FIGURES = ("achieved_rps", "tokens_per_s", "client_p95_s", "error_rate")
NOISE_MARGIN = 2.0  # a difference must exceed twice the larger run's measured noise
RELATIVE_FLOOR = 0.05  # below 5 % no two runs on a shared host are told apart, whatever the repeats said
ERROR_RATE_FLOOR = 0.01  # absolute: one error in a hundred requests


def _value(step: StepFigures, figure: str) -> float | None:
    return step.error_rate if figure == "error_rate" else getattr(step, figure)


def measure_noise(steps: list[StepFigures]) -> dict[str, float | None]:
    """Largest disagreement between a step and its repeat, per figure: relative, except error rate (absolute)."""
    by_index = {s.index: s for s in steps}
    out: dict[str, float | None] = {f: None for f in NOISE_FIGURES}
    for rep in steps:
        orig = by_index.get(rep.repeat_of) if rep.repeat_of is not None else None
        if orig is None:
            continue
        for figure in NOISE_FIGURES:
            a, b = _value(orig, figure), _value(rep, figure)
            if a is None or b is None:
                continue
            if figure == "error_rate":
                spread = abs(a - b)
            else:
                mean = (abs(a) + abs(b)) / 2
                spread = abs(a - b) / mean if mean else 0.0
            prev = out[figure]
            out[figure] = spread if prev is None else max(prev, spread)
    return out


@dataclass
class Run:
    """What compare needs of one load test report."""

    name: str
    slo: Slo
    steps: list[StepFigures]
    noise: dict[str, float | None] = field(default_factory=dict)

    @property
    def schedule(self) -> list[StepFigures]:
        return sorted((s for s in self.steps if s.repeat_of is None), key=lambda s: s.offered_rps)

    def knee(self) -> Knee:
        return find_knee(self.steps, self.slo)

    def step(self, index: int | None) -> StepFigures | None:
        return next((s for s in self.steps if s.index == index), None)

@dataclass
class Row:
    figure: str
    unit: str
    before: float | None
    after: float | None
    noise: float | None  # relative (or absolute for error rate), the larger of the two runs'
    threshold: float | None  # the difference that counts as real, in the figure's own unit
    beyond_noise: bool | None  # None: one side not measured, or bounds that cannot be told apart
    note: str = ""
    # "=" a measured value; ">=" every step met the SLO (a lower bound); "<" no step did (an upper bound).
    before_bound: str = "="
    after_bound: str = "="
    # Capacity rows: where each run's capacity lies, [low, high) with high None for no upper bound.
    before_range: tuple[float, float | None] | None = None
    after_range: tuple[float, float | None] | None = None

    @property
    def delta(self) -> float | None:
        return None if self.before is None or self.after is None else self.after - self.before

    @property
    def delta_pct(self) -> float | None:
        d = self.delta
        return None if d is None or not self.before else 100.0 * d / abs(self.before)


@dataclass
class Comparison:
    before: str
    after: str
    rows: list[Row]
    equal_load_rps: float | None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        real = [r.figure for r in self.rows if r.beyond_noise]
        if real:
            return "difference beyond noise in: " + ", ".join(real)
        if any(r.beyond_noise is None for r in self.rows):
            return "no difference beyond noise in what both runs measured"
        return "no difference beyond noise"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for row, data in zip(self.rows, out["rows"], strict=True):
            data["delta"], data["delta_pct"] = row.delta, row.delta_pct
        out["verdict"] = self.verdict
        return out


def _larger(a: float | None, b: float | None) -> float | None:
    vals = [v for v in (a, b) if v is not None]
    return max(vals) if vals else None


def _relative_row(figure: str, unit: str, before: float | None, after: float | None, noise: float | None,
                  extra: float = 0.0, note: str = "") -> Row:
    if before is None or after is None:
        return Row(figure, unit, before, after, noise, None, None, note or "not measured in both runs")
    rel = max(NOISE_MARGIN * (noise or 0.0), RELATIVE_FLOOR)
    threshold = max(rel * abs(before), extra)
    if noise is None:
        note = "; ".join(p for p in (note, "no repeated step: noise unknown, 5% floor used") if p)
    return Row(figure, unit, before, after, noise, threshold, abs(after - before) > threshold, note)


def _equal_load(a: Run, b: Run) -> float | None:
    """The before run's knee rate when the after run stepped through it (how the change fares at today's
    capacity); else the highest common rate where both met the SLO; else the lowest common rate."""
    rates_a = {s.offered_rps: s for s in a.schedule}
    rates_b = {s.offered_rps: s for s in b.schedule}
    knee = a.step(a.knee().last_good)
    if knee is not None and knee.offered_rps in rates_b:
        return knee.offered_rps
    common = sorted(set(rates_a) & set(rates_b))
    passing = [r for r in common if verdict(rates_a[r], a.slo) is None and verdict(rates_b[r], b.slo) is None]
    if passing:
        return passing[-1]
    return common[0] if common else None


@dataclass(frozen=True)
class Capacity:
    """A run's capacity under the SLO: the value shown and the range [low, high) it lies in.

    At a knee the server held the last good step and broke at the first failing one, so capacity lies
    between the last good step's achieved rate and the failing step's offered rate: the schedule's
    resolution is all above the shown value, none below. Every step passing gives only a lower bound
    (">=", no high); the lowest step failing only an upper one ("<", low 0).
    """

    value: float | None
    low: float
    high: float | None
    bound: str

    @staticmethod
    def of(run: Run) -> tuple[Capacity, Capacity, str]:
        """(requests/s, tokens/s, note)."""
        knee = run.knee()
        good, bad = run.step(knee.last_good), run.step(knee.first_bad)
        if good is None:
            if bad is None:
                none = Capacity(None, 0.0, None, "=")
                return none, none, f"{run.name}: no steps"
            per_request = bad.tokens_per_s / bad.achieved_rps if bad.achieved_rps else None
            tokens = None if per_request is None else per_request * bad.offered_rps
            return (Capacity(bad.offered_rps, 0.0, bad.offered_rps, "<"), Capacity(tokens, 0.0, tokens, "<"),
                    f"{run.name}: no step met the SLO (capacity below {bad.offered_rps:g} req/s)")
        if bad is None:
            return (Capacity(good.achieved_rps, good.achieved_rps, None, ">="),
                    Capacity(good.tokens_per_s, good.tokens_per_s, None, ">="),
                    f"{run.name}: every step met the SLO (a lower bound)")
        # The failing step's requests are drawn from the same shape, so tokens scale with its offered rate.
        per_request = good.tokens_per_s / good.achieved_rps if good.achieved_rps else 0.0
        high = max(bad.offered_rps, good.achieved_rps)
        return (Capacity(good.achieved_rps, good.achieved_rps, high, "="),
                Capacity(good.tokens_per_s, good.tokens_per_s, max(high * per_request, good.tokens_per_s), "="),
                "")


def _capacity_row(figure: str, unit: str, before: Capacity, after: Capacity, noise: float | None) -> Row:
    """Apart when the two ranges, each widened by the measured noise, do not overlap."""
    bounds = (before.bound, after.bound)
    if before.value is None or after.value is None:
        return Row(figure, unit, before.value, after.value, noise, None, None, "not measured in both runs", *bounds)
    rel = max(NOISE_MARGIN * (noise or 0.0), RELATIVE_FLOOR)

    def top(c: Capacity) -> float:
        return float("inf") if c.high is None else c.high * (1 + rel)

    apart = top(after) < before.low * (1 - rel) or top(before) < after.low * (1 - rel)
    exact = bounds == ("=", "=")
    ranges = ", ".join(f"{name} {c.low:.3g}-{'inf' if c.high is None else f'{c.high:.3g}'}"
                       for name, c in (("before", before), ("after", after)))
    note = f"capacity lies in [last good, first failing): {ranges}"
    if noise is None:
        note += "; no repeated step: noise unknown, 5% floor used"
    if not apart and not exact:
        note += "; a bound on one side"
    return Row(figure, unit, before.value, after.value, noise, rel * abs(before.value),
               True if apart else (False if exact else None), note, *bounds,
               before_range=(before.low, before.high), after_range=(after.low, after.high))


def compare(before: Run, after: Run) -> Comparison:
    """The change-review table: capacity under the SLO, and latency and errors at equal load."""
    notes = []
    if before.slo != after.slo:
        notes.append(f"the runs used different SLOs ({before.slo} vs {after.slo}); capacity rows use each run's own")
    rps_b, tokens_b, note_b = Capacity.of(before)
    rps_a, tokens_a, note_a = Capacity.of(after)
    notes += [n for n in (note_b, note_a) if n]
    rows = [
        _capacity_row("max requests/s under SLO", "req/s", rps_b, rps_a,
                      _larger(before.noise.get("achieved_rps"), after.noise.get("achieved_rps"))),
        _capacity_row("tokens/s under SLO", "tokens/s", tokens_b, tokens_a,
                      _larger(before.noise.get("tokens_per_s"), after.noise.get("tokens_per_s"))),
    ]
    rate = _equal_load(before, after)
    sb = next((s for s in before.schedule if s.offered_rps == rate), None)
    sa = next((s for s in after.schedule if s.offered_rps == rate), None)
    at = f"at {rate:g} req/s offered" if rate is not None else "no offered rate in common"
    rows.append(_relative_row(f"p95 {at}", "s", sb.client_p95_s if sb else None, sa.client_p95_s if sa else None,
                              _larger(before.noise.get("client_p95_s"), after.noise.get("client_p95_s"))))
    eb, ea = (sb.error_rate if sb else None), (sa.error_rate if sa else None)
    noise = _larger(before.noise.get("error_rate"), after.noise.get("error_rate"))
    if eb is None or ea is None:
        rows.append(Row(f"error rate {at}", "share", eb, ea, noise, None, None, "not measured in both runs"))
    else:
        threshold = max(NOISE_MARGIN * (noise or 0.0), ERROR_RATE_FLOOR)
        rows.append(Row(f"error rate {at}", "share", eb, ea, noise, threshold, abs(ea - eb) > threshold))
    return Comparison(before.name, after.name, rows, rate, notes)


def format_table(c: Comparison) -> str:
    """The side-by-side table for a change review (plain text, fixed width)."""
    def num(v: float | None, unit: str) -> str:
        if v is None:
            return "n/a"
        if unit == "s":
            return f"{v * 1000:.0f} ms"
        if unit == "share":
            return f"{v:.2%}"
        return f"{v:.2f}"

    lines = [f"{'figure':<34} {'before':>12} {'after':>12} {'change':>9} {'noise':>7}  beyond noise?",
             "-" * 92]
    for r in c.rows:
        pct = "n/a" if r.delta_pct is None else f"{r.delta_pct:+.1f}%"
        noise = "n/a" if r.noise is None else (f"{r.noise:.2%}" if r.unit == "share" else f"{r.noise:.1%}")
        beyond = {True: "YES", False: "no", None: "n/a"}[r.beyond_noise]
        shown_b = ("" if r.before_bound == "=" or r.before is None else r.before_bound) + num(r.before, r.unit)
        shown_a = ("" if r.after_bound == "=" or r.after is None else r.after_bound) + num(r.after, r.unit)
        if (r.before_bound, r.after_bound) != ("=", "="):
            pct = "n/a"
        lines.append(f"{r.figure:<34} {shown_b:>12} {shown_a:>12} {pct:>9} {noise:>7}  "
                     f"{beyond}{'  (' + r.note + ')' if r.note else ''}")
    lines.append("")
    lines.append(f"{c.before} -> {c.after}: {c.verdict}")
    lines += [f"note: {n}" for n in c.notes]
    return "\n".join(lines)
