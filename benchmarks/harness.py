"""Start the pieces a benchmark measures: the bundled server and the agent as a separate, measurable process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

# The agent runs from the same source tree as this benchmark, not whatever `infersight` is installed.
REPO = Path(__file__).resolve().parents[1]
PROBES = ("syscalls", "offcpu", "gc", "tcp", "runqueue", "delivery")
# What `--only` can name: each probe alone, stack sampling alone, the agent with neither (collection loop,
# psutil, latency scrape, store, detector), that plus scrapes of its page, and the default agent.
SOURCES = (*PROBES, "stacks", "store", "page", "all")


class BenchError(RuntimeError):
    """A benchmark could not set itself up; the message is one line saying what failed."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(url: str, timeout: float = 5.0) -> dict[str, float]:
    """Every sample of a Prometheus endpoint, same-named samples (label sets) summed."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def agent_config(source: str, store_dir: Path, listen: str, server_pid: int | None, server_url: str,
                 extra: dict[str, object] | None = None, pidfile: Path | None = None, children: bool = False) -> str:
    """The TOML of an agent that runs `source` only (or everything, for 'all') against one server: by pid, or
    by pidfile when the server is restarted under it; with `children`, the server and every process it starts."""
    if source not in SOURCES:
        raise BenchError(f"unknown source {source!r}; choose from {', '.join(SOURCES)}")
    probes = {p: source in (p, "all") for p in PROBES}
    lines = [f'store_dir = "{store_dir}"', f'listen = "{listen}"', 'log_level = "warning"']
    for key, value in (extra or {}).items():
        lines.append(f"{key} = {str(value).lower() if isinstance(value, bool) else value}")
    if source not in ("stacks", "all"):
        lines += ["[stacks]", "enabled = false"]  # only when off: the default agent's config stays the defaults
    lines.append("[probes]")
    lines += [f"{p} = {'true' if on else 'false'}" for p, on in probes.items()]
    which = f'pidfile = "{pidfile}"' if pidfile is not None else f"pid = {server_pid}"
    if children:
        which += "\nchildren = true"
    lines += ["[[targets]]", 'name = "workload"', which, "[targets.latency]",
              'preset = "workload"', f'url = "{server_url}/metrics"']
    return "\n".join(lines) + "\n"


class AgentProcess:
    """`python -m agent.cli run` with a generated config, as a child of the benchmark (so its tree is ours)."""

    def __init__(self, workdir: Path, config_text: str, listen: str, tree: Path = REPO) -> None:
        self.workdir = workdir
        self.tree = tree
        self.url = f"http://{listen}"
        self.config_path = workdir / "infersight.toml"
        self.config_path.write_text(config_text)
        os.chmod(self.config_path, 0o600)
        self.log_path = workdir / "agent.log"
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "agent.cli", "run", "--config", str(self.config_path)],
                                         cwd=self.tree, stdin=subprocess.DEVNULL, stdout=log, stderr=log)

    def wait_ready(self, timeout: float = 180.0) -> dict[str, float]:
        """Until the agent stored its first window (its probes compiled and attached)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"the agent exited with {self.proc.returncode}: {self.tail()}")
            try:
                metrics = self.scrape()
                if metrics.get("infersight_agent_windows_total", 0) >= 1:
                    return metrics
            except OSError:
                pass
            time.sleep(0.5)
        raise BenchError(f"the agent stored no window within {timeout:.0f} s: {self.tail()}")

    def scrape(self) -> dict[str, float]:
        return scrape(f"{self.url}/metrics")

    def tail(self, n: int = 400) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:].strip().replace("\n", " | ") or "no log"
        except OSError:
            return "no log"

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode
