"""Load generator: Poisson arrivals, schedules, summaries, and a short real run checked against /metrics."""

import http.client
import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from workload.client import CompletionResult
from workload.loadgen import (
    Arrival,
    LoadResult,
    LoadSpec,
    Outcome,
    Phase,
    arrivals,
    parse_schedule,
    summarize,
)
from workload.stats import percentile

REPO = Path(__file__).resolve().parents[2]


def test_arrivals_are_poisson_at_each_phase_rate() -> None:
    spec = LoadSpec((Phase(20.0, 100.0), Phase(5.0, 100.0)), seed=3)
    plan = arrivals(spec)
    first = [a.at for a in plan if a.at < 100]
    second = [a.at for a in plan if a.at >= 100]
    # Counts of a Poisson process: mean rate*T, sd sqrt(rate*T); 4 sd bounds.
    assert abs(len(first) - 2000) < 4 * math.sqrt(2000)
    assert abs(len(second) - 500) < 4 * math.sqrt(500)
    gaps = [b - a for a, b in itertools.pairwise(first)]
    # Exponential gaps: coefficient of variation 1 (a fixed-interval generator would give 0).
    assert 0.9 < statistics.pstdev(gaps) / statistics.mean(gaps) < 1.1
    assert all(64 <= len(a.prompt.encode()) <= 256 and 16 <= a.max_tokens <= 48 for a in plan)
    assert arrivals(spec) == plan


def test_parse_schedule() -> None:
    assert parse_schedule("4:30,6:10") == (Phase(4.0, 30.0), Phase(6.0, 10.0))
    with pytest.raises(ValueError, match="'4-30'"):
        parse_schedule("4-30")
    with pytest.raises(ValueError, match="-1"):
        Phase(-1, 5)


def test_percentile_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99 and percentile(values, 100) == 100
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError, match="101"):
        percentile(values, 101)


def test_summary_counts_errors_and_tokens() -> None:
    result = LoadResult(duration_s=2.0, dropped=1)
    for i in range(4):
        result.outcomes.append(Outcome(Arrival(i * 0.5, "p", 3, i), CompletionResult(200, 0.1 * (i + 1), 0.01, [1, 2, 3])))
    result.outcomes.append(Outcome(Arrival(1.9, "p", 3, 9), CompletionResult(429, 0.01, error="full")))
    result.outcomes.append(Outcome(Arrival(1.95, "p", 3, 9), CompletionResult(0, 0.01, error="refused")))
    summary = summarize(result)
    assert summary.sent == 6 and summary.ok == 4
    assert summary.errors == {"429": 1, "connection": 1, "dropped": 1}
    assert summary.tokens_per_s == 6.0 and summary.throughput_rps == 2.0
    assert summary.latency_p99 == pytest.approx(0.4) and summary.latency_p50 == pytest.approx(0.2)
    assert "p99 400.0 ms" in summary.text()


def _count(url: str, name: str) -> float:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.workload
def test_load_cli_against_the_server(server, tmp_path: Path) -> None:
    before = _count(server.url, "vllm:e2e_request_latency_seconds_count")
    tokens_before = _count(server.url, "vllm:generation_tokens_total")
    started = time.time()
    run = subprocess.run(
        [sys.executable, "-m", "workload", "load", "--url", server.url, "--schedule", "3:2,6:2",
         "--max-tokens", "8-12", "--prompt-bytes", "32-64", "--json", "--seed", "4",
         "--requests-log", str(tmp_path / "requests.jsonl")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    ended = time.time()
    assert run.returncode == 0, run.stderr
    summary = json.loads(run.stdout)
    assert "sent" in run.stderr  # the progress bar
    expected = len(arrivals(LoadSpec((Phase(3, 2), Phase(6, 2)), (32, 64), (8, 12), seed=4)))
    assert summary["sent"] == summary["ok"] == expected
    assert _count(server.url, "vllm:e2e_request_latency_seconds_count") - before == expected
    generated = _count(server.url, "vllm:generation_tokens_total") - tokens_before
    assert summary["tokens_per_s"] * summary["duration_s"] == pytest.approx(generated)
    assert 0 < summary["ttft_p50"] <= summary["latency_p50"] <= summary["latency_p99"]
    # The requests log: one line per request, on the wall clock, the same latencies the summary is made of.
    logged = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(logged) == expected and all(row["ok"] for row in logged)
    assert all(started <= row["end"] <= ended for row in logged)
    assert all(row["end"] - row["latency_s"] >= started for row in logged)
    assert percentile([row["latency_s"] for row in logged], 99) == pytest.approx(summary["latency_p99"], abs=1e-5)
