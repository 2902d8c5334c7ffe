"""Measure PySpySampler: target slowdown (interleaved on/off pairs), py-spy CPU, attach time, gaps.

Run as root: `.venv/bin/python -m agent.sources.bench_pyspy --pairs 6 --phase 4`
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import textwrap
import time

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--phase", type=float, default=4.0)
    ap.add_argument("--rate", type=int, default=49)
    args = ap.parse_args()
    target = subprocess.Popen([sys.executable, "-c", TARGET], stdout=subprocess.PIPE, text=True)
    rng = random.Random(1)
    wall, percpu, cpu_per_s, attach, gap_frac, overlap_frac = [], [], [], [], [], []
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
                sampler.close()
                elapsed = time.monotonic() - t0
                h = sampler.health().detail
                cpu_per_s.append((children_cpu() - cpu0) / elapsed)
                attach.append(h["last_attach_seconds"] or float("nan"))
                gap_frac.append(h["gap_seconds"] / max(h["segments"], 1))
                overlap_frac.append(h["overlap_seconds"] / max(h["segments"], 1))
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
                      "overlap_seconds_per_1s_segment": summary(overlap_frac)}, indent=1))


if __name__ == "__main__":
    main()
