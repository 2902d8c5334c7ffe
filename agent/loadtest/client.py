"""Open-loop Poisson load over the OpenAI completions API (streamed), one thread per request in flight."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from workload.sse import events

WORDS = ("the", "model", "token", "cache", "batch", "latency", "kernel", "python", "request", "stream",
         "tensor", "layer", "attention", "queue", "server", "probe")


@dataclass(frozen=True)
class Shape:
    """The requests' sizes and the client's limits."""

    prompt_bytes: tuple[int, int] = (64, 256)
    max_tokens: tuple[int, int] = (16, 48)
    timeout_s: float = 30.0
    max_inflight: int = 256
    model: str | None = None  # vLLM needs the served model's name; the bundled server ignores it


@dataclass
class Outcome:
    """One request as the client saw it: `kind` is 'ok' or the error kind (429, 5xx, 4xx, timeout, connection)."""

    at: float  # seconds since the step began (arrival time)
    kind: str
    latency_s: float
    ttft_s: float | None = None
    tokens: int = 0
    detail: str = ""


@dataclass
class StepLoad:
    """The outcomes of one step; `dropped` arrivals found max_inflight requests outstanding and were not sent."""

    rate: float
    planned_s: float
    outcomes: list[Outcome] = field(default_factory=list)
    dropped: int = 0
    sent_s: float = 0.0  # how long arrivals were sent (less than planned when stopped early)
    stopped_early: str | None = None  # why, when the SLO was clearly broken before the step ended


class Endpoint:
    """Where completions go: checked once so a bad URL is one clear line, not one error per request."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"expected an http://HOST:PORT URL, got {url!r}")
        try:
            self.port = parts.port or 80
        except ValueError:
            raise ValueError(f"the port in {url!r} is not a number in 1..65535") from None
        self.url, self.host, self.base = url, parts.hostname, parts.path.rstrip("/")

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


def make_prompt(rng: random.Random, n_bytes: int) -> str:
    words: list[str] = []
    length = -1
    while length < n_bytes:
        words.append(rng.choice(WORDS))
        length += len(words[-1]) + 1
    return " ".join(words)[:n_bytes]


def _kind(status: int) -> str:
    if status == 429:
        return "429"
    return "5xx" if status >= 500 else "4xx"


class _OutOfTime(Exception):
    """The step ended (or was aborted) while a reply was still streaming."""


def _lines_until(lines: Iterable[bytes], expired: Callable[[], bool]) -> Iterator[bytes]:
    """`lines`, checked before each one: a server that keeps a stream alive with comment lines still ends on time."""
    for line in lines:
        if expired():
            raise _OutOfTime
        yield line


def complete(endpoint: Endpoint, prompt: str, max_tokens: int, seed: int, shape: Shape, abort: threading.Event,
             clock: Callable[[], float] = time.perf_counter) -> tuple[str, float, float | None, int, str]:
    """(kind, latency, ttft, tokens, detail) of one streamed completion."""
    body: dict = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8, "seed": seed, "stream": True}
    if shape.model:
        body["model"] = shape.model
    start = clock()
    deadline = start + shape.timeout_s
    conn = endpoint.connection(shape.timeout_s)
    ttft: float | None = None
    tokens = 0
    try:
        conn.request("POST", f"{endpoint.base}/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            return _kind(response.status), clock() - start, None, 0, response.read(300).decode(errors="replace")
        for chunk in events(_lines_until(response, lambda: abort.is_set() or clock() > deadline)):
            if "error" in chunk:
                return "5xx", clock() - start, ttft, tokens, str(chunk["error"].get("message", ""))[:300]
            choice = (chunk.get("choices") or [{}])[0]
            # The bundled server sends token ids; vLLM and TGI send text, one token per chunk.
            n = len(choice.get("token_ids") or []) or (1 if choice.get("text") else 0)
            if n and ttft is None:
                ttft = clock() - start
            tokens += n
        return "ok", clock() - start, ttft, tokens, ""
    except _OutOfTime:
        return "timeout", clock() - start, ttft, tokens, "still streaming when the step's time ran out"
    except TimeoutError as exc:
        return "timeout", clock() - start, ttft, tokens, str(exc)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return "connection", clock() - start, ttft, tokens, f"{type(exc).__name__}: {exc}"
    finally:
        conn.close()


StopCheck = Callable[[list[Outcome], list[float], float], str | None]


def run_step(endpoint: Endpoint, rate: float, seconds: float, shape: Shape, seed: int,
             stop_check: StopCheck | None = None, interrupt: threading.Event | None = None,
             on_sent: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter) -> StepLoad:
    """Send Poisson arrivals at `rate` for `seconds`, whether or not earlier ones finished (open loop).

    `stop_check(finished, inflight_arrival_times, elapsed)` is asked about once a second; a reason
    stops sending. `on_sent` runs the moment sending ends (the step's measurement window closes there).
    Requests still in flight get `timeout_s` to finish, then are cut and count as timeouts.
    """
    rng = random.Random(seed)
    load = StepLoad(rate, seconds)
    lock = threading.Lock()
    abort = threading.Event()
    inflight: dict[int, float] = {}
    threads: list[threading.Thread] = []

    def send(i: int, at: float, prompt: str, max_tokens: int, req_seed: int) -> None:
        kind, latency, ttft, tokens, detail = complete(endpoint, prompt, max_tokens, req_seed, shape, abort, clock)
        with lock:
            inflight.pop(i, None)
            load.outcomes.append(Outcome(at, kind, latency, ttft, tokens, detail))

    start = clock()
    next_at = rng.expovariate(rate)
    next_check = 1.0
    i = 0
    while next_at < seconds:
        now = clock() - start
        if interrupt is not None and interrupt.is_set():
            load.stopped_early = "interrupted"
            break
        if now >= next_check and stop_check is not None:
            next_check = now + 1.0
            with lock:
                finished, pending = list(load.outcomes), list(inflight.values())
            if (why := stop_check(finished, pending, now)) is not None:
                load.stopped_early = why
                break
        if now < next_at:
            time.sleep(min(next_at - now, max(0.0, next_check - now), 0.25) or 0.001)
            continue
        prompt = make_prompt(rng, rng.randint(*shape.prompt_bytes))
        max_tokens, req_seed = rng.randint(*shape.max_tokens), rng.randrange(2**31)
        with lock:
            full = len(inflight) >= shape.max_inflight
            if not full:
                inflight[i] = next_at
        if full:
            load.dropped += 1
        else:
            thread = threading.Thread(target=send, args=(i, next_at, prompt, max_tokens, req_seed), daemon=True,
                                      name=f"loadtest-{i}")
            thread.start()
            threads.append(thread)
        i += 1
        next_at += rng.expovariate(rate)
        if i % 256 == 0:
            threads = [t for t in threads if t.is_alive()]
    load.sent_s = min(clock() - start, seconds)
    if on_sent is not None:
        on_sent()
    drain_until = clock() + shape.timeout_s
    for thread in threads:
        thread.join(max(0.0, drain_until - clock()))
    abort.set()
    for thread in threads:
        thread.join(5.0)  # cut streams notice `abort` at their next chunk
    return load
