"""The latency source's per-bucket deltas and the server figures a preset names (vLLM, TGI), and nothing else."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from agent.presets import PRESETS, TGI_FIGURES, VLLM_FIGURES
from agent.sources.latency import LatencySource, bucket_counts, figure_names, relevant_text
from agent.sources.scrape import filter_text

E2E = "vllm:e2e_request_latency_seconds"


def vllm_text(n: int, e2e_sum: float, tokens: float, waiting: float, running: float, fault: int = 0,
              ttft: tuple[float, int] = (0.0, 0), queue: tuple[float, int] = (0.0, 0)) -> str:
    """Exposition text as the bundled workload writes it, with `n` requests so far (half under 0.1 s)."""
    m = 'model_name="tiny"'
    return "\n".join([
        f'{E2E}_bucket{{{m},le="0.1"}} {n // 2}', f'{E2E}_bucket{{{m},le="0.5"}} {n}',
        f'{E2E}_bucket{{{m},le="+Inf"}} {n}', f"{E2E}_count{{{m}}} {n}", f"{E2E}_sum{{{m}}} {e2e_sum}",
        f"vllm:generation_tokens_total{{{m}}} {tokens}",
        f"vllm:num_requests_waiting{{{m}}} {waiting}", f"vllm:num_requests_running{{{m}}} {running}",
        f"vllm:time_to_first_token_seconds_sum{{{m}}} {ttft[0]}",
        f"vllm:time_to_first_token_seconds_count{{{m}}} {ttft[1]}",
        f"vllm:request_queue_time_seconds_sum{{{m}}} {queue[0]}",
        f"vllm:request_queue_time_seconds_count{{{m}}} {queue[1]}",
        f'workload:fault_active{{fault="gc"}} {fault}', ""])


class Scrapes:
    """Hands out canned texts in order and moves a clock 5 s per scrape."""

    def __init__(self, *texts: str) -> None:
        self.texts, self.now = list(texts), 100.0

    def fetch(self, url: str, timeout: float) -> str:
        self.now += 5.0
        return self.texts.pop(0)

    def clock(self) -> float:
        return self.now


def source(scrapes: Scrapes, figures=VLLM_FIGURES) -> LatencySource:
    return LatencySource("http://127.0.0.1:1/metrics", E2E, fetch=scrapes.fetch, clock=scrapes.clock,
                         figures=figures)


def test_window_figures_are_deltas_and_gauges() -> None:
    s = Scrapes(vllm_text(10, 1.0, 300, 0, 1, ttft=(0.2, 10), queue=(0.1, 10)),
                vllm_text(30, 5.0, 900, 3, 2, ttft=(1.2, 30), queue=(0.5, 30)))
    src = source(s)
    src.prime()
    r = src.read()
    assert r.requests == 20 and r.buckets == {"0.1": 10.0, "0.5": 10.0, "+Inf": 0.0}
    assert r.tokens_per_second == pytest.approx(600 / 5.0)
    assert (r.waiting, r.running) == (3.0, 2.0)
    assert r.ttft_mean_seconds == pytest.approx(1.0 / 20) and r.queue_mean_seconds == pytest.approx(0.4 / 20)
    # Not exported by this server: unknown, not zero.
    assert r.tpot_mean_seconds is None and r.prefill_mean_seconds is None and r.decode_mean_seconds is None


def test_a_histogram_with_no_new_observation_has_no_mean() -> None:
    s = Scrapes(vllm_text(10, 1.0, 300, 0, 0, ttft=(0.2, 10)), vllm_text(10, 1.0, 300, 0, 0, ttft=(0.2, 10)))
    src = source(s)
    src.prime()
    r = src.read()
    assert r.ttft_mean_seconds is None and r.tokens_per_second == 0.0 and r.buckets["+Inf"] == 0.0


def test_a_server_restart_counts_the_new_values_in_full() -> None:
    s = Scrapes(vllm_text(100, 10.0, 3000, 0, 0), vllm_text(4, 0.4, 120, 0, 0))
    src = source(s)
    src.prime()
    r = src.read()
    assert r.requests == 4 and r.tokens_per_second == pytest.approx(120 / 5.0)


def test_the_fault_gauge_is_never_read() -> None:
    assert not any(n.startswith("workload:") or "fault" in n for p in PRESETS.values()
                   for n in figure_names(p.figures))
    quiet = Scrapes(vllm_text(0, 0, 0, 0, 0), vllm_text(20, 2.0, 600, 1, 1, fault=0, ttft=(1.0, 20)))
    loud = Scrapes(vllm_text(0, 0, 0, 0, 0, fault=1), vllm_text(20, 2.0, 600, 1, 1, fault=1, ttft=(1.0, 20)))
    a, b = source(quiet), source(loud)
    a.prime()
    b.prime()
    assert a.read() == b.read()


def test_without_figures_only_the_histogram_is_read() -> None:
    s = Scrapes(vllm_text(0, 0, 0, 0, 0), vllm_text(2, 0.1, 60, 5, 1))
    src = source(s, figures=None)
    src.prime()
    r = src.read()
    assert r.requests == 2 and r.tokens_per_second is None and r.waiting is None


def test_tgi_figures() -> None:
    text = ("tgi_request_duration_bucket{le=\"1\"} 4\ntgi_request_duration_bucket{le=\"+Inf\"} 5\n"
            "tgi_request_duration_count 5\ntgi_request_duration_sum 3\n"
            "tgi_request_generated_tokens_sum {tok}\ntgi_request_generated_tokens_count 5\n"
            "tgi_queue_size 7\ntgi_batch_current_size 4\n"
            "tgi_request_queue_duration_sum {q}\ntgi_request_queue_duration_count {n}\n")
    fill = {"{tok}": ("0", "250"), "{q}": ("0", "1.0"), "{n}": ("0", "5")}
    first, second = text, text
    for key, (a, b) in fill.items():
        first, second = first.replace(key, a), second.replace(key, b)
    s = Scrapes(first, second)
    src = LatencySource("http://127.0.0.1:1/metrics", "tgi_request_duration", fetch=s.fetch, clock=s.clock,
                        figures=TGI_FIGURES)
    src.prime()
    r = src.read()
    assert r.tokens_per_second == pytest.approx(50.0) and (r.waiting, r.running) == (7.0, 4.0)
    assert r.queue_mean_seconds == pytest.approx(0.2) and r.ttft_mean_seconds is None
    assert PRESETS["tgi"].figures == TGI_FIGURES and PRESETS["workload"].figures == VLLM_FIGURES


def test_bucket_counts_repair_a_torn_scrape() -> None:
    assert bucket_counts({0.1: 3.0, 0.5: 2.0, float("inf"): 6.0}) == {"0.1": 3.0, "0.5": 0.0, "+Inf": 3.0}


def test_only_the_read_families_are_parsed_and_they_read_the_same() -> None:
    """relevant_text keeps the read families' samples and # lines; everything else never reaches the parser."""
    registry = CollectorRegistry()
    hist = Histogram("vllm:e2e_request_latency_seconds", "latency", buckets=(0.1, 1.0), registry=registry)
    tokens = Counter("vllm:generation_tokens", "tokens", registry=registry)
    noise = Histogram("vllm:e2e_request_latency_seconds_other", "a longer name", registry=registry)
    Counter("python_gc_objects_collected", "not read", ["generation"], registry=registry).labels("0").inc(5)
    for v in (0.05, 0.5, 2.0):
        hist.observe(v)
        noise.observe(v)
    tokens.inc(7)
    text = generate_latest(registry).decode()
    preset = PRESETS["workload"]
    src = LatencySource(preset.url, preset.metric, figures=preset.figures, fetch=lambda url, timeout: text)
    small = relevant_text(text, src._prefixes)
    assert "python_gc" not in small and "# TYPE vllm:e2e_request_latency_seconds histogram" in small
    kept, everything = filter_text(text, src._prefixes), filter_text(text, None)
    assert kept.text == small and everything.text.strip() == text.strip()
    assert src._parse(kept) == src._parse(everything)
    assert src._parse(kept)[1]["vllm:generation_tokens_total"] == {(): 7.0}
