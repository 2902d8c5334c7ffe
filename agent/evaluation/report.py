"""The eval result as a table a person reads: overall figures, then per cause label, per scenario, per phase."""

from __future__ import annotations

from typing import Any


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def table(runs: list[Any], summary: dict[str, Any]) -> str:
    lines = [
        f"precision {_pct(summary['precision'])}   recall {_pct(summary['recall'])}   "
        f"attribution top-1 {_pct(summary['attribution_top1'])}",
        f"median delay {_num(summary['median_delay_windows'])} windows ({_num(summary['median_delay_seconds'])} s)   "
        f"false alarms {summary['false_alarms']} ({_num(summary['false_alarms_per_hour'], '{:.2f}')}/h over "
        f"{summary['normal_hours'] * 60:.0f} min normal)   windows scored {summary['windows_scored']}",
        "",
        f"{'label':<16}{'phases':>7}{'detected':>10}{'attributed':>12}{'median delay':>14}",
    ]
    for label, row in summary["per_label"].items():
        lines.append(f"{label:<16}{row['phases']:>7}{row['detected']:>10}{row['attributed']:>12}"
                     f"{_num(row['median_delay_windows']):>14}")
    lines += ["", f"{'scenario':<40}{'phases':>7}{'detected':>10}{'attributed':>12}{'false alarms':>14}"]
    for name, row in summary["scenarios"].items():
        lines.append(f"{name[:39]:<40}{row['phases']:>7}{row['detected']:>10}{row['attributed']:>12}"
                     f"{row['false_alarms']:>14}")
    lines += ["", "fault phases:"]
    for run in runs:
        for p in run.score.fault_phases:
            verdict = (f"detected after {p.delay_windows} windows, top cause {p.top_cause}"
                       f"{'' if p.attributed else ' (expected ' + p.label + ')'}") if p.detected else "MISSED"
            lines.append(f"  {run.scenario.name[:36]:<36} phase {p.index + 1} {p.label:<15} {verdict}")
    compared = [run for run in runs if getattr(run, "clients", None)]
    if compared:
        within = compared[0].clients["within"]
        lines += ["", f"clients' p99 estimate within {within * 100:.0f} % of the load generator's (windows with both):"]
    for run in compared:
        c = run.clients
        lines.append(f"  {run.scenario.name[:36]:<36} {_pct(c['share_within'])} of {c['windows']}, "
                     f"fault phases {_pct(c['fault_share_within'])} of {c['fault_windows']}")
    return "\n".join(lines) + "\n"
