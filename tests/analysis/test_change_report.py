"""analysis.change_report on synthetic windows whose truth is known: a slower build, a faster one, a neutral one, a
load that moved out of range, and figures that were not measured."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.change_report import MIN_WINDOWS, compare, format_table
from analysis.window import GcReading, LatencyReading, ProcessReading, SyscallReading, Window


def _windows(n: int, t0: float, *, latency: float, rate: float = 4.0, cpu_per_token: float = 0.002,
             gc: float | None = 0.001, seed: int = 0, noise: float = 0.05) -> list[Window]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        jitter = float(np.exp(rng.normal(0, noise)))
        r = rate * float(np.exp(rng.normal(0, 0.05)))
        requests = r * 5
        tokens = 16 * r
        mean = latency * jitter
        out.append(Window(
            target="srv", pid=1, start=t0 + 5 * i, end=t0 + 5 * i + 5,
            latency=LatencyReading(p50_seconds=mean * 0.9, p95_seconds=mean * 1.6, p99_seconds=mean * 2.0,
                                   mean_seconds=mean, requests=requests, request_rate=r, tokens_per_second=tokens,
                                   buckets={"0.05": requests * 0.5, "0.1": requests * 0.4, "+Inf": requests * 0.1}),
            process=ProcessReading(cpu_seconds=cpu_per_token * tokens * 5 * jitter),
            syscalls=SyscallReading(counts={"futex": int(40 * requests)}),
            gc=None if gc is None else GcReading(collections=1, pause_seconds=gc * 5 * jitter)))
    return out


def _rows(report) -> dict:
    return {r.figure: r for r in report.rows}


def test_a_slower_build_is_a_regression_in_latency_at_equal_load_and_cpu_per_token():
    report = compare(_windows(40, 0, latency=0.05), _windows(40, 1000, latency=0.09, cpu_per_token=0.0036, seed=1))
    rows = _rows(report)
    assert report.verdict == "regression"
    for figure in ("p50_at_equal_load", "p95_at_equal_load", "p99_at_equal_load", "cpu_per_token"):
        assert rows[figure].verdict == "regression", rows[figure]
        assert rows[figure].ratio == pytest.approx(1.8, rel=0.1)
        assert rows[figure].ratio_low <= rows[figure].ratio <= rows[figure].ratio_high
    assert rows["syscalls_per_request"].verdict == "no difference beyond noise"
    assert rows["tokens_per_second"].verdict == "no difference beyond noise"
    assert "p50_at_equal_load" in format_table(report) and "verdict: regression" in format_table(report)


def test_a_faster_build_is_an_improvement():
    report = compare(_windows(40, 0, latency=0.09), _windows(40, 1000, latency=0.05, seed=1))
    assert report.verdict == "improvement"
    assert _rows(report)["p99_at_equal_load"].verdict == "improvement"


def test_a_neutral_restart_shows_no_difference():
    report = compare(_windows(40, 0, latency=0.05), _windows(40, 1000, latency=0.05, seed=1))
    assert report.verdict == "no difference beyond noise"
    assert {r.verdict for r in report.rows} == {"no difference beyond noise"}


def test_load_out_of_the_before_range_is_not_compared():
    report = compare(_windows(40, 0, latency=0.05, rate=4.0), _windows(40, 1000, latency=0.09, rate=12.0, seed=1))
    assert report.rows == [] and "at a load the windows before it saw" in report.reason
    assert report.verdict == "not enough data"


def test_too_few_windows_and_unmeasured_figures_say_why():
    short = compare(_windows(MIN_WINDOWS - 1, 0, latency=0.05), _windows(40, 1000, latency=0.05))
    assert short.rows == [] and "11 before" in short.reason
    no_gc = compare(_windows(40, 0, latency=0.05, gc=None), _windows(40, 1000, latency=0.05, gc=None, seed=1))
    gc = _rows(no_gc)["gc_pause_per_second"]
    assert gc.verdict is None and gc.before is None and "measured in 0 windows" in gc.reason
    assert "not judged" in format_table(no_gc)


def test_latency_decides_and_a_cost_that_moved_the_other_way_is_a_trade_off():
    from analysis.change_report import ChangeReport, Row

    def row(figure, verdict):
        return Row(figure=figure, unit="s", before=1.0, after=1.0, ratio=1.0, ratio_low=1.0, ratio_high=1.0,
                   verdict=verdict)
    faster_dearer = ChangeReport(rows=[row("p50_at_equal_load", "improvement"), row("p99_at_equal_load", "improvement"),
                                       row("cpu_per_token", "regression")])
    assert faster_dearer.verdict == "improvement" and faster_dearer.trade_offs == ["cpu_per_token"]
    assert "verdict: improvement (latency decides; regression in cpu_per_token)" in format_table(faster_dearer)
    slower_cheaper = ChangeReport(rows=[row("p99_at_equal_load", "regression"), row("cpu_per_token", "improvement")])
    assert slower_cheaper.verdict == "regression" and slower_cheaper.trade_offs == ["cpu_per_token"]
    same_latency_dearer = ChangeReport(rows=[row("p50_at_equal_load", "no difference beyond noise"),
                                             row("cpu_per_token", "regression"), row("tokens_per_second", "improvement")])
    assert same_latency_dearer.verdict == "regression" and same_latency_dearer.trade_offs == ["tokens_per_second"]

