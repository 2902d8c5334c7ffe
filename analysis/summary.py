"""One summary of a window: the figures a person reads first, for the page, `collect` and `status` alike."""

from __future__ import annotations

import time
from typing import Any

from analysis.client_latency import estimate as estimate_client_latency
from analysis.own_syscalls import OWN_SYSCALLS
from analysis.window import Window


def window_summary(w: Window) -> dict[str, Any]:
    """Headline figures as plain JSON values; None where the window has no reading (never a zero)."""
    top_syscalls = [(f"{name} ({OWN_SYSCALLS[name]})" if name in OWN_SYSCALLS else name, n) for name, n in
                    sorted((w.syscalls.counts.items() if w.syscalls else []), key=lambda kv: -kv[1])[:5]]
    gpu = w.gpu
    client = estimate_client_latency(w.latency, w.delivery)
    return {
        "target": w.target,
        "pid": w.pid,
        "start": w.start,
        "end": w.end,
        "duration_seconds": round(w.duration, 3),
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
        # NVML's utilisation is a 0..1 fraction; people read a percentage.
        "gpu_percent": (round(100 * gpu.utilization, 1) if gpu and gpu.available and gpu.utilization is not None
                        else None),
        "gpu_note": None if gpu is None or gpu.available else (gpu.reason or "no GPU"),
        "errors": dict(w.errors),
        # What the clients wait (server latency + reply delivery, analysis/client_latency.py), and the share of
        # replies retransmitted; None without a delivery reading.
        "client_p50_ms": _ms(client.p50_seconds) if client else None,
        "client_p99_ms": _ms(client.p99_seconds) if client else None,
        "replies_retransmitted_percent": (round(100 * client.retransmitted_share, 1) if client else None),
    }


def summary_line(s: dict[str, Any]) -> str:
    """One line of text from window_summary's figures; readings a window lacks are left out, not shown as 0."""
    parts = [f"{time.strftime('%H:%M:%S', time.localtime(s['end']))} {s['target']} pid {s['pid']} "
             f"{s['end'] - s['start']:.1f}s"]
    figures = [
        ("p99", s["p99_ms"], "{} ms"), ("clients p99", s.get("client_p99_ms"), "{} ms"), ("rate", s["request_rate"], "{} req/s"), ("cpu", s["cpu_percent"], "{} %"),
        ("rss", s["rss_mb"], "{} MiB"), ("syscalls", s["syscalls"], "{}"), ("offcpu", s["offcpu_seconds"], "{} s"),
        ("gc", s["gc_collections"], "{}"), ("gc pause", s["gc_pause_ms"], "{} ms"),
        ("runq p99", s["runqueue_p99_us"], "{:.0f} us"), ("retrans", s["tcp_retransmits"], "{}"),
        ("python samples", s["python_samples"], "{}"), ("gpu", s["gpu_percent"], "{} %"),
    ]
    parts += [f"{label} {fmt.format(value)}" for label, value, fmt in figures if value is not None]
    if s["errors"]:
        parts.append("errors: " + "; ".join(f"{k}: {v}" for k, v in sorted(s["errors"].items())))
    return "  ".join(parts)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)
