"""The processes a live scenario starts (workload server, load generator, outside commands), and their end."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("infersight.eval")

# The tree this agent runs from: the workload is started from it too, not from whatever is installed.
SOURCE_ROOT = Path(__file__).resolve().parents[2]
URL_PATTERN = re.compile(r" at (http://[\d.]+:(\d+))")
# The server reads its admin token from here, so it never shows in `ps` or /proc/PID/cmdline.
ADMIN_TOKEN_ENV = "WORKLOAD_ADMIN_TOKEN"


class EvalProcessError(RuntimeError):
    """A process the scenario needs would not start or answer; the message says which and why."""


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    port: int
    token: str

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Children:
    """Everything started for one scenario; stop_all() ends each, whatever state the run is in."""

    procs: list[subprocess.Popen] = field(default_factory=list)
    # Each outside command runs in its own session (process group), so its children end with it.
    groups: set[int] = field(default_factory=set)

    def add(self, proc: subprocess.Popen, group: bool = False) -> subprocess.Popen:
        self.procs.append(proc)
        if group:
            self.groups.add(proc.pid)
        return proc

    def stop(self, proc: subprocess.Popen, grace: float = 5.0) -> None:
        if proc.poll() is None:
            self._signal(proc, signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                self._signal(proc, signal.SIGKILL)
                proc.wait(5)
        elif proc.pid in self.groups:
            # The leader is gone but a child it left in its group may not be.
            self._signal(proc, signal.SIGKILL)
        self.groups.discard(proc.pid)
        if proc in self.procs:
            self.procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(list(self.procs)):
            self.stop(proc)

    def _signal(self, proc: subprocess.Popen, sig: int) -> None:
        try:
            if proc.pid in self.groups:
                os.killpg(proc.pid, sig)
            else:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass


def _niced(nice: int) -> list[str]:
    # Through nice(1), so every thread the program starts (and every child) inherits it: setpriority on a
    # running pid would reach its main thread only.
    return ["nice", "-n", str(nice)] if nice else []


def start_server(children: Children, cwd: Path, nice: int = 0, timeout: float = 120.0,
                 args: tuple[str, ...] = (), port: int = 0, env: dict[str, str] | None = None) -> Server:
    """`python -m workload serve --port PORT ARGS` (0: a free one) with a fresh admin token and `env` added to its
    environment; waits for its URL."""
    token = secrets.token_hex(16)
    env = {**_env(), **(env or {}), ADMIN_TOKEN_ENV: token, "PYTHONUNBUFFERED": "1"}
    argv = [*_niced(nice), sys.executable, "-m", "workload", "serve", "--port", str(port), *args]
    proc = children.add(subprocess.Popen(argv, cwd=cwd,
                                         env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, bufsize=0))
    deadline = time.monotonic() + timeout
    seen: list[str] = []
    assert proc.stdout is not None
    while time.monotonic() < deadline and proc.poll() is None:
        # Unbuffered bytes (bufsize=0), so select() sees every byte not yet read: a buffered reader could take the
        # URL line in the same read as a warning before it and keep it where select() cannot see it.
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if not ready:
            continue
        line = proc.stdout.readline().decode(errors="replace")
        seen.append(line)
        if match := URL_PATTERN.search(line):
            threading.Thread(target=_drain, args=(proc, cwd / "server.log", seen), daemon=True,
                             name="eval-server-log").start()
            return Server(proc=proc, url=match.group(1), port=int(match.group(2)), token=token)
    if proc.poll() is not None:  # it exited: what it said last is the reason
        seen.append(proc.stdout.read().decode(errors="replace"))
    children.stop(proc)
    raise EvalProcessError(f"workload server printed no URL within {timeout:.0f}s (exit {proc.poll()}): "
                           f"{''.join(seen)[-400:]!r}")


def stop_server(children: Children, server: Server) -> None:
    """End the server as a deploy does (SIGTERM, then SIGKILL after 30 s); its port is free once this returns."""
    children.stop(server.proc, grace=30.0)


def free_port() -> int:
    """A TCP port free now on the loopback, for a server that must keep its port across restarts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(ADMIN_TOKEN_ENV, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SOURCE_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def _drain(proc: subprocess.Popen, path: Path, head: list[str]) -> None:
    # Keep reading so a full pipe never stalls the server; keep what it says for a failed run.
    assert proc.stdout is not None
    with open(path, "w") as out:
        out.writelines(head)
        # Buffered from here on: nothing select()s this pipe any more, and the raw pipe reads a line a byte at a time.
        for line in io.TextIOWrapper(io.BufferedReader(proc.stdout), errors="replace"):
            out.write(line)
            out.flush()


def start_load(children: Children, server: Server, schedule: str, max_tokens: str | None, seed: int,
               log_path: Path | None, nice: int = 0, requests_log: Path | None = None) -> subprocess.Popen:
    """`python -m workload load --schedule RATE:SECONDS,...` (open-loop Poisson), its summary to `log_path`, each
    finished request to `requests_log` as it finishes."""
    argv = [*_niced(nice), sys.executable, "-m", "workload", "load", "--url", server.url, "--schedule", schedule,
            "--seed", str(seed), "--no-progress", "--json"]
    if requests_log is not None:
        argv += ["--requests-log", str(requests_log)]
    if max_tokens:
        argv += ["--max-tokens", max_tokens]
    out = open(log_path, "w") if log_path else subprocess.DEVNULL  # noqa: SIM115 - the child owns it
    try:
        return children.add(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             env=_env()))
    finally:
        if log_path:
            out.close()


def start_command(children: Children, argv: list[str], log_path: Path | None) -> subprocess.Popen:
    """An outside command of a phase, in its own session so the whole group ends with the phase."""
    out = open(log_path, "a") if log_path else subprocess.DEVNULL  # noqa: SIM115 - the child owns it
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    except OSError as exc:
        raise EvalProcessError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
    finally:
        if log_path:
            out.close()
    return children.add(proc, group=True)


def set_fault(server: Server, name: str, on: bool, timeout: float = 30.0) -> None:
    """Switch a workload fault through its admin endpoint (the token travels in a header, never argv)."""
    body = json.dumps({"name": name, "on": on}).encode()
    req = urllib.request.Request(f"{server.url}/admin/faults", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {server.token}",
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        raise EvalProcessError(f"fault {name} {'on' if on else 'off'}: HTTP {exc.code}: "
                               f"{exc.read().decode(errors='replace')[:200]}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise EvalProcessError(f"fault {name} {'on' if on else 'off'}: {getattr(exc, 'reason', exc)}") from None


def fault_pids(server: Server, name: str | None, timeout: float = 30.0) -> tuple[int, ...]:
    """The pids of the processes a fault started beside the server (`cpuhog_pids` of /admin/debug: the cpuhog's
    spinners, wherever the fault is placed, the API process or the engine's), read once the fault is on. None
    started is an error: the phase would be scored against a culprit that never ran."""
    if name != "cpuhog":
        raise EvalProcessError(f"fault {name}: starts no processes of its own to record as the culprit")
    req = urllib.request.Request(f"{server.url}/admin/debug", headers={"Authorization": f"Bearer {server.token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            state = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise EvalProcessError(f"fault {name}: cannot read its processes: {getattr(exc, 'reason', exc)}") from None
    pids = list(state.get("cpuhog_pids") or []) + list((state.get("engine") or {}).get("cpuhog_pids") or [])
    if not pids:
        raise EvalProcessError(f"fault {name}: on, but the server lists none of its processes")
    return tuple(sorted(pids))


def resume(pid: int) -> None:
    """SIGCONT the server: a phase that stops it must never leave it stopped."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
