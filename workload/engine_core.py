"""The engine process of `serve --engine-process`: scheduler, batching, KV cache and model, titled EngineCore.

Started by the API process (workload/engine_client.py) as `python -m workload.engine_core`; it connects to the two
ZeroMQ sockets the API process bound, says Ready, then turns AddRequest/Abort/SetFault/DebugQuery messages into
scheduler calls and sends every token, end and metric update back. It ends on Shutdown, on SIGTERM, and when its
parent dies (PR_SET_PDEATHSIG, and a check of getppid() every poll in case the parent died before the prctl).
"""

import argparse
import ctypes
import logging
import os
import signal
import sys
import threading

import setproctitle
import torch
import zmq

from workload import engine_protocol as wire
from workload.config import preset
from workload.engine import Engine, Sequence, resolve_device
from workload.faults import FaultTuning, UnknownFault, build_faults, gc_debug
from workload.metric_ops import OpRecorder
from workload.scheduler import Event, NotServing, QueueFull, Request, Scheduler, SchedulerConfig

log = logging.getLogger("workload.engine_core")
PR_SET_PDEATHSIG = 1
POLL_MS = 200


class Outbox:
    """The output socket, shared by the scheduler thread (events) and the input loop (replies)."""

    def __init__(self, socket: zmq.Socket, recorder: OpRecorder) -> None:
        self.socket = socket
        self.recorder = recorder
        self._lock = threading.Lock()

    def send(self, message: wire.EngineOutput) -> None:
        with self._lock:
            self.socket.send(wire.encode(message))

    def event(self, request_id: str, event: Event) -> None:
        # Metric updates travel with the event that follows them, under one lock, so they arrive in order.
        with self._lock:
            out = wire.Outputs([(request_id, event.kind, event.token, event.detail)], self.recorder.drain())
            self.socket.send(wire.encode(out))

    def flush_metrics(self) -> None:
        with self._lock:
            ops = self.recorder.drain()
            if ops:
                self.socket.send(wire.encode(wire.Outputs([], ops)))


class RequestEvents:
    """What the scheduler takes for a request's event queue: each event goes straight back to the API process."""

    def __init__(self, outbox: Outbox, request_id: str) -> None:
        self.outbox = outbox
        self.request_id = request_id

    def put(self, item: Event) -> None:
        self.outbox.event(self.request_id, item)


def die_with_parent(parent: int) -> None:
    # SIGTERM rather than SIGKILL, so the engine still switches its faults off (hogs, nft table) on the way out.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the parent died before the prctl took effect
        sys.exit(0)


class EngineCore:
    """One engine: its scheduler and faults, driven by the messages of the input socket."""

    def __init__(self, args: argparse.Namespace, outbox: Outbox, recorder: OpRecorder) -> None:
        config = preset(args.model)
        self.engine = Engine(config, n_slots=args.max_batch, device=resolve_device(args.device),
                             use_cache=not args.no_cache)
        self.scheduler = Scheduler(self.engine, SchedulerConfig(args.max_batch, args.batch_window_ms / 1000,
                                                                args.max_waiting), recorder.metrics(config.name))
        self.faults = build_faults(self.scheduler, args.port, FaultTuning(), lambda name, active: None)
        self.outbox = outbox
        self.requests: dict[str, Request] = {}

    def handle(self, message: wire.EngineInput) -> bool:
        """Acts on one message; False once told to shut down."""
        if isinstance(message, wire.AddRequest):
            self._add(message)
        elif isinstance(message, wire.Abort):
            request = self.requests.pop(message.id, None)
            if request is not None:
                request.cancel()
        elif isinstance(message, wire.SetFault):
            self._set_fault(message)
        elif isinstance(message, wire.DebugQuery):
            self.outbox.send(wire.Reply(message.seq, None, self.debug()))
        elif isinstance(message, wire.Shutdown):
            return False
        return True

    def _add(self, message: wire.AddRequest) -> None:
        seq = Sequence(list(message.tokens), message.max_tokens, message.temperature, message.seed)
        events = RequestEvents(self.outbox, message.id)
        try:
            request = self.scheduler.submit(seq, prompt_len=len(message.tokens), arrival=message.arrival,
                                            events=events)
        except (QueueFull, NotServing) as exc:
            events.put(Event("error", detail=str(exc)))
            return
        self.requests[message.id] = request
        # Finished requests leave the table at the next add; it never holds more than the live ones and a few.
        for rid in [rid for rid, r in self.requests.items() if r.seq.done or r.cancelled.is_set()]:
            del self.requests[rid]

    def _set_fault(self, message: wire.SetFault) -> None:
        try:
            self.faults.set(message.name, message.on)
        except UnknownFault as exc:
            self.outbox.send(wire.Reply(message.seq, f"unknown: {exc.args[0]}", {}))
            return
        except (OSError, RuntimeError) as exc:
            self.outbox.send(wire.Reply(message.seq, str(exc), {}))
            return
        self.outbox.send(wire.Reply(message.seq, None, self.faults.active()))

    def debug(self) -> dict:
        scheduler, pool = self.scheduler, self.engine.pool
        return {
            "pid": os.getpid(),
            "scheduler_tid": scheduler.thread_native_id,
            "threads": [t.name for t in threading.enumerate()],
            "steps": scheduler.steps,
            "lock_wait_seconds": scheduler.lock_wait_seconds,
            "gc": gc_debug(),
            "kv_pool": {"slots": pool.n_slots, "free": pool.free, "allocations": pool.allocations,
                        "bytes": pool.nbytes},
            "use_cache": self.engine.use_cache,
            "faults": self.faults.active(),
            "cpuhog_pids": getattr(self.faults.faults.get("cpuhog"), "pids", []),
            "io_syncs": getattr(self.faults.faults.get("io"), "syncs", 0),
        }


def run(args: argparse.Namespace) -> int:
    die_with_parent(args.parent)
    setproctitle.setproctitle(wire.ENGINE_TITLE)
    # Ctrl-C in a terminal reaches the whole process group: the API process decides when the engine stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    torch.set_num_threads(args.threads)
    context = zmq.Context()
    inbox = context.socket(zmq.PULL)
    outbox_socket = context.socket(zmq.PUSH)
    for socket in (inbox, outbox_socket):
        socket.setsockopt(zmq.LINGER, 0)
    inbox.connect(args.input)
    outbox_socket.connect(args.output)
    recorder = OpRecorder()
    outbox = Outbox(outbox_socket, recorder)
    core: EngineCore | None = None
    try:
        core = EngineCore(args, outbox, recorder)
        core.scheduler.start()
        outbox.send(wire.Ready(os.getpid()))
        while True:
            if not inbox.poll(POLL_MS):
                if os.getppid() != args.parent:
                    log.warning("the API process %d is gone: stopping", args.parent)
                    break
                outbox.flush_metrics()
                continue
            if not core.handle(wire.decode_input(inbox.recv())):
                break
    except KeyboardInterrupt:
        pass
    finally:
        if core is not None:
            core.faults.all_off()
            core.scheduler.stop()
        context.destroy(linger=0)
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m workload.engine_core",
                                     description="started by `python -m workload serve --engine-process`")
    parser.add_argument("--input", required=True, help="ZeroMQ address the requests come from")
    parser.add_argument("--output", required=True, help="ZeroMQ address the outputs go to")
    parser.add_argument("--parent", type=int, required=True, help="pid of the API process")
    parser.add_argument("--port", type=int, required=True, help="the API's port (the netloss fault targets it)")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--batch-window-ms", type=float, default=5.0)
    parser.add_argument("--max-waiting", type=int, default=64)
    parser.add_argument("--no-cache", action="store_true")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
