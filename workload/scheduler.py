"""Iteration-level batching: waiting requests join the running batch between decode steps."""

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from workload.engine import Engine, Sequence
from workload.kvcache import PoolExhausted
from workload.metrics import ServerMetrics

log = logging.getLogger(__name__)


class QueueFull(RuntimeError):
    """The waiting queue is at its bound; the caller answers 429 with Retry-After."""


class NotServing(RuntimeError):
    """The scheduler has stopped; the caller answers 503."""


@dataclass
class Event:
    """What a request's consumer receives: a token, or the end (reason or error)."""

    kind: str  # "token" | "done" | "error"
    token: int = 0
    detail: str = ""


class EventSink(Protocol):
    def put(self, item: Event) -> None: ...


@dataclass
class Request:
    """A submitted completion: its sequence, output channel and timestamps."""

    seq: Sequence
    arrival: float
    prompt_len: int
    events: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    admitted_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    # Set when the server traces the request (workload/tracing.py): the e2e histogram's exemplar, and the
    # running batch's size at each of the request's steps (one int per token: bounded by max_tokens).
    trace_id: str | None = None
    batch_sizes: list[int] = field(default_factory=list)

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class SchedulerConfig:
    max_batch: int = 8
    batch_window_s: float = 0.005
    max_waiting: int = 64

    def __post_init__(self) -> None:
        if self.max_batch <= 0:
            raise ValueError(f"max_batch must be positive, got {self.max_batch!r}")
        if self.batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {self.batch_window_s!r}")
        if self.max_waiting <= 0:
            raise ValueError(f"max_waiting must be positive, got {self.max_waiting!r}")


StepHook = Callable[[int], None]


class Scheduler:
    """Owns the engine on one thread; `serving_lock` is held for each iteration."""

    def __init__(self, engine: Engine, config: SchedulerConfig, metrics: ServerMetrics,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.config = config
        self.metrics = metrics
        self.clock = clock
        self.serving_lock = threading.Lock()
        self.step_hooks: list[StepHook] = []
        self.lock_wait_seconds = 0.0
        self.steps = 0
        self.thread_native_id: int | None = None
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and not self._stop.is_set()

    def submit(self, seq: Sequence, prompt_len: int, arrival: float | None = None,
               events: EventSink | None = None, trace_id: str | None = None) -> Request:
        """`arrival` and `events` come from the API process when the engine runs in its own (engine_core.py)."""
        if not self.alive:
            raise NotServing("the scheduler is not running")
        request = Request(seq=seq, arrival=self.clock() if arrival is None else arrival, prompt_len=prompt_len,
                          trace_id=trace_id)
        if events is not None:
            request.events = events
        with self._cond:
            if len(self._waiting) >= self.config.max_waiting:
                raise QueueFull(f"{len(self._waiting)} requests already waiting (max {self.config.max_waiting})")
            self._waiting.append(request)
            self._gauges()
            self._cond.notify()
        return request

    def _gauges(self) -> None:
        self.metrics.waiting.labels(self.metrics.model_name).set(len(self._waiting))
        self.metrics.running.labels(self.metrics.model_name).set(len(self._running))

    def _run(self) -> None:
        self.thread_native_id = threading.get_native_id()
        while not self._stop.is_set():
            with self._cond:
                if not self._running and not self._waiting:
                    self._cond.wait(0.1)
                    continue
                if not self._running:
                    self._await_batch_window()
            try:
                self._iteration()
            except Exception as exc:  # a bad step must fail its requests, not wedge the server
                log.exception("engine iteration failed")
                self.metrics.engine_errors.labels(self.metrics.model_name).inc()
                self._fail_running(f"engine error: {exc}")

    def _await_batch_window(self) -> None:
        # Caller holds _cond. An idle engine waits briefly so a burst starts as one batch.
        deadline = self._waiting[0].arrival + self.config.batch_window_s
        while len(self._waiting) < self.config.max_batch and not self._stop.is_set():
            remaining = deadline - self.clock()
            if remaining <= 0:
                break
            self._cond.wait(remaining)

    def _iteration(self) -> None:
        started = self.clock()
        with self.serving_lock:
            self.lock_wait_seconds += self.clock() - started
            self._admit()
            self._drop_cancelled()
            batch = list(self._running)
            if not batch:
                return
            for hook in self.step_hooks:
                hook(len(batch))
            # Tokens the model runs this iteration: whole sequences for those (re)prefilled, one for the rest.
            full = [len(r.seq.tokens) for r in batch
                    if not self.engine.use_cache or r.seq.cache_len != len(r.seq.tokens) - 1]
            iteration_tokens = sum(full) + len(batch) - len(full)
            tokens = self.engine.step([r.seq for r in batch])
            self.steps += 1
        now = self.clock()
        self.metrics.observe_step(len(batch), iteration_tokens)
        self.metrics.generation_tokens.labels(self.metrics.model_name).inc(len(batch))
        for request, token in zip(batch, tokens):
            if request.trace_id is not None:
                request.batch_sizes.append(len(batch))
            if request.first_token_at is None:
                request.first_token_at = now
                self.metrics.ttft.labels(self.metrics.model_name).observe(now - request.arrival)
            request.events.put(Event("token", token))
            if request.seq.done:
                self._finish(request, now, "length")

    def _admit(self) -> None:
        with self._cond:
            while self._waiting and len(self._running) < self.config.max_batch:
                request = self._waiting[0]
                if request.cancelled.is_set():
                    self._waiting.popleft()
                    request.events.put(Event("done", detail="cancelled"))
                    continue
                try:
                    self.engine.admit(request.seq)
                except PoolExhausted:
                    break
                self._waiting.popleft()
                request.admitted_at = self.clock()
                self._running.append(request)
                self.metrics.prompt_tokens.labels(self.metrics.model_name).inc(request.prompt_len)
            self._gauges()

    def _drop_cancelled(self) -> None:
        for request in [r for r in self._running if r.cancelled.is_set()]:
            self._finish(request, self.clock(), "abort")

    def _finish(self, request: Request, now: float, reason: str) -> None:
        self.engine.release(request.seq)
        with self._cond:
            self._running.remove(request)
            self._gauges()
        name = self.metrics.model_name
        request.finished_at = now
        if reason == "length":
            if request.trace_id is not None:
                # OpenMetrics exemplar: a scrape that asks for OpenMetrics sees which trace a bucket's latest is.
                self.metrics.e2e.labels(name).observe(now - request.arrival, exemplar={"trace_id": request.trace_id})
            else:
                self.metrics.e2e.labels(name).observe(now - request.arrival)
            n = len(request.seq.generated)
            if n > 1 and request.first_token_at is not None:
                self.metrics.tpot.labels(name).observe((now - request.first_token_at) / (n - 1))
            # vLLM's split of a finished request: waiting, then prefill up to its first token, then decode.
            if request.admitted_at is not None and request.first_token_at is not None:
                self.metrics.queue_time.labels(name).observe(request.admitted_at - request.arrival)
                self.metrics.prefill_time.labels(name).observe(request.first_token_at - request.admitted_at)
                self.metrics.decode_time.labels(name).observe(now - request.first_token_at)
        self.metrics.success.labels(name, reason).inc()
        request.events.put(Event("done", detail=reason))

    def _fail_running(self, message: str) -> None:
        for request in list(self._running):
            self.engine.release(request.seq)
            request.events.put(Event("error", detail=message))
        with self._cond:
            self._running.clear()
            self._gauges()
