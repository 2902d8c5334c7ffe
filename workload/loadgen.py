"""`python -m workload load`: open-loop Poisson load with length distributions and a summary."""

import argparse
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

from workload.client import CompletionResult, complete
from workload.stats import Summary, percentile
from workload.tracing import LoadTracing, check_endpoint, provider

WORDS = ("the", "model", "token", "cache", "batch", "latency", "kernel", "python", "request", "stream",
         "tensor", "layer", "attention", "queue", "server", "probe")


@dataclass(frozen=True)
class Phase:
    rate: float  # requests per second
    duration_s: float

    def __post_init__(self) -> None:
        if self.rate < 0 or self.duration_s <= 0:
            raise ValueError(f"phase needs rate >= 0 and duration > 0, got {self.rate!r}:{self.duration_s!r}")


@dataclass(frozen=True)
class LoadSpec:
    """The arrival schedule and the request shapes; `seed` makes the arrivals reproducible."""

    phases: tuple[Phase, ...]
    prompt_bytes: tuple[int, int] = (64, 256)
    max_tokens: tuple[int, int] = (16, 48)
    temperature: float = 0.8
    seed: int = 0
    max_inflight: int = 256
    timeout_s: float = 60.0


@dataclass(frozen=True)
class Arrival:
    at: float
    prompt: str
    max_tokens: int
    seed: int


@dataclass
class Outcome:
    arrival: Arrival
    result: CompletionResult


@dataclass
class LoadResult:
    outcomes: list[Outcome] = field(default_factory=list)
    dropped: int = 0  # arrivals skipped because max_inflight requests were outstanding
    duration_s: float = 0.0


def parse_schedule(text: str) -> tuple[Phase, ...]:
    """'4:30,6:30' -> 4 req/s for 30 s, then 6 req/s for 30 s."""
    phases = []
    for part in text.split(","):
        try:
            rate, duration = part.split(":")
            phases.append(Phase(float(rate), float(duration)))
        except ValueError as exc:
            raise ValueError(f"schedule part {part!r} is not RATE:SECONDS ({exc})") from None
    return tuple(phases)


def make_prompt(rng: random.Random, n_bytes: int) -> str:
    words: list[str] = []
    length = -1  # the first word has no separator
    while length < n_bytes:
        words.append(rng.choice(WORDS))
        length += len(words[-1]) + 1
    return " ".join(words)[:n_bytes]


def arrivals(spec: LoadSpec) -> list[Arrival]:
    """Poisson arrivals: exponential gaps at each phase's rate."""
    return list(iter_arrivals(spec))


def iter_arrivals(spec: LoadSpec) -> Iterator[Arrival]:
    """arrivals() one at a time, so a day-long run does not build its whole plan up front."""
    rng = random.Random(spec.seed)
    start = 0.0
    for phase in spec.phases:
        t = start
        while phase.rate > 0:
            t += rng.expovariate(phase.rate)
            if t >= start + phase.duration_s:
                break
            yield Arrival(t, make_prompt(rng, rng.randint(*spec.prompt_bytes)),
                          rng.randint(*spec.max_tokens), rng.randrange(2**31))
        start += phase.duration_s


def run_load(url: str, spec: LoadSpec, progress: TextIO | None = None,
             clock: Callable[[], float] = time.perf_counter, sleep: Callable[[float], None] = time.sleep,
             tracing: LoadTracing | None = None, requests_log: TextIO | None = None) -> LoadResult:
    """Open loop: each arrival is sent at its time whether or not earlier ones have finished. With `tracing`, each
    request is a span of its own whose W3C traceparent the server continues. With `requests_log`, each finished
    request is written there as it finishes (request_line), so a watcher can bin what the clients saw by time."""
    plan = iter_arrivals(spec)
    total = sum(p.duration_s for p in spec.phases)
    result = LoadResult()
    lock = threading.Lock()
    inflight = threading.Semaphore(spec.max_inflight)
    threads: list[threading.Thread] = []

    def send(arrival: Arrival) -> None:
        try:
            span, headers = tracing.start(arrival.max_tokens) if tracing is not None else (None, {})
            outcome = complete(url, arrival.prompt, arrival.max_tokens, spec.temperature, arrival.seed,
                               timeout=spec.timeout_s, headers=headers)
            if span is not None:
                span.set_attribute("http.response.status_code", outcome.status)
                span.end()
            with lock:
                result.outcomes.append(Outcome(arrival, outcome))
                if requests_log is not None:
                    requests_log.write(request_line(time.time(), outcome) + "\n")
                    requests_log.flush()
        finally:
            inflight.release()

    start = clock()
    sent = 0
    for i, arrival in enumerate(plan):
        sent = i + 1
        if i % 256 == 255:
            threads = [t for t in threads if t.is_alive()]  # a long run must not keep every finished thread
        delay = start + arrival.at - clock()
        if delay > 0:
            sleep(delay)
        if not inflight.acquire(blocking=False):
            result.dropped += 1
            continue
        thread = threading.Thread(target=send, args=(arrival,), daemon=True)
        thread.start()
        threads.append(thread)
        if progress is not None:
            _progress(progress, clock() - start, total, i + 1, len(result.outcomes))
    for thread in threads:
        thread.join(spec.timeout_s + 5)
    result.duration_s = clock() - start
    if progress is not None:
        _progress(progress, result.duration_s, total, sent, len(result.outcomes))
        progress.write("\n")
    return result


def request_line(finished_at: float, result: CompletionResult) -> str:
    """One finished request as JSON: the wall-clock time its reply's last byte arrived (the clock the agent's windows
    use), its latency as the client measured it, and whether it succeeded."""
    return json.dumps({"end": round(finished_at, 6), "latency_s": round(result.latency_s, 6), "ok": result.ok},
                      separators=(",", ":"))


def _progress(out: TextIO, elapsed: float, total: float, sent: int, done: int) -> None:
    width = 30
    filled = min(width, int(width * elapsed / total)) if total else width
    out.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {elapsed:5.1f}/{total:.0f}s sent {sent} done {done}")
    out.flush()


def summarize(result: LoadResult, since: float = 0.0, until: float = float("inf")) -> Summary:
    """Summary of the outcomes whose arrival time lies in [since, until)."""
    chosen = [o for o in result.outcomes if since <= o.arrival.at < until]
    ok = [o.result for o in chosen if o.result.ok]
    errors = Counter(str(o.result.status) if o.result.status else "connection" for o in chosen if not o.result.ok)
    if result.dropped:
        errors["dropped"] = result.dropped
    window = min(until, result.duration_s) - since if until != float("inf") else result.duration_s - since
    window = max(window, 1e-9)
    latencies = [r.latency_s for r in ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    return Summary(
        duration_s=window, sent=len(chosen), ok=len(ok), errors=dict(errors),
        throughput_rps=len(ok) / window, tokens_per_s=sum(len(r.token_ids) for r in ok) / window,
        latency_p50=percentile(latencies, 50), latency_p95=percentile(latencies, 95),
        latency_p99=percentile(latencies, 99), ttft_p50=percentile(ttfts, 50),
        ttft_p95=percentile(ttfts, 95), ttft_p99=percentile(ttfts, 99),
    )


def _range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    bounds = (int(low), int(high or low))
    if bounds[0] < 0 or bounds[0] > bounds[1]:
        raise argparse.ArgumentTypeError(f"expected N or MIN-MAX with 0 <= MIN <= MAX, got {text!r}")
    return bounds


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload load")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--rate", type=float, default=2.0, help="requests per second (Poisson)")
    group.add_argument("--schedule", help="stepped load RATE:SECONDS,... e.g. 4:30,6:30")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds, with --rate")
    parser.add_argument("--prompt-bytes", type=_range, default=(64, 256), help="N or MIN-MAX, uniform")
    parser.add_argument("--max-tokens", type=_range, default=(16, 48), help="N or MIN-MAX, uniform")
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--otlp-endpoint", default=None, metavar="URL",
                        help="start a trace per request (sent as traceparent) and export its span to this "
                             "OTLP/HTTP endpoint; off by default")
    parser.add_argument("--requests-log", default=None, metavar="FILE",
                        help="append one JSON line per finished request (end time, latency, ok) as it finishes")
    args = parser.parse_args(argv)
    phases = parse_schedule(args.schedule) if args.schedule else (Phase(args.rate, args.duration),)
    spec = LoadSpec(phases, args.prompt_bytes, args.max_tokens, args.temperature, args.seed)
    tracing = None
    if args.otlp_endpoint is not None:
        try:
            tracing = LoadTracing(provider(check_endpoint(args.otlp_endpoint), "workload-loadgen"))
        except ValueError as exc:
            parser.error(str(exc))
    try:
        requests_log = open(args.requests_log, "a", encoding="utf-8") if args.requests_log else None  # noqa: SIM115
    except OSError as exc:
        parser.error(f"--requests-log {args.requests_log}: {exc.strerror or exc}")
    try:
        result = run_load(args.url, spec, progress=None if args.no_progress else sys.stderr, tracing=tracing,
                          requests_log=requests_log)
    except KeyboardInterrupt:
        print("load: interrupted", file=sys.stderr)
        return 130
    finally:
        if tracing is not None:
            tracing.shutdown()
        if requests_log is not None:
            requests_log.close()
    summary = summarize(result)
    print(json.dumps(summary.to_dict(), sort_keys=True) if args.json else summary.text())
    return 0 if summary.ok else 1
