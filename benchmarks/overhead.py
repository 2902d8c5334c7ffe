"""`infersight bench overhead`: the bundled workload under fixed load, agent off and on in interleaved pairs."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from benchmarks.harness import REPO, SOURCES, AgentProcess, BenchError, agent_config, free_port
from benchmarks.openloop import Done, OpenLoop
from benchmarks.otlp_sink import OtlpSink
from benchmarks.procstat import usage
from benchmarks.recorders import RecorderLedger

# A measured agent starts from a copy of a store whose detector is past its warm-up (`Run.warm_store`): the default
# detector learns for 24 windows (2 minutes), and a fresh agent in warm-up never bursts (docs/BENCHMARKS.md).
WARM_TIMEOUT_S = 600.0

# The server the agent watches (--server): the bundled one as one process, as vLLM's shape (an API process and an
# engine process), or pre-forked under gunicorn (a master and three workers): a family of 1, 2 or 4 processes.
SERVERS = ("single", "engine-process", "gunicorn")
GUNICORN_WORKERS = 3

# The goals of issue 13, checked on the default agent ('all').
GOALS = {"agent_cpu_percent": 2.0, "throughput_loss": 0.01, "p99_increase": 0.02, "cpu_per_token": 0.01,
         "agent_rss_bytes": 200 * 2**20}


@dataclass
class Phase:
    """One measured stretch of the run: one side (agent off or on) of one pair, for one source."""

    source: str
    pair: int
    agent_on: bool
    start: float
    end: float
    tokens: float
    server_cpu: float
    agent_cpu: float | None = None
    # Of agent_cpu: the agent process alone; the rest is its children (py-spy).
    agent_own_cpu: float | None = None
    agent_peak_rss: int | None = None
    # Of the py-spy CPU, the share spent at the burst rate, and the bursts that started in the side.
    burst_share: float | None = None
    bursts: int | None = None
    # Tokens asked for by the requests that arrived in the side (the open loop's offered load).
    tokens_asked: float | None = None
    requests: list[Done] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def latency(self, q: float) -> float | None:
        ok = sorted(d.latency_s for d in self.requests if d.ok)
        return ok[min(len(ok) - 1, int(q * len(ok)))] if ok else None


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def summarize(phases: list[Phase]) -> dict[str, Any]:
    """Per pair on/off ratios, then their medians and spread; the agent's CPU and peak RSS from 'on' sides."""
    by_pair: dict[int, dict[bool, Phase]] = {}
    for p in phases:
        by_pair.setdefault(p.pair, {})[p.agent_on] = p
    tput, arrivals, p50, p99, cpt, agent_cpu, own_cpu, burst_cpu = [], [], [], [], [], [], [], []
    for sides in by_pair.values():
        off, on = sides.get(False), sides.get(True)
        if off is None or on is None or not off.tokens or not on.tokens:
            continue
        if on.tokens_asked and off.tokens_asked:
            # Open loop: a side's output follows the arrivals that happened to fall in it, so each side's output
            # is taken over what it was asked for; below saturation both are ~1, a server the agent slows
            # past its capacity falls behind its asks.
            tput.append((on.tokens / on.tokens_asked) / (off.tokens / off.tokens_asked))
            arrivals.append((on.tokens_asked / on.seconds) / (off.tokens_asked / off.seconds))
        else:
            tput.append((on.tokens / on.seconds) / (off.tokens / off.seconds))
        cpt.append((on.server_cpu / on.tokens) / (off.server_cpu / off.tokens))
        for out, q in ((p50, 0.5), (p99, 0.99)):
            a, b = on.latency(q), off.latency(q)
            if a is not None and b:
                out.append(a / b)
        if on.agent_cpu is not None:
            agent_cpu.append(100.0 * on.agent_cpu / on.seconds)
        if on.agent_own_cpu is not None:
            own_cpu.append(100.0 * on.agent_own_cpu / on.seconds)
        if on.agent_cpu is not None and on.agent_own_cpu is not None:
            burst_cpu.append(100.0 * (on.burst_share or 0.0) * (on.agent_cpu - on.agent_own_cpu) / on.seconds)
    peaks = [p.agent_peak_rss for p in phases if p.agent_peak_rss is not None]
    summary = {"pairs": len(tput), "throughput_ratio": _spread(tput), "asked_tokens_ratio": _spread(arrivals),
               "p50_ratio": _spread(p50),
               "p99_ratio": _spread(p99), "cpu_per_token_ratio": _spread(cpt), "agent_cpu_percent": _spread(agent_cpu),
               "agent_process_cpu_percent": _spread(own_cpu),
               "agent_children_cpu_percent": _spread([a - b for a, b in zip(agent_cpu, own_cpu)]),
               "burst_cpu_percent": _spread(burst_cpu),
               "bursts_per_hour": _per_hour([p for p in phases if p.agent_on and p.bursts is not None]),
               "agent_rss_bytes": max(peaks) if peaks else None,
               "requests_off": sum(len(p.requests) for p in phases if not p.agent_on),
               "requests_on": sum(len(p.requests) for p in phases if p.agent_on),
               "failed_requests": sum(1 for p in phases for d in p.requests if not d.ok),
               "tokens_per_s_off": _spread([p.tokens / p.seconds for p in phases if not p.agent_on])}
    summary["goals"] = goals(summary)
    return summary


def _per_hour(phases: list[Phase]) -> float | None:
    seconds = sum(p.seconds for p in phases)
    return round(3600.0 * sum(p.bursts or 0 for p in phases) / seconds, 2) if seconds > 0 else None


def goals(s: dict[str, Any]) -> dict[str, bool | None]:
    def med(key: str) -> float | None:
        return s[key]["median"] if s.get(key) else None

    cpu, tput, p99, cpt = med("agent_cpu_percent"), med("throughput_ratio"), med("p99_ratio"), med("cpu_per_token_ratio")
    return {"agent_cpu<=2%": None if cpu is None else cpu <= GOALS["agent_cpu_percent"],
            "throughput_loss<=1%": None if tput is None else tput >= 1 - GOALS["throughput_loss"],
            "p99_increase<=2%": None if p99 is None else p99 <= 1 + GOALS["p99_increase"],
            "cpu_per_token_within_1%": None if cpt is None else abs(cpt - 1) <= GOALS["cpu_per_token"],
            "rss<=200MB": None if s["agent_rss_bytes"] is None else s["agent_rss_bytes"] <= GOALS["agent_rss_bytes"]}


class PageScraper:
    """Loads the status page and /metrics every `period` seconds, as a person and a Prometheus would."""

    def __init__(self, base: str, period: float = 2.0) -> None:
        self.base, self.period = base, period
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="page-scraper", daemon=True)

    def __enter__(self) -> PageScraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            for path in ("/", "/metrics", "/api/status"):
                try:
                    with urllib.request.urlopen(self.base + path, timeout=5) as resp:
                        resp.read()
                except OSError:
                    self.errors += 1


class Run:
    """Everything one `bench overhead` invocation starts: the server, the load, and agents in turn."""

    def __init__(self, seconds: float, settle: float, rate: float, progress: TextIO, family: bool = False,
                 warm: bool = True) -> None:
        self.seconds, self.settle, self.rate, self.out = seconds, settle, rate, progress
        self.family = family
        self.warm = warm
        # Per condition, a store whose detector finished its warm-up on this run's server.
        self.warm_stores: dict[str, Path] = {}
        self.ledgers: dict[int, RecorderLedger] = {}
        self.workdir = Path(tempfile.mkdtemp(prefix="infersight-bench-"))
        self.load: OpenLoop | None = None

    def log(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def phase(self, source: str, pair: int, server: Any, agent: AgentProcess | None) -> Phase:
        """Measure one side: tokens of the requests finished in it, the server's CPU, the agent tree's CPU."""
        assert self.load is not None
        label = f"[{source} pair {pair + 1}] agent {'on ' if agent else 'off'}"
        # The server's whole tree: an engine process or gunicorn's workers are the server too.
        t0, cpu0 = time.monotonic(), usage(server.proc.pid).total_cpu
        u0 = usage(agent.pid) if agent else None
        scraper = PageScraper(agent.url) if agent is not None and source.split(" @ ")[0] == "page" else None
        if scraper:
            scraper.__enter__()
        try:
            end = t0 + self.seconds
            while (left := end - time.monotonic()) > 0:
                time.sleep(min(5.0, left))
                self.log(f"{label}: {self.seconds - max(0.0, end - time.monotonic()):.0f}/{self.seconds:.0f} s")
        finally:
            if scraper:
                scraper.__exit__()
        t1, cpu1 = time.monotonic(), usage(server.proc.pid).total_cpu
        phase = Phase(source=source, pair=pair, agent_on=agent is not None, start=t0, end=t1,
                      tokens=float(self.load.tokens_finished(t0, t1)), server_cpu=cpu1 - cpu0,
                      tokens_asked=float(self.load.tokens_asked(t0, t1)))
        if agent is not None and u0 is not None:
            u1 = usage(agent.pid)
            phase.agent_cpu, phase.agent_peak_rss = u1.total_cpu - u0.total_cpu, u1.peak_rss_bytes
            phase.agent_own_cpu = u1.own_cpu - u0.own_cpu
            if agent.pid in self.ledgers:
                used = self.ledgers[agent.pid].use(t0, t1)
                phase.burst_share, phase.bursts = used.burst_share, used.bursts
        cpu_note = f", agent {100 * phase.agent_cpu / phase.seconds:.2f}% of a core" if phase.agent_cpu is not None else ""
        self.log(f"{label}: {phase.tokens / phase.seconds:.1f} tokens/s, server {phase.server_cpu / phase.seconds:.2f} "
                 f"cores{cpu_note}")
        return phase

    def start_agent(self, cond: Condition, server: Any, n: int) -> AgentProcess:
        source = cond.label
        if self.warm and source not in self.warm_stores:
            self.warm_stores[source] = self.warm_store(cond, server)
        listen = f"127.0.0.1:{free_port()}"
        folder = self.workdir / f"agent{n}"
        folder.mkdir(mode=0o700)
        if source in self.warm_stores:
            shutil.copytree(self.warm_stores[source], folder / "store")
        agent = AgentProcess(folder, agent_config(cond.source, folder / "store", listen, server.proc.pid, server.url,
                                                  children=self.family) + cond.extra, listen, tree=cond.tree)
        agent.start()
        self.log(f"[{source}] agent starting (pid {agent.pid}); waiting for its first window")
        agent.wait_ready()
        self.ledgers[agent.pid] = RecorderLedger(agent.pid).start()
        time.sleep(self.settle)
        return agent

    def stop_agent(self, agent: AgentProcess) -> None:
        agent.stop()
        ledger = self.ledgers.pop(agent.pid, None)
        if ledger is not None:
            ledger.stop()

    def warm_store(self, cond: Condition, server: Any) -> Path:
        """Run `cond`'s agent once until its detector is armed (its warm-up done on this server), and keep its
        store: every measured agent starts from a copy and resumes the learned baseline at its first window."""
        listen = f"127.0.0.1:{free_port()}"
        folder = self.workdir / f"warm-{len(self.warm_stores)}"
        folder.mkdir(mode=0o700)
        agent = AgentProcess(folder, agent_config(cond.source, folder / "store", listen, server.proc.pid, server.url,
                                                  children=self.family), listen, tree=cond.tree)
        agent.start()
        self.log(f"[{cond.label}] warm-up agent (pid {agent.pid}): waiting until its detector is armed")
        try:
            agent.wait_ready()
            deadline = time.monotonic() + WARM_TIMEOUT_S
            while agent.scrape().get("infersight_detector_armed", 0) < 1:
                if time.monotonic() > deadline:
                    raise BenchError(f"the warm-up agent's detector was not armed within {WARM_TIMEOUT_S:.0f} s")
                time.sleep(2.0)
        finally:
            agent.stop()  # a clean stop saves the detector's state
        return folder / "store"


@dataclass(frozen=True)
class Condition:
    """One agent to compare with no agent: a source, run from this tree or another checkout (before/after)."""

    label: str
    source: str
    tree: Path = REPO
    # TOML appended to the agent's config (the [otlp] table of `--otlp`).
    extra: str = ""


def conditions(sources: list[str], compare_tree: Path | None, otlp_endpoint: str | None = None) -> list[Condition]:
    out = [Condition(s, s) for s in sources]
    if compare_tree is not None:
        out += [Condition(f"{s} @ {compare_tree}", s, compare_tree) for s in sources]
    if otlp_endpoint is not None:
        out += [Condition(f"{s} + otlp", s, extra=f'[otlp]\nendpoint = "{otlp_endpoint}"\n') for s in sources]
    return out


def _launch(server: str, workdir: Path):
    from workload.launch import launched_gunicorn, launched_server

    if server == "engine-process":
        return launched_server("--engine-process")
    if server == "gunicorn":
        metrics = workdir / "gunicorn-metrics"
        metrics.mkdir(mode=0o700)
        return launched_gunicorn(GUNICORN_WORKERS, metrics_dir=str(metrics))
    return launched_server()


def _wait_healthy(url: str, timeout_s: float = 180.0) -> None:
    """gunicorn listens before its workers have loaded the model: wait until a completion comes back."""
    deadline = time.monotonic() + timeout_s
    body = json.dumps({"prompt": "hello", "max_tokens": 2}).encode()
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(f"{url}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise BenchError(f"the server at {url} completed no request within {timeout_s:.0f} s")


def run(pairs: int, seconds: float, conds: list[Condition], rate: float, settle: float = 5.0,
        progress: TextIO = sys.stderr, server_kind: str = "single", warm: bool = True) -> dict[str, Any]:
    bench = Run(seconds, settle, rate, progress, family=server_kind != "single", warm=warm)
    phases: list[Phase] = []
    load_before = os.getloadavg()
    with _launch(server_kind, bench.workdir) as server:
        _wait_healthy(server.url)
        loop = OpenLoop(server.url, rate)
        bench.load = loop
        loop.start()
        bench.log(f"server pid {server.proc.pid} at {server.url}; open-loop load {rate} req/s; warming up {settle:.0f} s")
        time.sleep(max(settle, 5.0))
        n = 0
        try:
            # Pair-major: every condition gets its pair before any gets its next, so a slow drift in the
            # host's load spreads over all of them; inside a pair, ABBA alternates which side goes first.
            for pair in range(pairs):
                for cond in conds:
                    for on in ((False, True) if pair % 2 == 0 else (True, False)):
                        if not on:
                            phases.append(bench.phase(cond.label, pair, server, None))
                            continue
                        n += 1
                        agent = bench.start_agent(cond, server, n)
                        try:
                            phases.append(bench.phase(cond.label, pair, server, agent))
                        finally:
                            bench.stop_agent(agent)
                        time.sleep(settle)
            time.sleep(5)  # the last requests finish before the results are sliced
        finally:
            loop.stop()
        for p in phases:
            p.requests = loop.between(p.start, p.end)
    shutil.rmtree(bench.workdir, ignore_errors=True)  # kept when the run failed: the agents' logs are there
    per_source = {c.label: summarize([p for p in phases if p.source == c.label]) for c in conds}
    head = per_source["all"] if "all" in per_source else per_source[conds[0].label]
    return {**{k: head[k] for k in ("throughput_ratio", "asked_tokens_ratio", "p50_ratio", "p99_ratio", "cpu_per_token_ratio",
                                    "agent_cpu_percent", "agent_rss_bytes", "pairs", "goals")},
            "burst_cpu_percent": head["burst_cpu_percent"], "bursts_per_hour": head["bursts_per_hour"],
            "agent_process_cpu_percent": head["agent_process_cpu_percent"],
            "agent_children_cpu_percent": head["agent_children_cpu_percent"],
            "warm": warm, "seconds": seconds, "rate": rate, "server": server_kind, "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()], "dropped_arrivals": loop.dropped,
            "sources": per_source}


def _fmt(s: dict[str, float] | None, digits: int = 3) -> str:
    if not s:
        return "n/a"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}–{s['max']:.{digits}f}]"


def table(result: dict[str, Any]) -> str:
    rows = ["| source | agent CPU % of one core (with children) | of which py-spy | of which bursts | bursts per hour "
            "| agent peak RSS MiB | throughput on/off (served ÷ asked) | p50 on/off | p99 on/off "
            "| server CPU per token on/off | pairs | requests off/on |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in result["sources"].items():
        rss = f"{s['agent_rss_bytes'] / 2**20:.0f}" if s["agent_rss_bytes"] else "n/a"
        per_hour = "n/a" if s.get("bursts_per_hour") is None else f"{s['bursts_per_hour']:.1f}"
        rows.append(f"| {name} | {_fmt(s['agent_cpu_percent'], 2)} | {_fmt(s['agent_children_cpu_percent'], 2)} | "
                    f"{_fmt(s.get('burst_cpu_percent'), 2)} | {per_hour} | {rss} | {_fmt(s['throughput_ratio'])} | "
                    f"{_fmt(s['p50_ratio'])} | {_fmt(s['p99_ratio'])} | {_fmt(s['cpu_per_token_ratio'])} | {s['pairs']} | "
                    f"{s['requests_off']}/{s['requests_on']} |")
    return "\n".join(rows)


def main(pairs: int, seconds: float, only: list[str] | None, rate: float, as_json: bool, settle: float,
         compare_tree: Path | None = None, server: str = "single", warm: bool = True, otlp: bool = False) -> int:
    if os.geteuid() != 0:
        print("infersight: bench overhead must run as root: the agent loads BPF programs and runs py-spy",
              file=sys.stderr)
        return 1
    sources = only or ["all"]
    if "each" in sources:
        sources = [s for s in SOURCES if s != "all"] + ["all"]
    if compare_tree is not None and not (compare_tree / "agent" / "cli.py").is_file():
        print(f"infersight: --compare-tree {str(compare_tree)!r} is not an infersight checkout (no agent/cli.py)",
              file=sys.stderr)
        return 2
    sink = OtlpSink() if otlp else None
    try:
        result = run(pairs, seconds, conditions(sources, compare_tree, sink.endpoint if sink else None), rate,
                     settle, server_kind=server, warm=warm)
    except (BenchError, OSError) as exc:
        print(f"infersight: bench overhead failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if sink is not None:
            sink.close()
    print(table(result))
    print("goals (default agent or the first source): "
          + ", ".join(f"{k} {'met' if v else 'MISSED' if v is not None else 'not measured'}"
                      for k, v in result["goals"].items()))
    if as_json:
        print(json.dumps(result))
    return 0
