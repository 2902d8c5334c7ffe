"""`infersight bench soak`: the demo setup for M minutes; the agent's RSS, fds, threads, CPU, store and lateness."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import psutil

from benchmarks import plot
from benchmarks.harness import AgentProcess, BenchError, agent_config, free_port
from benchmarks.openloop import OpenLoop
from benchmarks.procstat import ProcessGone, usage
from benchmarks.recorders import RecorderLedger

# Readings before this share of the run are warm-up (BPF compiled, caches and the store's first pages filled).
WARMUP_SHARE = 0.2
RSS_GROWTH_GOAL = 0.10
# Issue 33's steady-state goals: the agent with its py-spy children, median of 10-minute slices after the
# detector's warm-up, at most 1 % of one core; its peak RSS at most 200 MiB.
SLICE_SECONDS = 600.0
STEADY_CPU_GOAL_PERCENT = 1.0
PEAK_RSS_GOAL_BYTES = 200 * 2**20


@dataclass(frozen=True)
class Reading:
    """One look at the agent, `t` seconds into the soak; cpu_percent covers the time since the previous one."""

    t: float
    rss_bytes: int
    peak_rss_bytes: int
    fds: int
    threads: int
    children: int
    cpu_percent: float | None
    store_bytes: int
    windows: int | None
    late_ticks: int | None
    dropped_windows: int | None
    tick_seconds: float | None
    # Cumulative CPU seconds since the agent started: with its children, and the agent process alone.
    cpu_total: float | None = None
    cpu_own: float | None = None
    # The detector has learned its baseline (past warm-up); None when the agent does not say.
    armed: bool | None = None
    # Regressions the agent opened since it started (`infersight_regressions_total`); None when not scraped.
    regressions: int | None = None


@dataclass(frozen=True)
class Slice:
    """`seconds` of the soak after the detector's warm-up: the agent's CPU (% of one core) with its children,
    alone, in py-spy and in py-spy's bursts, and the bursts that started in it."""

    start_min: float
    seconds: float
    cpu_percent: float
    own_percent: float
    children_percent: float
    burst_percent: float | None
    bursts: int
    bursts_per_hour: float
    # Regressions opened in the slice; with none, every burst in it was a false one. None when not scraped.
    regressions: int | None = None


def slices(readings: list[Reading], bursts: Callable[[float, float], tuple[float | None, int]],
           seconds: float = SLICE_SECONDS) -> list[Slice]:
    """Consecutive slices of `seconds` from the first reading with the detector armed (a last one of at least half
    that length counts too). `bursts(t0, t1)`: the share of py-spy's CPU at the burst rate and the bursts started."""
    timed = [r for r in readings if r.cpu_total is not None and r.cpu_own is not None]
    first = next((i for i, r in enumerate(timed) if r.armed), None)
    if first is None:
        return []
    out = []
    start = timed[first]
    for r in timed[first + 1:]:
        span = r.t - start.t
        if span < seconds and r is not timed[-1]:
            continue
        if span < seconds / 2:
            break
        total = 100 * (r.cpu_total - start.cpu_total) / span  # type: ignore[operator]
        own = 100 * (r.cpu_own - start.cpu_own) / span  # type: ignore[operator]
        share, started = bursts(start.t, r.t)
        opened = (r.regressions - start.regressions
                  if r.regressions is not None and start.regressions is not None else None)
        out.append(Slice(start_min=round(start.t / 60, 2), seconds=round(span, 1), cpu_percent=round(total, 3),
                         own_percent=round(own, 3), children_percent=round(total - own, 3),
                         burst_percent=None if share is None else round(share * (total - own), 3), bursts=started,
                         bursts_per_hour=round(started * 3600 / span, 2), regressions=opened))
        start = r
    return out


def steady_verdict(cut: list[Slice], peak_rss_bytes: int) -> dict[str, Any]:
    """The median slice and the spread over slices, against issue 33's goals."""
    if not cut:
        return {"error": "no 10-minute slice after the detector's warm-up: run longer"}
    cpu = sorted(s.cpu_percent for s in cut)
    med = _median_f(cpu)
    return {"slices": len(cut), "cpu_percent_median": round(med, 3), "cpu_percent_min": cpu[0],
            "cpu_percent_max": cpu[-1],
            "own_percent_median": round(_median_f([s.own_percent for s in cut]), 3),
            "children_percent_median": round(_median_f([s.children_percent for s in cut]), 3),
            "burst_percent_median": round(_median_f([s.burst_percent or 0.0 for s in cut]), 3),
            "bursts_per_hour": round(sum(s.bursts for s in cut) * 3600 / sum(s.seconds for s in cut), 2),
            # A slice's bursts are false when no regression opened in it (a burst's hold is 20 s, a slice 10 min).
            "regressions_opened": None if any(s.regressions is None for s in cut) else sum(s.regressions or 0
                                                                                            for s in cut),
            "false_bursts_per_hour": None if any(s.regressions is None for s in cut) else
            round(sum(s.bursts for s in cut if not s.regressions) * 3600 / sum(s.seconds for s in cut), 2),
            "goals": {"steady_cpu<=1%": med <= STEADY_CPU_GOAL_PERCENT,
                      "peak_rss<=200MiB": peak_rss_bytes <= PEAK_RSS_GOAL_BYTES}}


def _median_f(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def store_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("*") if p.is_file())


def verdict(readings: list[Reading], retention_bytes: int) -> dict[str, Any]:
    """Growth after warm-up and the soak goals of issue 13."""
    if len(readings) < 3:
        return {"error": f"only {len(readings)} readings: run longer than three intervals"}
    start = max(1, int(len(readings) * WARMUP_SHARE))
    warm = readings[start - 1]
    quarter = max(1, len(readings) // 4)
    tail = readings[-quarter:]
    early = readings[start:start + quarter] or [warm]
    rss_growth = max(r.rss_bytes for r in tail) / warm.rss_bytes - 1
    cpu = [r.cpu_percent for r in readings[start:] if r.cpu_percent is not None]
    last = readings[-1]
    out = {"warmup_readings": start, "rss_after_warmup_mib": round(warm.rss_bytes / 2**20, 1),
           "rss_end_mib": round(last.rss_bytes / 2**20, 1), "rss_growth_after_warmup": round(rss_growth, 4),
           "peak_rss_mib": round(max(r.peak_rss_bytes for r in readings) / 2**20, 1),
           "fds_after_warmup": warm.fds, "fds_max_after": max(r.fds for r in readings[start:]),
           "threads_after_warmup": warm.threads, "threads_max_after": max(r.threads for r in readings[start:]),
           "cpu_percent_median": round(sorted(cpu)[len(cpu) // 2], 2) if cpu else None,
           "store_bytes": last.store_bytes, "retention_bytes": retention_bytes,
           "windows": last.windows, "late_ticks": last.late_ticks, "dropped_windows": last.dropped_windows,
           "tick_seconds_max": max((r.tick_seconds or 0.0) for r in readings)}
    # A py-spy recorder's pipes or a sampler replaced at a target change are transient: growth is a
    # higher level at the end than just after warm-up, not a momentary maximum.
    out["fds_median_early_late"] = [_median([r.fds for r in early]), _median([r.fds for r in tail])]
    out["threads_median_early_late"] = [_median([r.threads for r in early]), _median([r.threads for r in tail])]
    out["goals"] = {"rss_growth<=10%": rss_growth <= RSS_GROWTH_GOAL,
                    "no_fd_growth": out["fds_median_early_late"][1] <= out["fds_median_early_late"][0],
                    "no_thread_growth": out["threads_median_early_late"][1] <= out["threads_median_early_late"][0],
                    "store_within_bound": last.store_bytes <= retention_bytes,
                    "no_late_windows": last.late_ticks == 0 and last.dropped_windows == 0}
    return out


def _median(values: list[int]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return float(ordered[mid]) if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def table(readings: list[Reading], rows: int = 20) -> str:
    step = max(1, len(readings) // rows)
    chosen = readings[::step] + ([readings[-1]] if (len(readings) - 1) % step else [])
    lines = ["| min | RSS MiB | peak MiB | fds | threads | py-spy | CPU % of a core | store MiB | windows | late | tick s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in chosen:
        cpu = f"{r.cpu_percent:.2f}" if r.cpu_percent is not None else "n/a"
        lines.append(f"| {r.t / 60:.1f} | {r.rss_bytes / 2**20:.1f} | {r.peak_rss_bytes / 2**20:.1f} | {r.fds} | "
                     f"{r.threads} | {r.children} | {cpu} | {r.store_bytes / 2**20:.2f} | {r.windows} | "
                     f"{r.late_ticks} | {r.tick_seconds if r.tick_seconds is not None else 'n/a'} |")
    return "\n".join(lines)


class Served:
    """The bundled server under open-loop load; `restart()` replaces it: a new pid behind the same pidfile and port."""

    def __init__(self, rate: float, workdir: Path) -> None:
        self.rate = rate
        self.port = free_port()
        self.pidfile = workdir / "workload.pid"
        self.url = f"http://127.0.0.1:{self.port}"
        self.restarts = 0
        self._stack = contextlib.ExitStack()
        self.loop: OpenLoop | None = None

    def start(self) -> None:
        from workload.launch import launched_server

        self._stack.enter_context(launched_server("--port", str(self.port), "--pidfile", str(self.pidfile)))
        self.loop = OpenLoop(self.url, self.rate)
        self.loop.start()

    def stop(self) -> None:
        if self.loop is not None:
            self.loop.stop()
        self._stack.close()

    def restart(self) -> None:
        self.stop()
        self.start()
        self.restarts += 1


def run(minutes: float, every: float, rate: float, restart_every: float | None = None,
        progress: TextIO = sys.stderr, slice_seconds: float = SLICE_SECONDS,
        observe: Callable[[Reading, int], None] | None = None) -> tuple[list[Reading], list[Slice]]:
    """The soak's readings and its steady slices; `observe(reading, agent pid)` is called after each reading
    (a test reads the agent's /proc at the same moments, its own way)."""
    workdir = Path(tempfile.mkdtemp(prefix="infersight-soak-"))
    readings: list[Reading] = []
    served = Served(rate, workdir)
    listen = f"127.0.0.1:{free_port()}"
    store = workdir / "store"
    agent = AgentProcess(workdir, agent_config("all", store, listen, None, served.url, pidfile=served.pidfile), listen)
    ledger: RecorderLedger | None = None
    cut: list[Slice] = []
    try:
        served.start()
        agent.start()
        agent.wait_ready()
        ledger = RecorderLedger(agent.pid).start()
        print(f"agent pid {agent.pid} ready; soaking {minutes:g} min, a reading every {every:g} s"
              + (f", the server restarted every {restart_every:g} min" if restart_every else ""),
              file=progress, flush=True)
        t0 = time.monotonic()
        next_restart = t0 + restart_every * 60 if restart_every else None
        prev: tuple[float, float] | None = None
        while (now := time.monotonic()) - t0 <= minutes * 60:
            if next_restart is not None and now >= next_restart:
                # Targets come and go: the agent must drop the old one's sources and take up the new pid.
                served.restart()
                next_restart += restart_every * 60  # type: ignore[operator]
                print(f"{(time.monotonic() - t0) / 60:5.1f} min  server restarted ({served.restarts})",
                      file=progress, flush=True)
                continue
            try:
                u = usage(agent.pid)
            except ProcessGone as exc:
                raise BenchError(f"the agent died during the soak: {agent.tail()}") from exc
            try:
                m = agent.scrape()
            except OSError:
                m = {}
            cpu = 100 * (u.total_cpu - prev[1]) / (now - prev[0]) if prev else None
            prev = (now, u.total_cpu)

            def metric(name: str) -> int | None:
                return int(m[name]) if name in m else None

            r = Reading(t=now - t0, rss_bytes=u.rss_bytes, peak_rss_bytes=u.peak_rss_bytes, fds=u.fds,
                        threads=u.threads, children=u.live_children, cpu_percent=cpu, store_bytes=store_bytes(store),
                        windows=metric("infersight_agent_windows_total"),
                        late_ticks=metric("infersight_agent_late_ticks_total"),
                        dropped_windows=metric("infersight_agent_dropped_windows_total"),
                        tick_seconds=m.get("infersight_agent_window_duration_seconds"),
                        cpu_total=u.total_cpu, cpu_own=u.own_cpu,
                        armed=m["infersight_detector_armed"] >= 1 if "infersight_detector_armed" in m else None,
                        # The counter has no sample until the first regression opens: 0 once the agent answered.
                        regressions=metric("infersight_regressions_total") or 0 if m else None)
            readings.append(r)
            if observe is not None:
                observe(r, agent.pid)
            print(f"{r.t / 60:5.1f} min  RSS {r.rss_bytes / 2**20:6.1f} MiB  fds {r.fds}  threads {r.threads}  "
                  f"CPU {cpu if cpu is None else round(cpu, 2)}%  store {r.store_bytes / 2**20:.2f} MiB  "
                  f"late {r.late_ticks}", file=progress, flush=True)
            time.sleep(max(0.0, every - (time.monotonic() - now)))

        def bursts(a: float, b: float) -> tuple[float | None, int]:
            assert ledger is not None
            used = ledger.use(t0 + a, t0 + b)
            return used.burst_share, used.bursts

        cut = slices(readings, bursts, slice_seconds)
    finally:
        if ledger is not None:
            ledger.stop()
        agent.stop()
        served.stop()
    shutil.rmtree(workdir, ignore_errors=True)  # kept when the soak failed: the agent's log is there
    return readings, cut


def psutil_tree_cpu(pid: int) -> tuple[float, float]:
    """(the agent with its reaped and live children, the agent alone) in CPU seconds, read by psutil: a second
    reader of /proc, independent of benchmarks.procstat, for the soak to check its slices against."""
    agent = psutil.Process(pid)
    t = agent.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in agent.children(recursive=True):
        try:
            c = child.cpu_times()
        except psutil.NoSuchProcess:
            continue  # reaped between listing and reading: its CPU is in the agent's children_* from now on
        total += c.user + c.system
    return total, t.user + t.system


def psutil_slices(cut: list[Slice], seen: dict[float, tuple[float, float]]) -> list[float | None]:
    """Each slice's CPU (% of one core, the agent with its children) as psutil read it at the readings nearest the
    slice's ends; None where psutil read nothing."""
    out: list[float | None] = []
    for s in cut:
        if not seen:
            out.append(None)
            continue
        t0 = s.start_min * 60
        start = min(seen, key=lambda t: abs(t - t0))
        end = min(seen, key=lambda t: abs(t - (t0 + s.seconds)))
        out.append(round(100 * (seen[end][0] - seen[start][0]) / (end - start), 3) if end > start else None)
    return out


def slice_table(cut: list[Slice], second: list[float | None] | None = None) -> str:
    """The slices as a Markdown table; with `second` (psutil_slices), the second reader's figure beside each."""
    extra = second is not None
    lines = ["| slice from min | minutes | agent CPU % of one core (with children) | "
             + ("psutil on /proc | " if extra else "") + "agent process | py-spy "
             "| of which bursts | bursts | regressions opened |", "|---|---|---|---|---|---|---|---|"
             + ("---|" if extra else "")]
    for i, s in enumerate(cut):
        burst = "n/a" if s.burst_percent is None else f"{s.burst_percent:.2f}"
        other = ""
        if second is not None:
            p = second[i] if i < len(second) else None
            other = ("n/a" if p is None else f"{p:.2f}") + " | "
        lines.append(f"| {s.start_min:.1f} | {s.seconds / 60:.1f} | {s.cpu_percent:.2f} | {other}{s.own_percent:.2f} | "
                     f"{s.children_percent:.2f} | {burst} | {s.bursts} | "
                     f"{'n/a' if s.regressions is None else s.regressions} |")
    return "\n".join(lines)


def main(minutes: float, every: float, rate: float, plot_path: str | None, as_json: bool,
         restart_every: float | None = None, *, retention_bytes: int) -> int:
    """`retention_bytes`: the store bound of the agent under test (its default config's), which the store
    must stay within; the caller knows the agent's config, the benchmark only runs the agent."""
    if os.geteuid() != 0:
        print("infersight: bench soak must run as root: the agent loads BPF programs and runs py-spy", file=sys.stderr)
        return 1
    seen: dict[float, tuple[float, float]] = {}

    def observe(r: Reading, pid: int) -> None:
        try:
            seen[r.t] = psutil_tree_cpu(pid)
        except (psutil.Error, OSError):
            pass  # the second reader is a check: the soak's own reading stands without it (its slice reads n/a)

    try:
        readings, cut = run(minutes, every, rate, restart_every, observe=observe)
    except (BenchError, OSError) as exc:
        print(f"infersight: bench soak failed: {exc}", file=sys.stderr)
        return 1
    result = verdict(readings, retention_bytes)
    if readings:
        result["steady"] = steady_verdict(cut, max(r.peak_rss_bytes for r in readings))
    # The same slices read a second way (psutil on /proc, at the same moments): the two must agree.
    second = psutil_slices(cut, seen)
    result["steady_slices"] = [{**asdict(c), "psutil_cpu_percent": p} for c, p in zip(cut, second)]
    print(table(readings))
    print(slice_table(cut, second))
    print(json.dumps(result, indent=1))
    if plot_path:
        panels = {"RSS MiB": [(r.t, r.rss_bytes / 2**20) for r in readings],
                  "open fds": [(r.t, r.fds) for r in readings],
                  "threads": [(r.t, r.threads) for r in readings],
                  "CPU % of one core (with py-spy)": [(r.t, r.cpu_percent) for r in readings if r.cpu_percent is not None],
                  "store MiB": [(r.t, r.store_bytes / 2**20) for r in readings],
                  "late ticks (total)": [(r.t, r.late_ticks or 0) for r in readings]}
        title = f"infersight soak: {minutes:g} min, {rate:g} req/s, a reading every {every:g} s"
        width, height = plot.size(len(panels))
        why = plot.render_png(plot.svg(title, panels), Path(plot_path), width, height)
        print(f"infersight: wrote {plot_path}" if why is None else f"infersight: no plot: {why}", file=sys.stderr)
    if as_json:
        print(json.dumps({**result, "readings": [asdict(r) for r in readings]}))
    return 0
