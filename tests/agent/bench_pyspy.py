"""Measure PySpySampler: target slowdown (interleaved on/off pairs), py-spy CPU, attach time, gaps.

Run as root: `.venv/bin/python -m tests.agent.bench_pyspy --pairs 6 --phase 4`, or with
`--workload` for py-spy's CPU per flag set and the sampler's on the bundled server under load.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

from agent.sources.pyspy import PySpySampler

TARGET = textwrap.dedent("""
    import sys, threading, time
    threading.Thread(target=threading.Event().wait, name="waiter", daemon=True).start()
    n, tick, cpu = 0, time.monotonic() + 0.25, time.thread_time()
    while True:
        for i in range(2000):
            n += 1
        if time.monotonic() >= tick:
            now = time.thread_time()
            print(time.monotonic(), n, now - cpu, flush=True)
            n, tick, cpu = 0, tick + 0.25, now
""")


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_phase(target: subprocess.Popen, seconds: float) -> tuple[float, float]:
    """Iterations per wall second and per CPU second of the target's loop during the phase.

    On a shared machine the wall figure mostly measures other people's load; per CPU second
    is what a non-blocking sampler can still cost the target (cache and memory-bus effects).
    """
    end = time.monotonic() + seconds
    total, cpu, first, last = 0, 0.0, None, None
    while time.monotonic() < end:
        stamp, n, used = target.stdout.readline().split()
        first = first if first is not None else float(stamp)
        last = float(stamp)
        total += int(n)
        cpu += float(used)
    return total / max(last - first, 1e-9), total / max(cpu, 1e-9)


FLAG_SETS = {"active only": [], "--threads": ["--threads"], "--idle": ["--idle"],
             "--idle --threads": ["--idle", "--threads"],
             "--idle --threads --function": ["--idle", "--threads", "--function"], "--gil": ["--gil"]}


def bench_workload(rate: int, reps: int = 2, seconds: int = 4) -> dict:
    """py-spy CPU per flag set (one recorder) and per sampler segment length, on the bundled server."""
    pyspy = str(Path(sys.executable).parent / "py-spy")
    out: dict = {"flags_cpu_cores": {}, "sampler_cpu_cores": {}}
    # The workload is only "a process with a pid and an endpoint" to the agent: start it as one.
    server = subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", "0"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    load = None
    try:
        url = _await_url(server)
        # Keep draining its log so a full pipe never stalls the server mid-measurement.
        threading.Thread(target=server.stdout.read, daemon=True).start()
        load = subprocess.Popen([sys.executable, "-m", "workload", "load", "--url", url, "--rate", "4",
                                 "--duration", "300"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with tempfile.TemporaryDirectory() as tmp:
            base = [pyspy, "record", "--pid", str(server.pid), "--rate", str(rate), "-d", str(seconds),
                    "-f", "raw", "-o", f"{tmp}/out.txt", "--nonblocking"]
            for _ in range(reps):
                for name, flags in FLAG_SETS.items():
                    cpu0 = children_cpu()
                    subprocess.run(base + flags, capture_output=True, check=True)
                    out["flags_cpu_cores"].setdefault(name, []).append(round((children_cpu() - cpu0) / seconds, 3))
            for segment in (1, 2, 5):
                cpu0, t0 = children_cpu(), time.monotonic()
                sampler = PySpySampler(server.pid, rate_hz=rate, segment_seconds=segment)
                time.sleep(12)
                sampler.read()
                sampler.close()
                h = sampler.health().detail
                out["sampler_cpu_cores"][f"{segment}s segments"] = {
                    "cores": round((children_cpu() - cpu0) / (time.monotonic() - t0), 3),
                    "segments": h["segments"], "gap_s": h["gap_seconds"], "overlap_s": h["overlap_seconds"],
                    "effective_rate_hz": h["last_effective_rate_hz"], "restarts": h["restarts"]}
    finally:
        for proc in (load, server):
            if proc is not None:
                proc.kill()
                proc.wait()
    return out


def _await_url(server: subprocess.Popen, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            raise RuntimeError(f"workload server exited with {server.wait()} before printing its URL")
        if m := re.search(r" at (http://[\d.]+:\d+)", line):
            return m.group(1)
    raise RuntimeError(f"workload server printed no URL within {timeout:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--phase", type=float, default=4.0)
    ap.add_argument("--rate", type=int, default=49)
    ap.add_argument("--workload", action="store_true", help="measure on the bundled inference server instead")
    args = ap.parse_args()
    if args.workload:
        print(json.dumps(bench_workload(args.rate), indent=1))
        return
    target = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
    rng = random.Random(1)
    wall, percpu, cpu_per_s, attach, gap_frac, overlap_frac, effective = [], [], [], [], [], [], []
    try:
        run_phase(target, 1.0)
        for _ in range(args.pairs):
            order = ["off", "on"]
            rng.shuffle(order)
            rates = {}
            for mode in order:
                if mode == "off":
                    rates[mode] = run_phase(target, args.phase)
                    continue
                cpu0 = children_cpu()
                sampler = PySpySampler(target.pid, rate_hz=args.rate)
                t0 = time.monotonic()
                rates[mode] = run_phase(target, args.phase)
                sampler.read()
                sampler.close()
                elapsed = time.monotonic() - t0
                h = sampler.health().detail
                cpu_per_s.append((children_cpu() - cpu0) / elapsed)
                attach.append(h["last_attach_seconds"] or float("nan"))
                gap_frac.append(h["gap_seconds"] / max(h["segments"], 1))
                overlap_frac.append(h["overlap_seconds"] / max(h["segments"], 1))
                effective.append(h["last_effective_rate_hz"] or 0.0)
            wall.append(rates["on"][0] / rates["off"][0])
            percpu.append(rates["on"][1] / rates["off"][1])
    finally:
        target.kill()
        target.wait()

    def summary(xs: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(xs), 4), "min": round(min(xs), 4), "max": round(max(xs), 4)}

    print(json.dumps({"pairs": args.pairs, "phase_s": args.phase, "rate_hz": args.rate,
                      "wall_throughput_on_over_off": summary(wall),
                      "per_cpu_throughput_on_over_off": summary(percpu),
                      "pyspy_cpu_cores": summary(cpu_per_s),
                      "attach_seconds": summary(attach),
                      "gap_seconds_per_1s_segment": summary(gap_frac),
                      "overlap_seconds_per_1s_segment": summary(overlap_frac),
                      "effective_rate_hz": summary(effective)}, indent=1))


if __name__ == "__main__":
    main()
