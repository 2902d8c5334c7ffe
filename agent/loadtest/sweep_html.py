"""The sweep as one offline HTML file: tokens/s, p95 and the contention evidence against the setting."""

from __future__ import annotations

from html import escape

from agent.loadtest.charts import Marker, Series, line_chart
from agent.loadtest.html import CSS
from agent.loadtest.sweep import SweepResult


def render(result: SweepResult) -> str:
    name = result.sweep.setting
    best = result.optimum()
    marks = [Marker(best.value, f"optimum {name}={best.value}", "#070")] if best else []

    def series(label: str, attr: str, scale: float = 1.0) -> Series:
        return Series(label, [(float(p.value), None if (v := getattr(p, attr)) is None else v * scale)
                              for p in result.points])

    charts = [
        line_chart("sweep-tokens", "Tokens/s under the SLO", name, "tokens/s", [series("tokens/s", "tokens_per_s")],
                   marks),
        line_chart("sweep-rps", "Requests/s under the SLO", name, "req/s", [series("req/s", "knee_rps")], marks),
        line_chart("sweep-p95", "p95 at that load", name, "ms", [series("p95", "p95_s", 1000.0)], marks),
        line_chart("sweep-ctxsw", "Context switches at that load", name, "per s",
                   [series("all", "ctx_switches_per_s"), series("involuntary", "involuntary_ctx_switches_per_s")],
                   marks),
        line_chart("sweep-runq", "Run-queue wait at that load", name, "s per s", [series("runq", "runq_wait_per_s")],
                   marks),
    ]
    optimum = (f"Optimum: {name}={best.value} with {best.tokens_per_s:.0f} tokens/s under the SLO."
               if best and best.tokens_per_s is not None else "No setting met the SLO at any step.")
    others = [p.value for p in result.tied_with_most() if best and p.value != best.value]
    if others:
        optimum += (f" Tokens/s of {name}={', '.join(map(str, others))} are within the run-to-run noise of it; "
                    "the lower p95, then the lower setting, decided.")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>infersight sweep {escape(name)}</title>
<style>{CSS}</style></head><body>
<h1>Sweep of {escape(name)} = {", ".join(str(v) for v in result.sweep.values)}</h1>
<p class="verdict" id="optimum">{escape(optimum)}</p>
<div class="charts">{"".join(charts)}</div>
<h2>Per setting</h2><pre id="sweep-table">{escape(result.text())}</pre>
</body></html>
"""
