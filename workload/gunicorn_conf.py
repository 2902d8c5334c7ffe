"""gunicorn settings and hooks for workload.wsgi: threaded workers, one metrics directory summed over workers.

    gunicorn -c python:workload.gunicorn_conf -w 4 -b 127.0.0.1:8000 'workload.wsgi:create()'

prometheus_client is imported here only inside hooks: it picks its value store (in-process, or files under
$PROMETHEUS_MULTIPROC_DIR) once, at import, and the workers inherit the master's modules through fork.
"""

import os
import shutil
from pathlib import Path

from workload import scratch

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# Each worker batches the requests it holds at once; the sync worker holds one, so its scheduler never batches.
# gthread also keeps connections alive, so a client that switched a fault can reach the same worker again.
worker_class = "gthread"
threads = 16
keepalive = 5
# The app factory builds the engine in each worker (see workload.wsgi.create); a preloaded app would build it in
# the master, whose scheduler thread the workers would not inherit.
preload_app = False
# Four workers importing torch at once on a busy two-core host take well over gunicorn's default 30 s to boot.
timeout = 120
graceful_timeout = 15
# gunicorn 25's control socket defaults to one path per user (~/.gunicorn/gunicorn.ctl): two servers would share it.
control_socket_disable = True

_made_dir: list[str] = []


def on_starting(server) -> None:
    """Before any worker: a fresh metrics directory (files left by an earlier run would be summed into this one),
    then the workers' settings checked once, so a bad variable stops the master with one line, not four workers."""
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        directory = Path(given)
        if not directory.is_dir():
            raise SystemExit(f"workload: {MULTIPROC_ENV}={given!r} is not a directory")
        # Only prometheus_client's own files: the variable may name a directory that holds other things.
        for kind in ("counter", "gauge", "histogram", "summary"):
            for stale in directory.glob(f"{kind}_*.db"):
                stale.unlink()
    else:
        _made_dir.append(scratch.make("workload-metrics-"))  # a SIGKILLed master's is swept (workload.scratch)
        os.environ[MULTIPROC_ENV] = _made_dir[0]
    # Only now that the variable is set: this imports prometheus_client (and torch, which the workers then share).
    from workload.wsgi import Settings, SettingsError, admin_token

    try:
        admin_token(Settings.from_env(os.environ), {})  # {}: the token file only; $WORKLOAD_ADMIN_TOKEN stays
    except SettingsError as exc:
        on_exit(server)  # gunicorn calls it only for a master that started
        raise SystemExit(f"workload: {exc}") from None


def post_fork(server, worker) -> None:
    """In the new worker, before the app factory: what it needs to know of gunicorn's own settings."""
    address = worker.sockets[0].getsockname() if worker.sockets else None
    if isinstance(address, tuple):
        os.environ["WORKLOAD_PORT"] = str(address[1])
    os.environ["WORKLOAD_HTTP_THREADS"] = str(worker.cfg.threads)


def post_worker_init(worker) -> None:
    """After the app factory returned: the line that says this worker now answers (tests and operators wait on it)."""
    worker.log.info("workload: worker %s serving", worker.pid)


def worker_exit(server, worker) -> None:
    """In the worker, as it exits (recycled by max_requests, or shut down): faults off, scheduler stopped."""
    app = getattr(worker, "wsgi", None)
    if app is not None and "SERVING" in getattr(app, "config", {}):
        from workload.wsgi import shutdown

        shutdown(app)


def child_exit(server, worker) -> None:
    """In the master: the dead worker's live gauges leave the sum; its counters and histograms stay in it."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)


def on_exit(server) -> None:
    for directory in _made_dir:
        shutil.rmtree(directory, ignore_errors=True)
