"""The bundled server under gunicorn: `create()` is the app factory each pre-forked worker calls.

    gunicorn -c python:workload.gunicorn_conf -w 4 -b 127.0.0.1:8000 'workload.wsgi:create()'

Each worker is a whole server of its own (engine, scheduler, KV cache, fault switches); the config module
(workload/gunicorn_conf.py) sums their /metrics and cleans up after them. Settings come from the environment,
since gunicorn's command line is its own:

    WORKLOAD_MODEL            model preset (default tiny)
    WORKLOAD_DEVICE           auto, cpu or cuda (default auto)
    WORKLOAD_TORCH_THREADS    torch intra-op threads per worker (default 1)
    WORKLOAD_MAX_BATCH        sequences decoded together per worker (default 8)
    WORKLOAD_BATCH_WINDOW_MS  how long the scheduler waits to fill a batch (default 5)
    WORKLOAD_MAX_WAITING      queue bound per worker; beyond it 429 (default 64)
    WORKLOAD_MAX_PROMPT_BYTES longest prompt accepted (default 384)
    WORKLOAD_ADMIN_TOKEN_FILE file (mode 0600) holding the /admin token; else $WORKLOAD_ADMIN_TOKEN; else no /admin
    PROMETHEUS_MULTIPROC_DIR  where workers keep their metric values (the config module makes one if unset)

The config module's post_fork hook sets WORKLOAD_PORT (the bound port, for the netloss fault) and
WORKLOAD_HTTP_THREADS (gunicorn's --threads, which bounds the completions in flight) in each worker.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from flask import Flask
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from workload.api import ADMIN_TOKEN_ENV, Limits
from workload.config import preset
from workload.engine import Engine, resolve_device
from workload.faults import FaultTuning, build_faults
from workload.metrics import create_metrics
from workload.scheduler import Scheduler, SchedulerConfig
from workload.server import RESERVED_THREADS, Serving, create_app
from workload.tokenfile import TokenFileError, read_token_file

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
TOKEN_FILE_ENV = "WORKLOAD_ADMIN_TOKEN_FILE"
PORT_ENV = "WORKLOAD_PORT"
HTTP_THREADS_ENV = "WORKLOAD_HTTP_THREADS"


class SettingsError(ValueError):
    """An environment variable the factory cannot use; the message names it and its value."""


@dataclass(frozen=True)
class Settings:
    model: str = "tiny"
    device: str = "auto"
    torch_threads: int = 1
    max_batch: int = 8
    batch_window_ms: float = 5.0
    max_waiting: int = 64
    max_prompt_bytes: int = 384
    http_threads: int = 1
    port: int = 0
    admin_token_file: Path | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        token_file = env.get(TOKEN_FILE_ENV)
        settings = cls(
            model=env.get("WORKLOAD_MODEL", cls.model),
            device=env.get("WORKLOAD_DEVICE", cls.device),
            torch_threads=_positive_int(env, "WORKLOAD_TORCH_THREADS", cls.torch_threads),
            max_batch=_positive_int(env, "WORKLOAD_MAX_BATCH", cls.max_batch),
            batch_window_ms=_positive_float(env, "WORKLOAD_BATCH_WINDOW_MS", cls.batch_window_ms),
            max_waiting=_positive_int(env, "WORKLOAD_MAX_WAITING", cls.max_waiting),
            max_prompt_bytes=_positive_int(env, "WORKLOAD_MAX_PROMPT_BYTES", cls.max_prompt_bytes),
            http_threads=_positive_int(env, HTTP_THREADS_ENV, cls.http_threads),
            port=_positive_int(env, PORT_ENV, cls.port),
            admin_token_file=Path(token_file) if token_file else None,
        )
        try:
            preset(settings.model)
        except ValueError as exc:
            raise SettingsError(f"WORKLOAD_MODEL: {exc}") from None
        if settings.device not in ("auto", "cpu", "cuda"):
            raise SettingsError(f"WORKLOAD_DEVICE must be auto, cpu or cuda, got {settings.device!r}")
        return settings


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise SettingsError(f"{name} must be a positive int, got {raw!r}")
    return value


def _positive_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise SettingsError(f"{name} must be a positive number, got {raw!r}")
    return value


def admin_token(settings: Settings, env: dict[str, str]) -> str | None:
    """The token file wins over $WORKLOAD_ADMIN_TOKEN, which leaves this worker's environment either way (so the
    processes a fault starts never inherit it; the master still holds it for the workers it forks later)."""
    from_env = env.pop(ADMIN_TOKEN_ENV, None) or None
    if settings.admin_token_file is None:
        return from_env
    try:
        return read_token_file(settings.admin_token_file)
    except TokenFileError as exc:
        raise SettingsError(f"{TOKEN_FILE_ENV}: {exc}") from None


def build_serving(settings: Settings, token: str | None, multiproc_dir: str | None) -> Serving:
    """The same pieces `python -m workload serve` wires, for one worker; the scheduler is not started yet."""
    torch.set_num_threads(settings.torch_threads)
    config = preset(settings.model)
    engine = Engine(config, n_slots=settings.max_batch, device=resolve_device(settings.device))
    registry = CollectorRegistry()
    metrics = create_metrics(registry, config.name)
    scrape = registry
    if multiproc_dir:
        # Values live in files under the directory, one set per pid; a scrape of any worker reads them all.
        scrape = CollectorRegistry()
        MultiProcessCollector(scrape, path=multiproc_dir)
    scheduler = Scheduler(engine, SchedulerConfig(settings.max_batch, settings.batch_window_ms / 1000,
                                                  settings.max_waiting), metrics)
    faults = build_faults(scheduler, settings.port, FaultTuning(),
                          lambda name, active: metrics.fault_active.labels(name).set(int(active)))
    for name in faults.faults:
        metrics.fault_active.labels(name).set(0)
    limits = Limits(max_prompt_bytes=min(settings.max_prompt_bytes, config.max_seq - 2), max_seq=config.max_seq,
                    max_inflight=max(1, settings.http_threads - RESERVED_THREADS))
    return Serving(scheduler, metrics, scrape, faults, limits, token, config.name)


def create() -> Flask:
    """gunicorn's app factory, called in each worker after fork. Without --preload that is where the engine is
    built: torch's thread pool and the scheduler thread do not survive fork(), so a model built in the master
    would leave every worker with a dead scheduler (and torch may hang in its intra-op pool)."""
    settings = Settings.from_env(os.environ)
    serving = build_serving(settings, admin_token(settings, os.environ), os.environ.get(MULTIPROC_ENV))
    serving.scheduler.start()
    return create_app(serving)


def shutdown(app: Flask) -> None:
    """Switch every fault off (cpuhog children, the nftables table) and stop the scheduler: a worker's exit."""
    serving: Serving = app.config["SERVING"]
    serving.faults.all_off()
    serving.scheduler.stop()
