"""Turn the agent's state snapshot into plain dicts for the page and the JSON API."""

from __future__ import annotations

from typing import Any

from analysis.own_syscalls import OWN_SYSCALLS
from analysis.redact import redact_text
from analysis.window import Window


def window_summary(w: Window) -> dict[str, Any]:
    """The figures a person reads first: latency, rate, CPU, memory, and each probe's headline number."""
    top_syscalls = [(f"{name} ({OWN_SYSCALLS[name]})" if name in OWN_SYSCALLS else name, n) for name, n in
                    sorted((w.syscalls.counts.items() if w.syscalls else []), key=lambda kv: -kv[1])[:5]]
    return {
        "target": w.target,
        "pid": w.pid,
        "start": w.start,
        "end": w.end,
        "p50_ms": _ms(w.latency.p50_seconds) if w.latency else None,
        "p99_ms": _ms(w.latency.p99_seconds) if w.latency else None,
        "request_rate": round(w.latency.request_rate, 2) if w.latency else None,
        "cpu_percent": round(100 * w.process.cpu_seconds / w.duration, 1) if w.process and w.duration else None,
        "rss_mb": round(w.process.rss_bytes / 2**20, 1) if w.process else None,
        "threads": w.process.threads if w.process else None,
        "syscalls": sum(w.syscalls.counts.values()) if w.syscalls else None,
        "top_syscalls": top_syscalls,
        "offcpu_seconds": round(w.offcpu.seconds, 3) if w.offcpu else None,
        "gc_collections": w.gc.collections if w.gc else None,
        "gc_pause_ms": _ms(w.gc.pause_seconds) if w.gc else None,
        "gc_max_pause_ms": _ms(w.gc.max_pause_seconds) if w.gc else None,
        "runqueue_p99_us": w.runqueue.histogram.quantile(0.99) if w.runqueue else None,
        "tcp_retransmits": w.tcp.retransmits if w.tcp else None,
        "python_samples": (sum(w.stacks.active.values()) + sum(w.stacks.idle.values())) if w.stacks else None,
        "gpu": ("no GPU" if not w.gpu.available else f"{w.gpu.utilization}%") if w.gpu else None,
        "errors": dict(w.errors),
    }


def status(snapshot: dict[str, Any]) -> dict[str, Any]:
    """Everything the page and /api/status show; every string in it has URL credentials hidden, whichever
    source put them there (a target's command line, a scrape error, a health reason)."""
    return _redacted(_status(snapshot))


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redacted(v) for v in value]
    return value


def _status(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {
        "now": round(snapshot["now"]),
        "uptime_seconds": round(snapshot["now"] - snapshot["started"], 1),
        "windows_written": snapshot["windows_written"],
        "late_ticks": snapshot["late_ticks"],
        "dropped_windows": snapshot["dropped_windows"],
        "errors": snapshot["errors"],
        "targets": [
            {"name": t.name, "pid": t.pid, "state": t.state, "since": t.since, "detail": t.detail}
            for t in sorted(snapshot["targets"].values(), key=lambda t: t.name)
        ],
        # A process_regex that matched more than the agent watches says so (allowed_users, max_targets).
        "skipped": [{"target": name, "line": sk.line()}
                    for name, sk in sorted(snapshot.get("skipped", {}).items()) if sk.line()],
        "sources": [{"source": name, **health,
                     "error_count": health.get("errors", health.get("read_errors", snapshot["errors"].get(name, 0)))}
                    for name, health in sorted(snapshot["health"].items())],
        "latest": {name: window_summary(w) for name, w in sorted(snapshot["latest"].items())},
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)
