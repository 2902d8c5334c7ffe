"""Server metrics under vLLM's own names, so a vLLM scrape config reads this server unchanged."""

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# vLLM's bucket edges (vllm/engine/metrics.py) with finer edges prepended: the tiny CPU model answers
# in tens of milliseconds, and vLLM's first edge (0.3 s) would hide every quantile.
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


@dataclass
class ServerMetrics:
    """Every metric the server exports, registered on the registry given."""

    e2e: Histogram
    ttft: Histogram
    tpot: Histogram
    queue_time: Histogram
    prefill_time: Histogram
    decode_time: Histogram
    prompt_tokens: Counter
    generation_tokens: Counter
    running: Gauge
    waiting: Gauge
    batch_size: Histogram
    iteration_tokens: Histogram
    success: Counter
    rejected: Counter
    fault_active: Gauge
    engine_errors: Counter
    model_name: str

    def observe_step(self, batch_size: int, tokens: int) -> None:
        self.batch_size.labels(self.model_name).observe(batch_size)
        self.iteration_tokens.labels(self.model_name).observe(tokens)


def create_metrics(registry: CollectorRegistry, model_name: str) -> ServerMetrics:
    label = ["model_name"]

    def hist(name: str, doc: str, buckets: tuple) -> Histogram:
        return Histogram(name, doc, label, buckets=buckets, registry=registry)

    metrics = ServerMetrics(
        e2e=hist("vllm:e2e_request_latency_seconds", "End-to-end request latency in seconds.", E2E_BUCKETS),
        ttft=hist("vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS),
        tpot=hist("vllm:time_per_output_token_seconds", "Time per output token in seconds.", TPOT_BUCKETS),
        queue_time=hist("vllm:request_queue_time_seconds", "Time spent waiting before the first engine iteration.",
                        E2E_BUCKETS),
        prefill_time=hist("vllm:request_prefill_time_seconds", "Time from admission to the first token.",
                          E2E_BUCKETS),
        decode_time=hist("vllm:request_decode_time_seconds", "Time from the first token to the last.", E2E_BUCKETS),
        prompt_tokens=Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", label,
                              registry=registry),
        generation_tokens=Counter("vllm:generation_tokens", "Number of generation tokens processed.", label,
                                  registry=registry),
        # multiprocess_mode applies only under gunicorn with $PROMETHEUS_MULTIPROC_DIR (workload/wsgi.py):
        # the sum over live workers, so a dead worker's last value leaves the total.
        running=Gauge("vllm:num_requests_running", "Number of requests in the running batch.", label,
                      registry=registry, multiprocess_mode="livesum"),
        waiting=Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", label,
                      registry=registry, multiprocess_mode="livesum"),
        batch_size=hist("workload_batch_size", "Sequences decoded together in one engine iteration.",
                        BATCH_BUCKETS),
        iteration_tokens=Histogram("vllm:iteration_tokens_total", "Tokens per engine iteration (prefill + decode).",
                                   label, buckets=(1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
                                   registry=registry),
        success=Counter("vllm:request_success", "Count of successfully processed requests.",
                        label + ["finished_reason"], registry=registry),
        rejected=Counter("workload_requests_rejected", "Requests refused with 4xx/5xx before decoding.",
                         label + ["reason"], registry=registry),
        fault_active=Gauge("workload_fault_active",
                           "1 while the named fault switch is on; under gunicorn, the workers with it on.", ["fault"],
                           registry=registry, multiprocess_mode="livesum"),
        engine_errors=Counter("workload_engine_errors", "Engine iterations that raised; their requests failed.",
                              label, registry=registry),
        model_name=model_name,
    )
    # Touch every labelled child so each series exists, at zero, from the first scrape.
    for metric in (metrics.e2e, metrics.ttft, metrics.tpot, metrics.queue_time, metrics.prefill_time,
                   metrics.decode_time, metrics.prompt_tokens, metrics.generation_tokens,
                   metrics.running, metrics.waiting, metrics.batch_size, metrics.iteration_tokens,
                   metrics.engine_errors):
        metric.labels(model_name)
    return metrics
