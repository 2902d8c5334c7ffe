"""Flask app: OpenAI-style /v1/completions (SSE streaming), /health, /metrics, /admin."""

import hmac
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from flask import Blueprint, Flask, Response, current_app, jsonify, request
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from workload import tokenizer
from workload.api import ADMIN_TOKEN_ENV, BadRequest, Limits, parse_completion
from workload.engine import Sequence
from workload.engine_client import EngineClient, EngineError
from workload.faults import FaultSet, UnknownFault, gc_debug
from workload.metrics import ServerMetrics
from workload.placement import PlacedFaults
from workload.scheduler import NotServing, QueueFull, Request, Scheduler
from workload.tracing import ServerTracing, Timings, trace_id_hex

# A finished stream never waits longer than this for the next token before giving up.
TOKEN_TIMEOUT_S = 120.0
# A completion request is a prompt of a few hundred bytes and four numbers; waitress refuses a larger
# body from its headers, before reading it (serve.py passes this as max_request_body_size).
MAX_BODY_BYTES = 64 << 10
# HTTP threads kept free of completions for /health, /metrics and /admin.
RESERVED_THREADS = 4


@dataclass
class Serving:
    """Everything the handlers need; built by workload.serve and handed to create_app."""

    # The engine in this process (Scheduler), or in its own (EngineClient, `serve --engine-process`).
    scheduler: Scheduler | EngineClient
    metrics: ServerMetrics
    registry: CollectorRegistry
    faults: FaultSet | PlacedFaults
    limits: Limits
    admin_token: str | None
    model_name: str
    # Request traces (workload/tracing.py), with `serve --otlp-endpoint` only.
    tracing: ServerTracing | None = None


def _error(status: int, message: str, kind: str, headers: dict | None = None) -> Response:
    response = jsonify({"error": {"message": message, "type": kind, "code": status}})
    response.status_code = status
    for key, value in (headers or {}).items():
        response.headers[key] = value
    return response


def _serving() -> Serving:
    return current_app.config["SERVING"]


api = Blueprint("api", __name__)


@api.get("/health")
def health() -> Response:
    serving = _serving()
    if not serving.scheduler.alive:
        what = "engine process not running" if isinstance(serving.scheduler, EngineClient) else "scheduler stopped"
        return _error(503, what, "server_error")
    return jsonify({"status": "ok", "model": serving.model_name, "pid": os.getpid()})


@api.get("/v1/models")
def models() -> Response:
    return jsonify({"object": "list", "data": [{"id": _serving().model_name, "object": "model"}]})


@api.get("/metrics")
def metrics() -> Response:
    serving = _serving()
    # With traces on, OpenMetrics (the only format that carries the e2e histogram's exemplars) to a scraper that
    # lists it in Accept, as Prometheus does; the 0.0.4 text format otherwise. "allow-utf-8": our names are all
    # legal as they are, and prometheus_client's default escaping would rename `vllm:` samples to `vllm_` while
    # leaving their TYPE lines as `vllm:`.
    if serving.tracing is not None and "application/openmetrics-text" in request.headers.get("Accept", ""):
        return Response(openmetrics_latest(serving.registry, escaping="allow-utf-8"),
                        content_type=OPENMETRICS_CONTENT_TYPE)
    return Response(generate_latest(serving.registry), mimetype=CONTENT_TYPE_LATEST)


@api.post("/v1/completions")
def completions() -> Response:
    serving = _serving()
    try:
        body = request.get_json(silent=True)
    except RecursionError:
        body = None  # nested deeper than the JSON parser goes: not a completion request either
    if body is None:
        serving.metrics.rejected.labels(serving.model_name, "bad_json").inc()
        return _error(400, "body is not valid JSON (Content-Type: application/json)", "invalid_request_error")
    try:
        parsed = parse_completion(body, serving.limits)
    except BadRequest as exc:
        serving.metrics.rejected.labels(serving.model_name, "invalid").inc()
        return _error(400, str(exc), "invalid_request_error")
    inflight: threading.BoundedSemaphore | None = current_app.config.get("INFLIGHT")
    if inflight is not None and not inflight.acquire(blocking=False):
        serving.metrics.rejected.labels(serving.model_name, "queue_full").inc()
        return _error(429, f"{serving.limits.max_inflight} completions are in flight (the limit); retry",
                      "rate_limit_error", {"Retry-After": "1"})
    try:
        response = _submit(serving, parsed)
    except BaseException:
        if inflight is not None:
            inflight.release()
        raise
    if inflight is not None:
        # Runs when the server has sent the whole response, streamed or not, or the client went.
        response.call_on_close(inflight.release)
    return response


def _submit(serving: Serving, parsed) -> Response:
    prompt_ids = tokenizer.encode(parsed.prompt)
    seq = Sequence(prompt_ids, parsed.max_tokens, parsed.temperature, parsed.seed)
    completion_id = f"cmpl-{uuid.uuid4().hex[:24]}"
    span, traced = None, {}
    if serving.tracing is not None:
        arrival = time.monotonic()
        span = serving.tracing.start(request.headers, arrival, completion_id, parsed.max_tokens, parsed.temperature)
        traced = {"arrival": arrival, "trace_id": trace_id_hex(span)}
    try:
        submitted = serving.scheduler.submit(seq, prompt_len=len(prompt_ids), **traced)
    except (QueueFull, NotServing) as exc:
        if span is not None:
            span.end()
        serving.metrics.rejected.labels(serving.model_name,
                                        "queue_full" if isinstance(exc, QueueFull) else "not_serving").inc()
        if isinstance(exc, QueueFull):
            return _error(429, str(exc), "rate_limit_error", {"Retry-After": "1"})
        return _error(503, str(exc), "server_error", {"Retry-After": "5"})
    if parsed.stream:
        response = Response(_sse(submitted, completion_id, serving.model_name), mimetype="text/event-stream",
                            headers={"Cache-Control": "no-cache"})
    else:
        response = _complete(submitted, completion_id, serving.model_name)
    if span is not None and serving.tracing is not None:
        tracing = serving.tracing
        # When the whole answer has gone (or the client has): the request's moments are final by then.
        response.call_on_close(lambda: _end_span(tracing, span, submitted))
    return response


def _end_span(tracing: ServerTracing, span, submitted: Request) -> None:
    done = submitted.finished_at is not None and submitted.seq.done
    tracing.finish(span, Timings(
        arrival=submitted.arrival, admitted_at=submitted.admitted_at, first_token_at=submitted.first_token_at,
        finished_at=submitted.finished_at, batch_sizes=tuple(submitted.batch_sizes),
        prompt_tokens=submitted.prompt_len, completion_tokens=len(submitted.seq.generated),
        finish_reason="length" if done else "abort"))


def _events(submitted: Request) -> Iterator[tuple[str, int | str]]:
    while True:
        event = submitted.events.get(timeout=TOKEN_TIMEOUT_S)
        if event.kind == "token":
            yield "token", event.token
        else:
            yield event.kind, event.detail
            return


def _complete(submitted: Request, completion_id: str, model: str) -> Response:
    tokens: list[int] = []
    try:
        for kind, value in _events(submitted):
            if kind == "token":
                tokens.append(int(value))
            elif kind == "error":
                return _error(500, str(value), "server_error")
    finally:
        submitted.cancel()  # no-op once finished; frees the slot if we stopped waiting early
    return jsonify({
        "id": completion_id, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "text": tokenizer.decode(tokens), "logprobs": None, "finish_reason": "length",
                     "token_ids": tokens}],
        "usage": {"prompt_tokens": submitted.prompt_len, "completion_tokens": len(tokens),
                  "total_tokens": submitted.prompt_len + len(tokens)},
    })


def _sse(submitted: Request, completion_id: str, model: str) -> Iterator[bytes]:
    created = int(time.time())
    # Waitress closes this generator when the client goes away; `finally` frees the KV slot.
    try:
        for kind, value in _events(submitted):
            if kind == "token":
                choice = {"index": 0, "text": tokenizer.decode([int(value)]), "token_ids": [int(value)],
                          "logprobs": None, "finish_reason": None}
            elif kind == "error":
                yield f"data: {json.dumps({'error': {'message': value, 'type': 'server_error'}})}\n\n".encode()
                return
            else:
                choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": value}
            chunk = {"id": completion_id, "object": "text_completion", "created": created, "model": model,
                     "choices": [choice]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"
    finally:
        submitted.cancel()


admin = Blueprint("admin", __name__, url_prefix="/admin")


@admin.before_request
def check_token() -> Response | None:
    token = _serving().admin_token
    if not token:
        return _error(403, "admin endpoints are disabled: start the server with --admin-token-file or "
                           f"${ADMIN_TOKEN_ENV}", "permission_error")
    sent = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    if not hmac.compare_digest(sent.encode(), token.encode()):
        return _error(401, "missing or wrong admin token (Authorization: Bearer ...)", "permission_error")
    return None


@admin.get("/faults")
def list_faults() -> Response:
    return jsonify(_serving().faults.active())


@admin.post("/faults")
def set_fault() -> Response:
    body = request.get_json(silent=True)
    if not isinstance(body, dict) or not isinstance(body.get("name"), str) or not isinstance(body.get("on"), bool):
        return _error(400, f'expected {{"name": str, "on": bool}}, got {body!r}', "invalid_request_error")
    faults = _serving().faults
    place = body.get("in")
    if place is not None and not isinstance(faults, PlacedFaults):
        return _error(400, f"'in' ({place!r}) places a fault in the API or the engine process: this server runs both "
                           "in one process (start it with --engine-process)", "invalid_request_error")
    try:
        if isinstance(faults, PlacedFaults):
            faults.set(body["name"], body["on"], place if place is not None else "engine")
        else:
            faults.set(body["name"], body["on"])
    except UnknownFault as exc:
        return _error(404, str(exc.args[0]), "invalid_request_error")
    except ValueError as exc:
        return _error(400, str(exc), "invalid_request_error")
    except (OSError, RuntimeError) as exc:
        return _error(500, f"fault {body['name']!r} failed to switch: {exc}", "server_error")
    # Under gunicorn the switch lands in whichever worker took the request: say which.
    return jsonify({**faults.active(), "pid": os.getpid()})


@admin.post("/engine/kill")
def kill_engine() -> Response:
    """SIGKILLs the engine process; the API process restarts it (the `engine killed` scenario)."""
    engine = _serving().scheduler
    if not isinstance(engine, EngineClient):
        return _error(400, "this server runs its engine inside the API process: there is no engine process "
                           "to kill (start it with --engine-process)", "invalid_request_error")
    try:
        return jsonify({"killed": engine.kill()})
    except EngineError as exc:
        return _error(409, str(exc), "invalid_request_error")


@admin.get("/debug")
def debug() -> Response:
    serving = _serving()
    if isinstance(serving.scheduler, EngineClient):
        return jsonify(_engine_process_debug(serving, serving.scheduler))
    scheduler = serving.scheduler
    return jsonify({
        "pid": os.getpid(),
        "scheduler_tid": scheduler.thread_native_id,
        "threads": [t.name for t in threading.enumerate()],
        "steps": scheduler.steps,
        "lock_wait_seconds": scheduler.lock_wait_seconds,
        "gc": gc_debug(),
        "kv_pool": {"slots": scheduler.engine.pool.n_slots, "free": scheduler.engine.pool.free,
                    "allocations": scheduler.engine.pool.allocations, "bytes": scheduler.engine.pool.nbytes},
        "use_cache": scheduler.engine.use_cache,
        "faults": serving.faults.active(),
        "cpuhog_pids": getattr(serving.faults.faults.get("cpuhog"), "pids", []),
        "io_syncs": getattr(serving.faults.faults.get("io"), "syncs", 0),
    })


def _engine_process_debug(serving: Serving, client: EngineClient) -> dict:
    """The API process's own figures at the top, the engine process's (as a single-process server shows them)
    under "engine"; null with a reason when the engine does not answer."""
    faults = serving.faults
    assert isinstance(faults, PlacedFaults)
    try:
        engine: dict | None = client.debug()
        engine_error = None
    except EngineError as exc:
        engine, engine_error = None, str(exc)
    return {
        "pid": os.getpid(),
        "output_tid": client.output_tid,
        "threads": [t.name for t in threading.enumerate()],
        "lock_wait_seconds": client.lock_wait_seconds,
        "gc": gc_debug(),
        "faults": faults.placed(),
        "cpuhog_pids": getattr(faults.api.faults.get("cpuhog"), "pids", []),
        "io_syncs": getattr(faults.api.faults.get("io"), "syncs", 0),
        "engine_pid": client.pid,
        "engine_restarts": client.restarts,
        "engine": engine,
        "engine_error": engine_error,
    }


def _internal_error(exc: Exception) -> Response:
    return _error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def create_app(serving: Serving) -> Flask:
    app = Flask(__name__)
    app.register_error_handler(500, _internal_error)
    app.config["SERVING"] = serving
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    if serving.limits.max_inflight:
        app.config["INFLIGHT"] = threading.BoundedSemaphore(serving.limits.max_inflight)
    app.register_blueprint(api)
    app.register_blueprint(admin)
    return app
