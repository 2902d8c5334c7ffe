"""`make demo`: the bundled workload, a steady load and the agent with its status page, stopped by Ctrl-C."""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from agent import logs
from agent.config import Config, ConfigError, LatencySpec, TargetSpec, parse_listen
from agent.daemon import Agent, ListenError
from agent.demo_guard import (
    PIDS_FILE,
    DemoLock,
    DemoRunning,
    die_with_parent,
    port_in_use,
    record_children,
    stop_stale,
)
from agent.pidlock import AlreadyRunning
from agent.stop_signals import set_on_signal
from agent.store import StoreError
from workload.secretfile import write_secret

log = logging.getLogger("infersight.demo")

# The variable the workload would read its admin token from (workload/api.py): kept out of the server's environment,
# it reads the token file. The agent never imports the workload.
ADMIN_TOKEN_ENV = "WORKLOAD_ADMIN_TOKEN"


# A server that dies is restarted at most this many times in any RESTART_WINDOW_S (--restarts); past that the
# demo stops: a server that keeps dying has a problem a restart only hides.
DEFAULT_RESTARTS = 3
RESTART_WINDOW_S = 600.0
SERVER_START_S = 120.0


class GiveUp(Exception):
    """The demo stops; the message is the one line that says why."""


def _wait_http(url: str, timeout: float, stop: threading.Event | None = None,
               proc: subprocess.Popen | None = None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.5)
    return False


def _how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with status {returncode}"


def _stop(proc: subprocess.Popen, name: str) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop on SIGTERM; killing it", name)
            proc.kill()
            proc.wait()


def start_server(var: Path, port: int, token: str) -> subprocess.Popen:
    """The workload server, its admin token in a 0600 file it reads by path: never on the command line (any local
    user reads argv with ps, then could switch faults on a root-run server), and not in its environment either,
    whose first copy /proc/PID/environ keeps for the process's whole life."""
    write_secret(var / "admin-token", token)
    env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN_ENV}
    return subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", str(port),
                             "--pidfile", str(var / "workload.pid"),
                             "--admin-token-file", str(var / "admin-token")], env=env, preexec_fn=die_with_parent)


def _serves_pid(url: str, pid: int) -> bool:
    """The server answering at `url` is the process `pid` (its /health says which pid it is)."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return json.load(resp).get("pid") == pid
    except (OSError, ValueError):
        return False


class Workload:
    """The demo's server and its load, watched: a child that dies is reaped and said in one line. A dead server
    is restarted (and the load with it) so that the page shows the outage open and then resolve, which is what
    someone trying infersight by killing the server wants to see; a server that keeps dying (more than
    `restarts` times in RESTART_WINDOW_S) or does not come back stops the demo, which is then said too."""

    def __init__(self, var: Path, port: int, rate: float, duration: float | None, restarts: int,
                 stop: threading.Event, say=None) -> None:
        self.var, self.port, self.rate, self.duration = var, port, rate, duration
        self.url = f"http://127.0.0.1:{port}"
        self.restarts = restarts
        self.stop = stop
        self.say = say or (lambda line: print(f"make demo: {line}", file=sys.stderr, flush=True))
        self.server: subprocess.Popen | None = None
        self.load: subprocess.Popen | None = None
        self._deaths: collections.deque[float] = collections.deque()

    def start_server(self) -> None:
        """The server, up and answering as the process we started; GiveUp otherwise."""
        self.server = start_server(self.var, self.port, secrets.token_hex(16))
        self._record()
        if not _wait_http(f"{self.url}/health", SERVER_START_S, self.stop, self.server):
            if self.stop.is_set():
                return
            status = self.server.poll()
            raise GiveUp(f"the workload did not come up within {SERVER_START_S:.0f} s"
                         + (f" (it {_how_it_ended(status)})" if status is not None else ""))
        if not _serves_pid(self.url, self.server.pid):
            # Someone took the port between our check and the server's bind: never watch a stranger.
            raise GiveUp(f"another process answers on port {self.port}, not the workload we started; "
                         f"stop it or pick another with --port")

    def start_load(self) -> None:
        left = None if self.duration is None else max(1.0, self.duration)
        self.load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", self.url,
                                      "--rate", str(self.rate), "--duration", str(left or 7 * 86400),
                                      "--no-progress"], stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)
        self._record()

    def check(self) -> None:
        """Reap a child that ended (Popen.poll) and act on it; GiveUp when the demo must stop."""
        if self.server is not None and (status := self.server.poll()) is not None:
            dead = self.server
            self.server = None
            if self.load is not None:
                _stop(self.load, "load")  # no load firing at a dead port while the server is down
                self.load = None
            self._record()
            self._restart_or_give_up(f"the workload server (pid {dead.pid}) {_how_it_ended(status)}")
            self.start_server()
            if self.stop.is_set():
                return
            self.start_load()
            self.say(f"the workload server is back (pid {self.server.pid}), and the load with it")
        elif self.load is not None and (status := self.load.poll()) is not None:
            dead = self.load
            self.load = None
            self._restart_or_give_up(f"the load generator (pid {dead.pid}) {_how_it_ended(status)}")
            self.start_load()

    def _restart_or_give_up(self, what: str) -> None:
        now = time.monotonic()
        while self._deaths and now - self._deaths[0] > RESTART_WINDOW_S:
            self._deaths.popleft()
        if self.restarts == 0:
            raise GiveUp(f"{what}; stopping the demo (--restarts 0)")
        if len(self._deaths) >= self.restarts:
            raise GiveUp(f"{what}, after {len(self._deaths)} restarts in {RESTART_WINDOW_S / 60:.0f} minutes; "
                         f"stopping the demo")
        self._deaths.append(now)
        left = self.restarts - len(self._deaths)
        self.say(f"{what}; restarting it ({left} more restart{'s' if left != 1 else ''} in "
                 f"{RESTART_WINDOW_S / 60:.0f} minutes; the status page shows the outage meanwhile)")

    def close(self) -> None:
        for proc, name in ((self.load, "load"), (self.server, "workload")):
            if proc is not None:
                _stop(proc, name)
        self.load = self.server = None
        (self.var / PIDS_FILE).unlink(missing_ok=True)

    def _record(self) -> None:
        record_children(self.var, [(p.pid, name) for p, name in ((self.server, "workload"), (self.load, "load"))
                                   if p is not None])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--var", type=Path, default=Path("var"), help="folder for the store and pidfile")
    parser.add_argument("--port", type=int, default=8000, help="workload port")
    parser.add_argument("--listen", default="127.0.0.1:9464", help="agent status page address")
    parser.add_argument("--rate", type=float, default=2.0, help="load: requests per second (the workload's default load)")
    parser.add_argument("--duration", type=float, default=None, help="stop by itself after this many seconds")
    parser.add_argument("--restarts", type=int, default=DEFAULT_RESTARTS,
                        help=f"restart a workload server that dies at most this many times in "
                             f"{RESTART_WINDOW_S / 60:.0f} minutes, then stop the demo (0: stop at once)")
    args = parser.parse_args(argv)

    if os.geteuid() != 0:
        print("make demo: must run as root (BPF probes and py-spy need it)", file=sys.stderr)
        return 1
    if args.restarts < 0:
        parser.error(f"--restarts must be 0 or more, got {args.restarts}")
    try:
        listen_host, listen_port = parse_listen(args.listen)
    except ValueError as exc:
        print(f"make demo: --listen {exc}", file=sys.stderr)
        return 2
    logs.setup("info")
    args.var.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(args.var, 0o700)
    # Before anything else touches the folder: a second demo must leave the first and its children alone.
    lock = DemoLock(args.var)
    try:
        lock.acquire(f"http://{args.listen}/")
    except DemoRunning as exc:
        print(f"make demo: {exc}", file=sys.stderr)
        return 1
    try:
        return _run(args, listen_host, listen_port)
    finally:
        lock.release()


def _run(args: argparse.Namespace, listen_host: str, listen_port: int) -> int:
    for line in stop_stale(args.var):
        print(f"make demo: {line}", file=sys.stderr)
    for host, port, flag in (("127.0.0.1", args.port, "--port"), (listen_host, listen_port, "--listen")):
        if (busy := port_in_use(host, port)) is not None:
            print(f"make demo: {busy}; stop that process or pick another with {flag}", file=sys.stderr)
            return 1

    stop = threading.Event()
    signal.signal(signal.SIGTERM, set_on_signal(stop))
    workload = Workload(args.var, args.port, args.rate, args.duration, args.restarts, stop)
    agent: Agent | None = None
    loop_thread: threading.Thread | None = None
    status = 0
    try:
        workload.start_server()
        if stop.is_set():
            return 0
        workload.start_load()
        # The demo watches exactly the server it started (by pidfile), not every bundled server on the host.
        target = TargetSpec(name="workload", pidfile=(args.var / "workload.pid").resolve(),
                            latency=LatencySpec.from_preset("workload", url=f"{workload.url}/metrics"))
        try:
            agent = Agent(Config(store_dir=(args.var / "store").resolve(), listen=args.listen, targets=(target,)))
        except (ConfigError, StoreError, ListenError, AlreadyRunning) as exc:
            print(f"make demo: {exc}", file=sys.stderr)
            return 1
        agent.web.start()
        agent.loop.start()
        print(f"""
infersight demo is running (Ctrl-C stops everything)
  status page      {agent.web.url}/
  agent metrics    {agent.web.url}/metrics
  workload         {workload.url}/v1/completions   (metrics: {workload.url}/metrics)
  faults           .venv/bin/python -m workload fault gc on --url {workload.url} --token-file {args.var / 'admin-token'}
                   (gc, lock, syscall, netloss, cpuhog, nocache, io; 'off' to stop)
  store            {args.var / 'store'}
""", flush=True)
        if args.duration:
            threading.Timer(args.duration, stop.set).start()
        loop_thread = threading.Thread(target=agent.loop.run, args=(stop,), name="collect")
        loop_thread.start()
        while not stop.wait(0.5):
            workload.check()
    except GiveUp as exc:
        print(f"make demo: {exc}", file=sys.stderr, flush=True)
        status = 1
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if loop_thread is not None:
            loop_thread.join(timeout=60)
        if agent is not None:
            agent.close()
        workload.close()
        print("infersight demo stopped", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
