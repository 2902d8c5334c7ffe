"""Fixtures that start the bundled server as a real subprocess on a free port."""

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from workload.launch import LaunchError, await_url

REPO = Path(__file__).resolve().parents[2]
TOKEN = "test-admin-token"


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str
    pidfile: Path
    token: str = TOKEN

    @property
    def pid(self) -> int:
        return self.proc.pid


def start_server(tmp: Path, *extra: str, timeout: float = 60.0) -> ServerProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    pidfile = tmp / "workload.pid"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("WORKLOAD_ADMIN_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "workload", "serve", "--port", "0", "--admin-token", TOKEN,
         "--pidfile", str(pidfile), *extra],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0, env=env)
    try:
        return ServerProcess(proc, await_url(proc, timeout), pidfile)
    except LaunchError:
        stop_server(proc)
        raise


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def server_factory(tmp_path) -> Iterator:
    """Starts extra servers with their own flags; all are stopped after the test."""
    started: list[ServerProcess] = []

    def make(*extra: str) -> ServerProcess:
        started.append(start_server(tmp_path / f"s{len(started)}", *extra))
        return started[-1]

    yield make
    for each in started:
        stop_server(each.proc)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    started = start_server(tmp_path_factory.mktemp("server"))
    yield started
    stop_server(started.proc)
