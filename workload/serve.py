"""`python -m workload serve`: build the engine, scheduler and faults, serve with waitress."""

import argparse
import logging
import os
import resource
import signal
import sys
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry
from waitress.server import create_server

from workload.api import ADMIN_TOKEN_ENV, Limits
from workload.config import preset
from workload.engine import Engine, resolve_device
from workload.engine_client import EngineClient, EngineError, EngineOptions
from workload.faults import FAULT_NAMES, FaultSet, FaultTuning, build_faults, build_faults_at
from workload.metrics import create_metrics
from workload.placement import PlacedFaults
from workload.scheduler import Scheduler, SchedulerConfig
from workload.server import MAX_BODY_BYTES, RESERVED_THREADS, Serving, create_app
from workload.tokenfile import TokenFileError, read_token_file
from workload.tracing import ServerTracing, check_endpoint, provider

log = logging.getLogger("workload.serve")

# waitress's defaults (100 connections, idle ones kept 120 s) let any local user's 100 idle sockets keep /health
# and /metrics from being accepted for minutes. Idle connections now go after 10-12 s, 1,000 fill the server,
# and poll() replaces select(), which cannot watch a descriptor above 1,024.
CONNECTION_LIMIT = 1000
CHANNEL_TIMEOUT = 10
CLEANUP_INTERVAL = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (the URL is printed)")
    parser.add_argument("--model", default="tiny", help="model preset: tiny (CPU default) or gpu")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads; 1 is fastest for the tiny model's small matmuls")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--batch-window-ms", type=float, default=5.0)
    parser.add_argument("--max-waiting", type=int, default=64, help="queue bound; beyond it 429 + Retry-After")
    parser.add_argument("--max-prompt-bytes", type=int, default=384)
    parser.add_argument("--http-threads", type=int, default=32)
    parser.add_argument("--no-cache", action="store_true", help="start with the KV cache disabled")
    parser.add_argument("--engine-process", action="store_true",
                        help="run the engine (scheduler, batching, KV cache, model) in a child process titled "
                             "infersight::EngineCore, fed over ZeroMQ as vLLM V1 does; HTTP, tokenisation and "
                             "/metrics stay in this one")
    parser.add_argument("--pidfile", type=Path)
    parser.add_argument("--otlp-endpoint", default=None, metavar="URL",
                        help="export a trace per completion (queue, prefill and decode spans, continuing the "
                             "client's traceparent) to this OTLP/HTTP endpoint, e.g. http://127.0.0.1:4318; off by "
                             "default; not with --engine-process")
    parser.add_argument("--admin-token-file", type=Path, default=None,
                        help=f"file (mode 0600) holding the token for /admin (else ${ADMIN_TOKEN_ENV}); "
                             "without one /admin is disabled")
    parser.add_argument("--admin-token", default=None,
                        help="the token itself: every local user can read it with ps; prefer the file or "
                             f"${ADMIN_TOKEN_ENV}")


def serve(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.otlp_endpoint is not None:
        if args.engine_process:
            raise SystemExit("workload: --otlp-endpoint needs the single-process server: with --engine-process the "
                             "requests' queue, prefill and decode moments stay in the engine process")
        try:
            check_endpoint(args.otlp_endpoint)
        except ValueError as exc:
            raise SystemExit(f"workload: {exc}") from None
    torch.set_num_threads(args.threads)
    config = preset(args.model)
    device = resolve_device(args.device)
    # Read (and taken out of our environment) before any process is started, so none inherits it.
    token = _admin_token(args)
    registry = CollectorRegistry()
    metrics = create_metrics(registry, config.name)
    # The app needs the bound port (netloss targets it), the server needs an app: bind first, wire after.
    apps: list = []
    _raise_nofile(CONNECTION_LIMIT + 256)
    server = create_server(lambda environ, start: apps[0](environ, start), host=args.host, port=args.port,
                           threads=args.http_threads, connection_limit=CONNECTION_LIMIT,
                           channel_timeout=CHANNEL_TIMEOUT, cleanup_interval=CLEANUP_INTERVAL, asyncore_use_poll=True,
                           clear_untrusted_proxy_headers=True, max_request_body_size=MAX_BODY_BYTES)
    port = int(server.effective_port)

    def on_change(name: str, active: bool) -> None:
        metrics.fault_active.labels(name).set(int(active))

    engine: Scheduler | EngineClient
    faults: FaultSet | PlacedFaults
    if args.engine_process:
        engine = EngineClient(EngineOptions(args.model, str(device), args.threads, args.max_batch,
                                            args.batch_window_ms, args.max_waiting, args.no_cache, port),
                              metrics, registry)
        api_faults = build_faults_at(engine.step_hooks, engine.serving_lock, None, port, FaultTuning(),
                                     lambda name, active: None)
        faults = PlacedFaults(api_faults, engine, on_change)
    else:
        scheduler = Scheduler(Engine(config, n_slots=args.max_batch, device=device, use_cache=not args.no_cache),
                              SchedulerConfig(args.max_batch, args.batch_window_ms / 1000, args.max_waiting), metrics)
        engine = scheduler
        faults = build_faults(scheduler, port, FaultTuning(), on_change)
    for name in FAULT_NAMES:
        metrics.fault_active.labels(name).set(0)
    limits = Limits(max_prompt_bytes=min(args.max_prompt_bytes, config.max_seq - 2), max_seq=config.max_seq,
                    max_inflight=max(1, args.http_threads - RESERVED_THREADS))
    tracing = (ServerTracing(provider(args.otlp_endpoint, "workload"), config.name)
               if args.otlp_endpoint is not None else None)
    apps.append(create_app(Serving(engine, metrics, registry, faults, limits, token, config.name, tracing)))

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        engine.start()
        if args.pidfile:
            args.pidfile.write_text(f"{os.getpid()}\n")
        url = f"http://{server.effective_host}:{port}"
        where = f"engine pid {engine.pid}, " if isinstance(engine, EngineClient) else ""
        print(f"workload: serving {config.name} on {device} at {url} (metrics {url}/metrics) {where}pid {os.getpid()}",
              flush=True)
        server.run()  # waitress returns from run() on KeyboardInterrupt
    except KeyboardInterrupt:
        pass  # a signal before run() started: shut down the same way
    except EngineError as exc:
        log.error("%s", exc)
        return 1
    finally:
        log.info("shutting down")
        faults.all_off()
        engine.stop()
        server.close()
        if tracing is not None:
            tracing.shutdown()  # the spans still queued go out (or time out) before exit
        if args.pidfile:
            args.pidfile.unlink(missing_ok=True)
    return 0


def _raise_nofile(want: int) -> None:
    """A soft open-file limit of 1,024 (a common default) is less than the connection limit: raise it towards
    `want` within the hard limit, and say so when that is not enough."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return
    new = want if hard == resource.RLIM_INFINITY else min(want, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new < want:
        log.warning("open-file limit %d is below the %d connections this server accepts: raise `ulimit -Hn`",
                    new, CONNECTION_LIMIT)


def _admin_token(args: argparse.Namespace) -> str | None:
    # Read once, then gone from our environment, so the processes we start (the cpuhog fault's, nft) never
    # inherit it. /proc/PID/environ of this process still shows it: the kernel keeps the environment the process
    # started with, and unsetenv() only edits libc's copy. Hence the file is the better way (docs/security.md).
    from_env = os.environ.pop(ADMIN_TOKEN_ENV, None) or None
    if args.admin_token:
        log.warning("--admin-token is on the command line, where every local user can read it (ps); "
                    "use --admin-token-file or $%s", ADMIN_TOKEN_ENV)
        return args.admin_token
    if args.admin_token_file is not None:
        try:
            return read_token_file(args.admin_token_file)
        except TokenFileError as exc:
            raise SystemExit(f"workload: {exc}") from None
    return from_env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload serve")
    add_arguments(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
