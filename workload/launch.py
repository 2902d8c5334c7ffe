"""Start `python -m workload serve` (or the same model under gunicorn) as a child process and wait for its URL
(benchmarks, demos)."""

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from workload.api import ADMIN_TOKEN_ENV

URL_PATTERN = re.compile(r" at (http://[\d.]+:\d+)")
# gunicorn's master says "Listening at: http://127.0.0.1:PORT (PID)"; its workers say "serving" when built.
GUNICORN_URL_PATTERN = re.compile(r"Listening at: (http://[\d.]+:\d+)")


class LaunchError(RuntimeError):
    """The server exited or stayed silent before printing its URL."""


@dataclass
class Launched:
    proc: subprocess.Popen
    url: str
    token: str


@contextmanager
def launched_server(*flags: str, token: str = "bench-token", timeout_s: float = 90.0) -> Iterator[Launched]:
    # The token goes through the environment (/proc/PID/environ is readable by its owner only), never argv.
    proc = subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", "0", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0,
                            env={**os.environ, ADMIN_TOKEN_ENV: token})
    try:
        url = await_url(proc, timeout_s)
        yield Launched(proc, url, token)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@contextmanager
def launched_gunicorn(workers: int, token: str = "bench-token", timeout_s: float = 180.0,
                      metrics_dir: str | None = None) -> Iterator[Launched]:
    """The bundled model under gunicorn (docs/workload.md, "Under gunicorn"): a master and `workers` workers, one
    torch thread each, metrics summed over the workers. The URL is known once the master listens; the workers load
    the model after that, so wait for /health before sending load."""
    env = {**os.environ, ADMIN_TOKEN_ENV: token, "WORKLOAD_TORCH_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    if metrics_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "python:workload.gunicorn_conf", "-w", str(workers),
                             "-b", "127.0.0.1:0", "workload.wsgi:create()"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0, env=env)
    try:
        yield Launched(proc, await_url(proc, timeout_s, GUNICORN_URL_PATTERN), token)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the master stops its workers
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def await_url(proc: subprocess.Popen, timeout_s: float, pattern: re.Pattern[str] = URL_PATTERN) -> str:
    """The URL the server prints, read from its unbuffered (bufsize=0, bytes) stdout.

    An unbuffered pipe is what makes select() true: a buffered reader can take two lines in one read (a warning and
    the URL line), hand back the first, and leave the URL in its buffer while select() waits on an empty pipe.
    """
    deadline = time.monotonic() + timeout_s
    seen: list[str] = []
    while time.monotonic() < deadline and proc.poll() is None:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if not ready:
            continue
        line = proc.stdout.readline().decode(errors="replace")
        seen.append(line)
        match = pattern.search(line)
        if match:
            # Keep draining the log so a full pipe never stalls the server.
            threading.Thread(target=discard_output, args=(proc,), daemon=True).start()
            return match.group(1)
    if proc.poll() is not None:  # it exited: what it said last is the reason
        seen.append(proc.stdout.read().decode(errors="replace"))
    raise LaunchError(f"server printed no URL within {timeout_s}s (exit {proc.poll()}): {''.join(seen)[-500:]!r}")


def discard_output(proc: subprocess.Popen) -> None:
    while proc.stdout.read(65536):
        pass
