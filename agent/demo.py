"""`make demo`: the bundled workload, a steady load and the agent with its status page, stopped by Ctrl-C."""

from __future__ import annotations

import argparse
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
from agent.demo_guard import PIDS_FILE, die_with_parent, port_in_use, record_children, stop_stale
from agent.pidlock import AlreadyRunning
from agent.stop_signals import set_on_signal
from agent.store import StoreError
from workload.secretfile import write_secret

log = logging.getLogger("infersight.demo")

# The variable the workload would read its admin token from (workload/api.py): kept out of the server's environment,
# it reads the token file. The agent never imports the workload.
ADMIN_TOKEN_ENV = "WORKLOAD_ADMIN_TOKEN"


def _wait_http(url: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return True
        except OSError:
            time.sleep(0.5)
    return False


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make demo", description=__doc__)
    parser.add_argument("--var", type=Path, default=Path("var"), help="folder for the store and pidfile")
    parser.add_argument("--port", type=int, default=8000, help="workload port")
    parser.add_argument("--listen", default="127.0.0.1:9464", help="agent status page address")
    parser.add_argument("--rate", type=float, default=2.0, help="load: requests per second (the workload's default load)")
    parser.add_argument("--duration", type=float, default=None, help="stop by itself after this many seconds")
    args = parser.parse_args(argv)

    if os.geteuid() != 0:
        print("make demo: must run as root (BPF probes and py-spy need it)", file=sys.stderr)
        return 1
    logs.setup("info")
    args.var.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(args.var, 0o700)
    for line in stop_stale(args.var):
        print(f"make demo: {line}", file=sys.stderr)
    try:
        listen_host, listen_port = parse_listen(args.listen)
    except ValueError as exc:
        print(f"make demo: --listen {exc}", file=sys.stderr)
        return 2
    for host, port, flag in (("127.0.0.1", args.port, "--port"), (listen_host, listen_port, "--listen")):
        if (busy := port_in_use(host, port)) is not None:
            print(f"make demo: {busy}; stop that process or pick another with {flag}", file=sys.stderr)
            return 1
    token = secrets.token_hex(16)
    server_url = f"http://127.0.0.1:{args.port}"

    server = start_server(args.var, args.port, token)
    children = [(server, "workload")]
    record_children(args.var, [(server.pid, "workload")])
    agent: Agent | None = None
    loop_thread: threading.Thread | None = None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, set_on_signal(stop))
    try:
        if not _wait_http(f"{server_url}/health", timeout=120) or server.poll() is not None:
            print(f"make demo: the workload did not come up within 120 s (exit status {server.poll()})",
                  file=sys.stderr)
            return 1
        if not _serves_pid(server_url, server.pid):
            # Someone took the port between our check and the server's bind: never watch a stranger.
            print(f"make demo: another process answers on port {args.port}, not the workload we started; "
                  f"stop it or pick another with --port", file=sys.stderr)
            return 1
        load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", server_url,
                                 "--rate", str(args.rate), "--duration", str(args.duration or 7 * 86400),
                                 "--no-progress"], stdout=subprocess.DEVNULL, preexec_fn=die_with_parent)
        children.append((load, "load"))
        record_children(args.var, [(server.pid, "workload"), (load.pid, "load")])
        # The demo watches exactly the server it started (by pidfile), not every bundled server on the host.
        target = TargetSpec(name="workload", pidfile=(args.var / "workload.pid").resolve(),
                            latency=LatencySpec.from_preset("workload", url=f"{server_url}/metrics"))
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
  workload         {server_url}/v1/completions   (metrics: {server_url}/metrics)
  faults           .venv/bin/python -m workload fault gc on --url {server_url} --token-file {args.var / 'admin-token'}
                   (gc, lock, syscall, netloss, cpuhog, nocache, io; 'off' to stop)
  store            {args.var / 'store'}
""", flush=True)
        if args.duration:
            threading.Timer(args.duration, stop.set).start()
        loop_thread = threading.Thread(target=agent.loop.run, args=(stop,), name="collect")
        loop_thread.start()
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if loop_thread is not None:
            loop_thread.join(timeout=60)
        if agent is not None:
            agent.close()
        for proc, name in reversed(children):
            _stop(proc, name)
        (args.var / PIDS_FILE).unlink(missing_ok=True)
        print("infersight demo stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
