"""The API process's side of `serve --engine-process`: starts the engine process, feeds it, restarts it.

One thread ("engine-output") reads the engine's outputs, hands each token to its request's queue (the HTTP thread
detokenises it), applies the engine's metric updates to this process's registry, and watches the child: when it
dies, every request in flight gets an error event, the restart is counted and logged, and a new engine is started
on fresh sockets, with the engine faults that were on switched on again.
"""

import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import zmq
from prometheus_client import CollectorRegistry, Counter

from workload import engine_protocol as wire
from workload import scratch
from workload.engine import Sequence
from workload.metric_ops import apply
from workload.metrics import ServerMetrics
from workload.scheduler import Event, NotServing, QueueFull, StepHook

log = logging.getLogger("workload.engine_client")
POLL_MS = 200
READY_TIMEOUT_S = 180.0  # importing torch on a loaded 2-core host takes tens of seconds
REPLY_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
MAX_BACKOFF_S = 30.0


class EngineError(RuntimeError):
    """The engine process refused a command, did not answer it, or is not running."""


@dataclass
class EngineOptions:
    """What the engine process is started with (its command line)."""

    model: str
    device: str
    threads: int
    max_batch: int
    batch_window_ms: float
    max_waiting: int
    no_cache: bool
    port: int

    def argv(self, input_address: str, output_address: str) -> list[str]:
        argv = [sys.executable, "-m", "workload.engine_core", "--input", input_address, "--output", output_address,
                "--parent", str(os.getpid()), "--port", str(self.port), "--model", self.model,
                "--device", self.device, "--threads", str(self.threads), "--max-batch", str(self.max_batch),
                "--batch-window-ms", str(self.batch_window_ms),
                # The API process enforces the queue bound (EngineClient.submit); the engine's own never fires.
                "--max-waiting", str(self.max_batch + self.max_waiting)]
        return argv + (["--no-cache"] if self.no_cache else [])


@dataclass
class RemoteRequest:
    """A completion handed to the engine process, as the HTTP handlers see it (like scheduler.Request)."""

    id: str
    prompt_len: int
    client: "EngineClient"
    events: queue.Queue = field(default_factory=queue.Queue)
    finished: bool = False

    def cancel(self) -> None:
        if not self.finished:
            self.client.abort(self.id)


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    reply: wire.Reply | None = None
    error: str | None = None


class EngineClient:
    """Starts and feeds the engine process; `step_hooks` and `serving_lock` are the API's fault points."""

    def __init__(self, options: EngineOptions, metrics: ServerMetrics, registry: CollectorRegistry,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.metrics = metrics
        self.clock = clock
        self.step_hooks: list[StepHook] = []
        self.serving_lock = threading.Lock()
        self.lock_wait_seconds = 0.0
        self.output_tid: int | None = None
        self.restarts = 0
        self.bad_messages = 0
        self.restart_counter = Counter("workload_engine_restarts", "Engine processes restarted after one died.",
                                       ["model_name"], registry=registry)
        self.restart_counter.labels(metrics.model_name)
        # Engine faults switched on: switched on again in a restarted engine (the switch is the operator's).
        self.engine_faults: dict[str, bool] = {}
        self._context = zmq.Context()
        self._dir = scratch.make("workload-engine-")  # a SIGKILLed API process's is swept (workload.scratch)
        self._send_lock = threading.Lock()
        self._requests: dict[str, RemoteRequest] = {}
        self._requests_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._seq = 0
        self._generation = 0
        self._proc: subprocess.Popen | None = None
        self._input: zmq.Socket | None = None
        self._output: zmq.Socket | None = None
        self._ready = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-output", daemon=True)

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def alive(self) -> bool:
        return self._ready and not self._stop.is_set()

    def start(self) -> None:
        """Starts the first engine and waits for it; EngineError if it will not come up."""
        self._spawn()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(REPLY_TIMEOUT_S)
        self._end_child()
        self._close_sockets()
        self._context.destroy(linger=0)
        shutil.rmtree(self._dir, ignore_errors=True)

    def submit(self, seq: Sequence, prompt_len: int) -> RemoteRequest:
        if not self.alive:
            raise NotServing("the engine process is not running (restarting)")
        request = RemoteRequest(uuid.uuid4().hex, prompt_len, self)
        with self._requests_lock:
            # Running plus waiting: the queue bound of the single-process scheduler, counted here.
            if len(self._requests) >= self.options.max_batch + self.options.max_waiting:
                raise QueueFull(f"{len(self._requests) - self.options.max_batch} requests already waiting "
                                f"(max {self.options.max_waiting})")
            self._requests[request.id] = request
        try:
            self._send(wire.AddRequest(request.id, list(seq.tokens), seq.max_tokens, seq.temperature, seq.seed,
                                       self.clock()))
        except NotServing:
            with self._requests_lock:
                self._requests.pop(request.id, None)
            raise
        return request

    def abort(self, request_id: str) -> None:
        try:
            self._send(wire.Abort(request_id))
        except NotServing:
            pass  # no engine, so nothing of the request is left to free

    def set_fault(self, name: str, on: bool) -> dict[str, bool]:
        # The intent is kept even when the engine does not answer: a restarted engine gets the switch as last set.
        self.engine_faults[name] = on
        return self._ask(lambda seq: wire.SetFault(seq, name, on), f"fault {name}")

    def debug(self) -> dict:
        return self._ask(wire.DebugQuery, "debug")

    def kill(self) -> int:
        """SIGKILLs the engine process (a fault switch: the restart is what is exercised); returns its pid."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            raise EngineError("no engine process is running")
        proc.kill()
        return proc.pid

    def _send(self, message: wire.EngineInput) -> None:
        with self._send_lock:
            if self._input is None or not self._ready:
                raise NotServing("the engine process is not running (restarting)")
            try:
                # NOBLOCK: a PUSH socket whose engine died has no peer, and a blocking send would wait for ever.
                self._input.send(wire.encode(message), flags=zmq.NOBLOCK)
            except zmq.Again:
                raise NotServing("the engine process is not accepting requests (restarting)") from None

    def _ask(self, build: Callable[[int], wire.EngineInput], what: str) -> dict:
        with self._send_lock:
            self._seq += 1
            seq = self._seq
        pending = self._pending[seq] = _Pending()
        try:
            self._send(build(seq))
            if not pending.done.wait(REPLY_TIMEOUT_S):
                raise EngineError(f"{what}: the engine process did not answer within {REPLY_TIMEOUT_S:.0f}s")
        except NotServing as exc:
            raise EngineError(f"{what}: {exc}") from None
        finally:
            self._pending.pop(seq, None)
        if pending.error is not None:
            raise EngineError(f"{what}: {pending.error}")
        assert pending.reply is not None
        if pending.reply.error is not None:
            raise EngineError(pending.reply.error)
        return pending.reply.body

    def _spawn(self) -> None:
        """A new engine on new sockets (nothing queued for a dead one reaches it); waits for Ready."""
        self._generation += 1
        base = f"ipc://{self._dir}/engine{self._generation}"
        context = self._context
        input_socket, output_socket = context.socket(zmq.PUSH), context.socket(zmq.PULL)
        for socket in (input_socket, output_socket):
            socket.setsockopt(zmq.LINGER, 0)
        input_socket.bind(f"{base}-in")
        output_socket.bind(f"{base}-out")
        proc = subprocess.Popen(self.options.argv(f"{base}-in", f"{base}-out"), stdin=subprocess.DEVNULL)
        with self._send_lock:
            self._input, self._output, self._proc = input_socket, output_socket, proc
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise EngineError(f"the engine process exited with status {proc.returncode} before it was ready")
            if output_socket.poll(POLL_MS) and isinstance(wire.decode_output(output_socket.recv()), wire.Ready):
                break
        else:
            raise EngineError(f"the engine process sent no Ready within {READY_TIMEOUT_S:.0f}s")
        with self._send_lock:
            self._ready = True
        log.info("engine process %d ready (%s)", proc.pid, wire.ENGINE_TITLE)

    def _run(self) -> None:
        self.output_tid = threading.get_native_id()
        while not self._stop.is_set():
            output, proc = self._output, self._proc
            if output is not None and output.poll(POLL_MS):
                try:
                    self._handle(wire.decode_output(output.recv()))
                except (msgspec.DecodeError, ValueError) as exc:
                    # Our own engine sent it, so this is a bug: said loudly, and the loop (every request) goes on.
                    self.bad_messages += 1
                    log.error("unreadable message from the engine process (%d so far): %s", self.bad_messages, exc)
            elif proc is not None and proc.poll() is not None and not self._stop.is_set():
                self._restart(proc)

    def _handle(self, message: wire.EngineOutput) -> None:
        if isinstance(message, wire.Reply):
            pending = self._pending.get(message.seq)
            if pending is not None:
                pending.reply = message
                pending.done.set()
            return
        if not isinstance(message, wire.Outputs):
            return
        tokens = sum(1 for _, kind, _, _ in message.events if kind == "token")
        started = self.clock()
        # The API's own step: where faults switched `--in api` act, one hook call per engine output.
        with self.serving_lock:
            self.lock_wait_seconds += self.clock() - started
            if tokens:
                for hook in self.step_hooks:
                    hook(tokens)
        apply(self.metrics, message.metrics)
        for request_id, kind, token, detail in message.events:
            with self._requests_lock:
                request = self._requests.get(request_id)
                if request is not None and kind != "token":
                    del self._requests[request_id]
                    request.finished = True
            if request is not None:
                request.events.put(Event(kind, token, detail))

    def _restart(self, dead: subprocess.Popen) -> None:
        self.restarts += 1
        self.restart_counter.labels(self.metrics.model_name).inc()
        log.warning("engine process %d died (exit status %s); failing its requests and restarting it (restart %d)",
                    dead.pid, dead.returncode, self.restarts)
        with self._send_lock:
            self._ready = False
        message = f"the engine process died (exit status {dead.returncode}) with this request in flight"
        with self._requests_lock:
            lost, self._requests = self._requests, {}
        for request in lost.values():
            request.finished = True
            request.events.put(Event("error", detail=message))
        for pending in list(self._pending.values()):
            pending.error = "the engine process died before it answered"
            pending.done.set()
        # The running/waiting gauges were the dead engine's; nothing runs until the new one says otherwise.
        self.metrics.running.labels(self.metrics.model_name).set(0)
        self.metrics.waiting.labels(self.metrics.model_name).set(0)
        self._close_sockets()
        backoff = 1.0
        while not self._stop.is_set():
            try:
                self._spawn()
                break
            except EngineError as exc:
                log.error("engine restart failed: %s; trying again in %.0fs", exc, backoff)
                self._end_child()
                self._close_sockets()
                self._stop.wait(backoff)
                backoff = min(2 * backoff, MAX_BACKOFF_S)
        for name, on in list(self.engine_faults.items()):
            if on and not self._stop.is_set():
                self._reapply(name)

    def _reapply(self, name: str) -> None:
        # Called on the output thread, which is the one that reads replies: wait for this one here.
        seq = -self._generation
        try:
            self._send(wire.SetFault(seq, name, True))
        except NotServing as exc:
            log.error("fault %s could not be switched on again in the new engine: %s", name, exc)
            return
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while time.monotonic() < deadline and self._output is not None:
            if not self._output.poll(POLL_MS):
                continue
            message = wire.decode_output(self._output.recv())
            if isinstance(message, wire.Reply) and message.seq == seq:
                if message.error:
                    log.error("fault %s could not be switched on again in the new engine: %s", name, message.error)
                return
            self._handle(message)
        log.error("fault %s: the new engine did not answer within %.0fs", name, REPLY_TIMEOUT_S)

    def _end_child(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        try:
            self._send(wire.Shutdown())
        except NotServing:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            log.warning("engine process %d did not stop within %.0fs: killing it", proc.pid, STOP_GRACE_S)
            proc.kill()
            proc.wait(5)

    def _close_sockets(self) -> None:
        with self._send_lock:
            for socket in (self._input, self._output):
                if socket is not None:
                    socket.close(linger=0)
            self._input = self._output = None
