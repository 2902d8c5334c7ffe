"""The load test report as one offline HTML file: figure charts with the knee, bottleneck evidence, flame graphs."""

from __future__ import annotations

import base64
import time
from html import escape

from agent.loadtest.charts import Marker, Series, line_chart
from agent.loadtest.report import LoadTestReport
from analysis.capacity import StepFigures, verdict
from analysis.flamegraph import Profile
from analysis.flamegraph.export import export, export_diff

# (chart id, title, unit, [(series label, StepFigures attribute or callable, scale)])
FIGURES: list[tuple[str, str, str, list[tuple[str, object, float]]]] = [
    ("throughput", "Achieved requests/s", "req/s", [("achieved", "achieved_rps", 1.0), ("offered", "offered_rps", 1.0)]),
    ("tokens", "Generated tokens/s", "tokens/s", [("tokens/s", "tokens_per_s", 1.0)]),
    ("errors", "Error rate", "%", [("errors", lambda s: s.error_rate, 100.0)]),
    ("latency", "Latency (client p50/p95/p99, server p95)", "ms",
     [("client p50", "client_p50_s", 1000.0), ("client p95", "client_p95_s", 1000.0),
      ("client p99", "client_p99_s", 1000.0), ("server p95", "server_p95_s", 1000.0)]),
    ("ttft", "Time to first token", "ms", [("p50", "ttft_p50_s", 1000.0), ("p95", "ttft_p95_s", 1000.0)]),
    ("queue", "Queue and batch", "requests", [("waiting (mean)", "queue_waiting_mean", 1.0),
                                             ("waiting (max)", "queue_waiting_max", 1.0),
                                             ("running", "running_mean", 1.0), ("batch size", "batch_mean", 1.0)]),
    ("cpu", "Server CPU", "cores", [("process", "cpu_cores", 1.0), ("busiest thread", "busiest_thread_cores", 1.0)]),
    # Series per wait kind, filled from the steps; threads that slept through a step are left out.
    ("offcpu", "Off-CPU by wait kind (threads that ran)", "s per s", []),
    ("gc", "GC pause share of wall time", "%", [("gc pause", "gc_pause_share", 100.0)]),
    ("runq", "Run-queue wait", "s per s", [("runnable, waiting", "runq_wait_per_s", 1.0)]),
    ("runq_p99", "Run-queue latency p99", "us", [("p99", "runq_p99_us", 1.0)]),
    ("syscalls", "Syscalls per request", "syscalls", [("per request", "syscalls_per_request", 1.0)]),
    ("ctxsw", "Context switches", "per s", [("all", "ctx_switches_per_s", 1.0),
                                           ("involuntary", "involuntary_ctx_switches_per_s", 1.0)]),
    ("retrans", "TCP retransmits", "segments", [("retransmits", "retransmits", 1.0)]),
]

CSS = """body{font-family:sans-serif;margin:20px;color:#222;max-width:1500px}
h1{font-size:22px}h2{font-size:17px;margin-top:28px}table{border-collapse:collapse;font-size:12px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}
.charts{display:flex;flex-wrap:wrap;gap:10px}.bad{color:#b00}.good{color:#070}
.verdict{font-size:15px;padding:8px;background:#f7f7f0;border-left:4px solid #c90}
.warning{padding:8px;background:#fff0f0;border-left:4px solid #a40000}
img.flame{width:100%;border:1px solid #ccc}.flames{display:grid;grid-template-columns:1fr 1fr;gap:10px}"""


def _value(step: StepFigures, attr: object, scale: float) -> float | None:
    v = attr(step) if callable(attr) else getattr(step, str(attr))
    return None if v is None else float(v) * scale


def _why_empty(steps: list[StepFigures], attrs: list[object]) -> str:
    for s in steps:
        for name, why in s.unmeasured.items():
            if any(isinstance(a, str) and (a.startswith(name) or name in a) for a in attrs):
                return f"not measured: {why}"[:90]
    return "not measured in this run"


def charts(report: LoadTestReport) -> list[str]:
    sched = sorted((s for s in report.steps if s.repeat_of is None), key=lambda s: s.offered_rps)
    repeats = [s for s in report.steps if s.repeat_of is not None]
    knee = report.knee()
    good, bad = report.step(knee.last_good), report.step(knee.first_bad)
    markers = []
    if good is not None:
        markers.append(Marker(good.offered_rps, "knee", "#070"))
    if bad is not None:
        markers.append(Marker(bad.offered_rps, "breaks", "#b00"))
    out = []
    for chart_id, title, unit, spec in FIGURES:
        if chart_id == "offcpu":
            kinds = sorted({k for s in report.steps for k in s.offcpu_by_kind})
            spec = [(k, (lambda s, k=k: s.offcpu_by_kind.get(k, 0.0) if s.offcpu_by_kind else None), 1.0)
                    for k in kinds]
        series = [Series(label, [(s.offered_rps, _value(s, attr, scale)) for s in sched],
                         [(s.offered_rps, v) for s in repeats if (v := _value(s, attr, scale)) is not None])
                  for label, attr, scale in spec]
        extra = list(markers)
        if chart_id == "latency":
            extra.append(Marker(report.slo.p95_s * 1000, f"SLO p95 {report.slo.p95_s * 1000:g} ms", "#c90", True))
        if chart_id == "errors":
            extra.append(Marker(report.slo.max_error_rate * 100, "SLO", "#c90", True))
        empty = _why_empty(report.steps, [a for _, a, _ in spec] or ["offcpu"])
        out.append(line_chart(f"chart-{chart_id}", title, "offered load (req/s)", unit, series, extra, empty))
    return out


def _profile(folded: dict[str, int]) -> Profile:
    return Profile.from_folded_dict(folded)


def _img(svg: bytes, alt: str, cls: str) -> str:
    return f'<img class="{cls}" alt="{escape(alt)}" src="data:image/svg+xml;base64,{base64.b64encode(svg).decode()}">'


def flame_section(report: LoadTestReport) -> str:
    if not (report.flame_good and report.flame_bad):
        return f'<p class="flame-missing">{escape(report.flame_note or "no flame graphs in this report")}</p>'
    good, bad = _profile(report.flame_good), _profile(report.flame_bad)
    g = export(good, "svg", title="Last good step (Python on-CPU)").data
    b = export(bad, "svg", title="First failing step (Python on-CPU)").data
    d = export_diff(good, bad, "svg", title="First failing vs last good (red grew, blue shrank)").data
    return (f'<div class="flames">{_img(g, "last good step flame graph", "flame")}'
            f'{_img(b, "first failing step flame graph", "flame")}</div>'
            f'<h3>Differential view</h3>{_img(d, "differential flame graph", "flame diff")}')


def _fmt(v: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "n/a" if v is None else f"{v * scale:.{digits}f}"


def steps_table(report: LoadTestReport) -> str:
    head = ("<tr><th>step</th><th>offered</th><th>achieved</th><th>tok/s</th><th>errors</th><th>p50 ms</th>"
            "<th>p95 ms</th><th>p99 ms</th><th>srv p95 ms</th><th>TTFT p95 ms</th><th>queue</th><th>CPU</th>"
            "<th>busiest thr</th><th>idle thr</th><th>GC %</th><th>runq s/s</th><th>sys/req</th><th class=l>verdict</th></tr>")
    rows = []
    for s in report.steps:
        why = verdict(s, report.slo)
        name = f"{s.index + 1}" + (f" (repeat of {s.repeat_of + 1})" if s.repeat_of is not None else "")
        errs = ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())) or "0"
        rows.append(
            f"<tr><td>{name}</td><td>{s.offered_rps:g}</td><td>{s.achieved_rps:.2f}</td><td>{s.tokens_per_s:.0f}</td>"
            f"<td>{escape(errs)}</td><td>{_fmt(s.client_p50_s, 1000, 0)}</td><td>{_fmt(s.client_p95_s, 1000, 0)}</td>"
            f"<td>{_fmt(s.client_p99_s, 1000, 0)}</td><td>{_fmt(s.server_p95_s, 1000, 0)}</td>"
            f"<td>{_fmt(s.ttft_p95_s, 1000, 0)}</td><td>{_fmt(s.queue_waiting_mean, 1, 1)}</td>"
            f"<td>{_fmt(s.cpu_cores)}</td><td>{_fmt(s.busiest_thread_cores)}</td>"
            f"<td>{'n/a' if s.idle_threads is None else s.idle_threads}</td>"
            f"<td>{_fmt(s.gc_pause_share, 100, 1)}</td><td>{_fmt(s.runq_wait_per_s, 1, 3)}</td>"
            f"<td>{_fmt(s.syscalls_per_request, 1, 0)}</td>"
            f"<td class=l><span class={'good' if why is None else 'bad'}>{escape(why or 'meets SLO')}</span>"
            f"{' (stopped early)' if s.stopped_early else ''}</td></tr>")
    return f'<table id="steps">{head}{"".join(rows)}</table>'


def bottleneck_section(report: LoadTestReport) -> str:
    b = report.bottleneck()
    rows = []
    for c in b.candidates:
        ev = "<br>".join(escape(e.text()) for e in c.evidence)
        before = "n/a" if c.score_good is None else f"{c.score_good:.2f}"
        rows.append(f"<tr><td class=l>{escape(c.resource)}</td><td>{before}</td><td>{c.score:.2f}</td>"
                    f"<td class=l>{ev}</td></tr>")
    # Both scores shown: the named resource is the one that rose most, not always the highest.
    return (f'<p class="verdict" id="bottleneck">{escape(b.summary)}</p>'
            f'<table id="candidates"><tr><th class=l>resource</th><th>score at last good</th>'
            f'<th>score at first failing (&ge;1 saturated)</th>'
            f'<th class=l>evidence: last good &rarr; first failing</th></tr>{"".join(rows)}</table>')


def render(report: LoadTestReport) -> str:
    knee = report.knee()
    good, bad = report.step(knee.last_good), report.step(knee.first_bad)
    def at_server(offered: float) -> str:
        total = report.at_server(offered)
        return "" if total is None else f" (+ background = {total:.2f} req/s at the server)"

    if knee.found and good and bad:
        knee_text = (f"Knee: {good.offered_rps:g} req/s offered{at_server(good.offered_rps)} is the highest step "
                     f"meeting the SLO ({good.achieved_rps:.2f} req/s, {good.tokens_per_s:.0f} tokens/s); "
                     f"{bad.offered_rps:g} req/s{at_server(bad.offered_rps)} breaks it: {knee.reason}.")
    else:
        knee_text = f"No knee: {knee.reason}."
    noise = ", ".join(f"{k} {v:.1%}" for k, v in report.noise().items() if v is not None) or "no repeated step"
    problems = "".join(f"<li>{escape(k)}: {escape(v)}</li>" for k, v in sorted(report.collection_problems.items()))
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(report.started))
    b = report.background
    warn = b is not None and bool(b.rps)
    background = "" if b is None else (f'<p id="background" class="{"warning" if warn else "meta"}">'
                                       f"{escape(b.text())}</p>\n")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infersight loadtest {escape(report.label)}</title>
<style>{CSS}</style></head><body>
<h1>Load test of {escape(report.url)}{' (' + escape(report.label) + ')' if report.label else ''}</h1>
<p>{when}; pid {report.pid if report.pid is not None else 'n/a'}; schedule {escape(report.schedule)};
SLO p95 &le; {report.slo.p95_s * 1000:g} ms and errors &le; {report.slo.max_error_rate:.1%}.
Run-to-run noise from repeated steps: {escape(noise)}.</p>
{background}<p class="verdict" id="knee">{escape(knee_text)}</p>
<h2>What saturated first</h2>{bottleneck_section(report)}
<h2>Figures against offered load</h2><div class="charts">{"".join(charts(report))}</div>
<h2>Flame graphs: last good step vs first failing step</h2>{flame_section(report)}
<h2>Steps</h2>{steps_table(report)}
{'<h2>Sources that could not run</h2><ul>' + problems + '</ul>' if problems else ''}
</body></html>
"""
