"""The before/after report of a change: latency at equal load (through the detector's load model), throughput and
cost figures, each with a bootstrap interval and a verdict: regression, improvement, or no difference beyond noise."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from analysis.baseline import latency_row
from analysis.features import Features, extract
from analysis.latency_model import ExpectedLatency
from analysis.robust import median
from analysis.window import Window

# Windows each side needs, at comparable load, before a figure is judged (a minute at 5 s windows).
MIN_WINDOWS = 12
# A window counts when it finished at least this many requests (as the detector's min_requests).
MIN_REQUESTS = 3
# Load is comparable when an after-window's request rate lies within the before windows' range widened by this factor.
LOAD_SLACK = 1.25
# No difference below 5 % is told apart on a shared host, whatever the interval says (as analysis.capacity_compare).
RELATIVE_FLOOR = 0.05
BOOTSTRAP = 1000
CONFIDENCE = 0.95

# figure -> (unit, better when higher)
FIGURES: dict[str, tuple[str, bool]] = {
    "p50_at_equal_load": ("s", False), "p95_at_equal_load": ("s", False), "p99_at_equal_load": ("s", False),
    "tokens_per_second": ("tokens/s", True), "cpu_per_token": ("s", False),
    "syscalls_per_request": ("calls", False), "gc_pause_per_second": ("s/s", False),
}
LATENCY_FIGURES = ("p50_at_equal_load", "p95_at_equal_load", "p99_at_equal_load")
_QUANTILE_FIELD = {"p50_at_equal_load": "p50_seconds", "p95_at_equal_load": "p95_seconds",
                   "p99_at_equal_load": "p99_seconds"}


@dataclass(frozen=True)
class Row:
    """One figure: before and after (medians; latency after is at the before side's load), after/before with its
    interval, and the verdict; or `reason` why it was not judged (every number None then)."""

    figure: str
    unit: str
    before: float | None = None
    after: float | None = None
    ratio: float | None = None
    ratio_low: float | None = None
    ratio_high: float | None = None
    windows_before: int = 0
    windows_after: int = 0
    verdict: str | None = None  # regression | improvement | no difference beyond noise
    reason: str | None = None


@dataclass
class ChangeReport:
    rows: list[Row] = field(default_factory=list)
    # Request rate medians of the windows compared: what "equal load" means here.
    load_before: float | None = None
    load_after: float | None = None
    comparable_after: int = 0
    reason: str | None = None  # why nothing could be compared at all

    @property
    def verdict(self) -> str:
        """Latency at equal load decides (the question is "did the deploy make it slower?"): regression when any
        latency figure regressed, else improvement when any improved. When latency did not move, the other figures
        decide the same way (regression first). A figure that moved the other way is a trade-off (`trade_offs`)."""
        latency = {r.verdict for r in self.rows if r.figure in LATENCY_FIGURES}
        others = {r.verdict for r in self.rows if r.figure not in LATENCY_FIGURES}
        for verdicts in (latency, others):
            if "regression" in verdicts:
                return "regression"
            if "improvement" in verdicts:
                return "improvement"
        return "no difference beyond noise" if (latency | others) - {None} else "not enough data"

    @property
    def trade_offs(self) -> list[str]:
        """The figures that moved against the verdict (e.g. CPU per token up in a change that made latency better)."""
        against = {"regression": "improvement", "improvement": "regression"}.get(self.verdict)
        return [r.figure for r in self.rows if against is not None and r.verdict == against]

    def to_dict(self) -> dict:
        return {**asdict(self), "verdict": self.verdict, "trade_offs": self.trade_offs}


def _usable(windows: list[Window]) -> list[Features]:
    out = []
    for w in windows:
        if w.duration > 0:
            f = extract(w)
            if f.requests is not None and f.requests >= MIN_REQUESTS and f.mean_seconds and f.mean_seconds > 0:
                out.append(f)
    return out


def compare(before: list[Window], after: list[Window]) -> ChangeReport:
    """Before/after of the windows on each side of a change (each side one identity, in time order)."""
    old, new = _usable(before), _usable(after)
    if len(old) < MIN_WINDOWS or len(new) < MIN_WINDOWS:
        return ChangeReport(reason=f"not enough windows with requests: {len(old)} before, {len(new)} after, "
                                   f"{MIN_WINDOWS} needed on each side")
    rates = [f.request_rate for f in old if f.request_rate]
    low, high = (min(rates) / LOAD_SLACK, max(rates) * LOAD_SLACK) if rates else (0.0, math.inf)
    comparable = [f for f in new if f.request_rate is not None and low <= f.request_rate <= high]
    report = ChangeReport(load_before=median(rates) if rates else None,
                          load_after=median(f.request_rate for f in comparable if f.request_rate)
                          if comparable else None, comparable_after=len(comparable))
    if len(comparable) < MIN_WINDOWS:
        report.reason = (f"only {len(comparable)} windows after the change at a load the windows before it saw "
                         f"({low:.2f}..{high:.2f} requests/s); {MIN_WINDOWS} needed")
        return report
    model = ExpectedLatency().fit([latency_row(f) for f in old])

    def expected_mean(f: Features) -> float:
        return model.expected(f.request_rate, f.tokens_per_request)["mean"]
    reference = expected_mean(Features(duration=1.0, request_rate=report.load_before,
                                       tokens_per_request=median(f.tokens_per_request for f in old
                                                                 if f.tokens_per_request) if any(
                                           f.tokens_per_request for f in old) else None))
    rng = np.random.default_rng(0)
    for figure, (unit, higher_better) in FIGURES.items():
        if figure in _QUANTILE_FIELD:
            name = _QUANTILE_FIELD[figure]
            # Each window's quantile in units of the latency the model expects at its own load, then scaled back to
            # the before side's median load: latency at equal load.
            xs = [getattr(f, name) / expected_mean(f) for f in old if getattr(f, name)]
            ys = [getattr(f, name) / expected_mean(f) for f in comparable if getattr(f, name)]
            scale = reference
        else:
            xs = [v for f in old if (v := getattr(f, figure)) is not None]
            ys = [v for f in comparable if (v := getattr(f, figure)) is not None]
            scale = 1.0
        report.rows.append(_row(figure, unit, higher_better, xs, ys, scale, rng))
    return report


def _row(figure: str, unit: str, higher_better: bool, xs: list[float], ys: list[float], scale: float,
         rng: np.random.Generator) -> Row:
    if len(xs) < MIN_WINDOWS or len(ys) < MIN_WINDOWS:
        return Row(figure, unit, windows_before=len(xs), windows_after=len(ys),
                   reason=f"measured in {len(xs)} windows before and {len(ys)} after; {MIN_WINDOWS} needed on each side")
    a, b = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
    before, after = float(np.median(a)), float(np.median(b))
    if before <= 0:
        return Row(figure, unit, before * scale, after * scale, windows_before=len(xs), windows_after=len(ys),
                   reason="zero before the change: no ratio")
    boots = (np.median(rng.choice(b, (BOOTSTRAP, len(b))), axis=1)
             / np.maximum(np.median(rng.choice(a, (BOOTSTRAP, len(a))), axis=1), 1e-300))
    tail = (1 - CONFIDENCE) / 2
    lo, hi = (float(v) for v in np.quantile(boots, [tail, 1 - tail]))
    ratio = after / before
    worse, better = (lo > 1 + RELATIVE_FLOOR, hi < 1 - RELATIVE_FLOOR)
    if higher_better:
        worse, better = hi < 1 - RELATIVE_FLOOR, lo > 1 + RELATIVE_FLOOR
    verdict = "regression" if worse else "improvement" if better else "no difference beyond noise"
    return Row(figure, unit, before * scale, after * scale, round(ratio, 4), round(lo, 4), round(hi, 4),
               len(xs), len(ys), verdict)


def format_table(report: ChangeReport) -> str:
    if report.reason and not report.rows:
        return f"no before/after report: {report.reason}"
    lines = [f"load: {_num(report.load_before)} requests/s before, {_num(report.load_after)} after "
             f"({report.comparable_after} comparable windows after)"]
    if report.reason:
        lines.append(f"not compared: {report.reason}")
    lines.append(f"{'figure':22} {'before':>12} {'after':>12} {'after/before (95% CI)':>26}  verdict")
    for r in report.rows:
        if r.reason:
            lines.append(f"{r.figure:22} {'–':>12} {'–':>12} {'':>26}  not judged: {r.reason}")
            continue
        interval = f"{r.ratio:.3f} ({r.ratio_low:.3f}..{r.ratio_high:.3f})"
        lines.append(f"{r.figure:22} {_num(r.before, r.unit):>12} {_num(r.after, r.unit):>12} {interval:>26}  "
                     f"{r.verdict}")
    lines.append(f"verdict: {report.verdict}" + _trade_off_words(report))
    return "\n".join(lines)


def _trade_off_words(report: ChangeReport) -> str:
    if not report.trade_offs:
        return ""
    other = "improvement" if report.verdict == "regression" else "regression"
    return f" (latency decides; {other} in {', '.join(report.trade_offs)})"


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–"
    if unit == "s":
        return f"{value * 1e3:.2f} ms"
    if unit == "s/s":
        return f"{value * 1e3:.2f} ms/s"
    return f"{value:.3g} {unit}".strip()


# How far on each side of a change the report looks (30 minutes), bounded by the changes before and after it.
SPAN_SECONDS = 1800.0


def sides(windows: list[Window], at: float, pid: int, previous_at: float | None = None,
          next_at: float | None = None) -> tuple[list[Window], list[Window]]:
    """The windows of the identity before a change (ended by `at`, after the previous change) and of the process that
    brought it (`pid`, before the next change), at most SPAN_SECONDS on each side."""
    start = max(at - SPAN_SECONDS, previous_at if previous_at is not None else -math.inf)
    stop = min(at + SPAN_SECONDS, next_at if next_at is not None else math.inf)
    before = [w for w in windows if start <= w.start and w.end <= at]
    after = [w for w in windows if w.pid == pid and at <= w.start and w.end <= stop]
    return before, after


def to_html(report: ChangeReport, title: str, diff: list[str]) -> str:
    """A self-contained page of the report; every text the target chose is escaped."""
    from html import escape

    rows = []
    for r in report.rows:
        if r.reason:
            rows.append(f"<tr><td>{escape(r.figure)}</td><td>–</td><td>–</td><td>–</td>"
                        f"<td>not judged: {escape(r.reason)}</td></tr>")
        else:
            rows.append(f"<tr><td>{escape(r.figure)}</td><td>{escape(_num(r.before, r.unit))}</td>"
                        f"<td>{escape(_num(r.after, r.unit))}</td><td>{r.ratio:.3f} ({r.ratio_low:.3f}..{r.ratio_high:.3f})"
                        f"</td><td class=\"{escape(r.verdict or '').replace(' ', '-')}\">{escape(r.verdict or '')}</td></tr>")
    reason = f"<p>{escape(report.reason)}</p>" if report.reason else ""
    items = "".join(f"<li>{escape(line)}</li>" for line in diff)
    return ("<!doctype html><html><head><meta charset=\"utf-8\"><title>" + escape(title) + "</title>"
            "<style>body{font:14px sans-serif;margin:2em}td,th{padding:2px 10px;text-align:right}"
            "td:first-child{text-align:left}.regression{color:#b00}.improvement{color:#070}</style></head><body>"
            f"<h1>{escape(title)}</h1><h2>What changed</h2><ul>{items}</ul>"
            f"<h2>Before and after (verdict: {escape(report.verdict + _trade_off_words(report))})</h2>"
            f"<p>load: {escape(_num(report.load_before))} requests/s before, {escape(_num(report.load_after))} after; "
            "latency at equal load through the detector's load model; after/before with its 95% bootstrap interval; "
            "a difference under 5% is never told apart</p>" + reason +
            "<table><tr><th>figure</th><th>before</th><th>after</th><th>after/before</th><th>verdict</th></tr>"
            + "".join(rows) + "</table></body></html>\n")
