"""A steady open-loop Poisson load on the bundled server, running until stopped, sliced later by time."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass

from workload.client import complete
from workload.loadgen import make_prompt


@dataclass(frozen=True)
class Done:
    """One request: when it was sent (monotonic), how long it took, tokens received."""

    sent_at: float
    latency_s: float
    tokens: int
    ok: bool

    @property
    def finished_at(self) -> float:
        return self.sent_at + self.latency_s


class OpenLoop:
    """Sends requests at Poisson arrivals of `rate` per second whether or not earlier ones finished."""

    def __init__(self, url: str, rate: float, seed: int = 13, prompt_bytes: tuple[int, int] = (64, 256),
                 max_tokens: tuple[int, int] = (16, 48), max_inflight: int = 64, timeout_s: float = 60.0) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0 requests per second, got {rate!r}")
        self.url = url
        self.rate = rate
        self._rng = random.Random(seed)
        self._prompt_bytes = prompt_bytes
        self._max_tokens = max_tokens
        self._inflight = threading.Semaphore(max_inflight)
        self._timeout = timeout_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._done: list[Done] = []
        # Every arrival sent, with the tokens it asked for: what the load offered, finished or not.
        self._asked: list[tuple[float, int]] = []
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="openloop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def between(self, since: float, until: float) -> list[Done]:
        """Requests sent in [since, until) that have finished."""
        with self._lock:
            return [d for d in self._done if since <= d.sent_at < until]

    def tokens_finished(self, since: float, until: float) -> int:
        """Tokens of the requests that finished in [since, until): the server's output rate, seen from outside.

        Counted here rather than scraped from the server, whose /metrics waits behind busy
        request threads for tens of seconds when the host is starved."""
        with self._lock:
            return sum(d.tokens for d in self._done if d.ok and since <= d.finished_at < until)

    def tokens_asked(self, since: float, until: float) -> int:
        """Tokens asked for by the requests sent in [since, until): the offered load of that stretch.

        An open loop's output in a stretch follows its arrivals, so output is compared with this (served over
        asked) rather than with another stretch's output, whose arrivals differ."""
        with self._lock:
            return sum(n for sent, n in self._asked if since <= sent < until)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            next_at += self._rng.expovariate(self.rate)
            if self._stop.wait(max(0.0, next_at - time.monotonic())):
                return
            if not self._inflight.acquire(blocking=False):
                self.dropped += 1
                continue
            prompt = make_prompt(self._rng, self._rng.randint(*self._prompt_bytes))
            n = self._rng.randint(*self._max_tokens)
            with self._lock:
                self._asked.append((time.monotonic(), n))
            threading.Thread(target=self._send, args=(prompt, n, self._rng.randrange(2**31)), daemon=True).start()

    def _send(self, prompt: str, max_tokens: int, seed: int) -> None:
        sent = time.monotonic()
        try:
            result = complete(self.url, prompt, max_tokens, 0.8, seed, timeout=self._timeout)
            with self._lock:
                self._done.append(Done(sent, result.latency_s, len(result.token_ids), result.ok))
        finally:
            self._inflight.release()
