"""Helpers for the tests that start real processes: free loopback ports, waiting for HTTP, the workload, cleanup."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from agent.targets import read_proc

NFTDROP = Path(__file__).resolve().parent / "scenarios" / "nftdrop.py"


def write_agent_config(directory: Path, agent_port: int, *parts: str, interval: float = 1) -> Path:
    """directory/infersight.toml for a live agent: windows of `interval` s, its store in directory/store, its page
    on loopback `agent_port`, then `parts` (TOML tables, targets, receivers; each dedented here)."""
    path = directory / "infersight.toml"
    path.write_text(f'interval_seconds = {interval}\nstore_dir = "{directory / "store"}"\n'
                    f'listen = "127.0.0.1:{agent_port}"\n' + "".join(textwrap.dedent(part) for part in parts))
    return path


def workload_target(tag: str, port: int, timeout_seconds: float = 10, children: bool = False) -> str:
    """The [[targets]] table for the bundled workload started with `--admin-token tag` on `port`: its
    process_regex matches that server only, its latency read from its /metrics; with `children`, as a family."""
    return textwrap.dedent(f"""
        [[targets]]
        name = "workload"
        process_regex = "admin-token {tag}"
        children = {str(children).lower()}
        [targets.latency]
        preset = "workload"
        url = "http://127.0.0.1:{port}/metrics"
        timeout_seconds = {timeout_seconds}
    """)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_execd(argv: list[str], timeout: float = 10.0, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """Popen, then wait until the child's execve has set its command line.

    Popen returns while the child may still be inside execve (a vfork spawn's parent runs on first), and until
    argv is set the agent does not watch it (agent/targets.py): a test that discovers it at once would race.
    `pass_fds`: descriptors the child keeps open (a listening socket, so the child is the one holding its port).
    """
    child = subprocess.Popen(argv, pass_fds=pass_fds)
    deadline = time.monotonic() + timeout
    while read_proc(child.pid).cmdline[-1:] != (argv[-1],):
        if time.monotonic() > deadline:
            child.kill()
            child.wait()
            raise TimeoutError(f"child {child.pid} ({argv[0]}) did not finish execve in {timeout} s")
        time.sleep(0.001)
    return child


def drop_table_exists(port: int) -> bool:
    """Whether nftdrop.py's table for `port` is in the kernel's ruleset (root)."""
    return subprocess.run(["nft", "list", "table", "inet", f"infersight_eval_drop_{port}"],
                          capture_output=True).returncode == 0


def start_port_drop(port: int, seconds: float, percent: int = 100, action: str = "drop", direction: str = "both",
                    timeout: float = 10.0) -> subprocess.Popen:
    """nftdrop.py dropping (or resetting) `percent` of the packets to `port`, once its table is in place (root)."""
    drop = subprocess.Popen([sys.executable, str(NFTDROP), str(port), str(seconds), str(percent), action, direction],
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout
    while not drop_table_exists(port):
        if drop.poll() is not None or time.monotonic() > deadline:
            drop.kill()
            raise AssertionError(f"nftdrop.py's table never appeared: {drop.communicate()[1]}")
        time.sleep(0.05)
    return drop


def wait_http(url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"{url} did not answer within {timeout} s")


def start_server(port: int, tag: str, log) -> subprocess.Popen:
    # `tag` in argv makes the agent's process_regex match this test's server and nothing else.
    proc = subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", str(port), "--admin-token", tag],
                            stdout=log, stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/health", 120)
    return proc


def terminate(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
