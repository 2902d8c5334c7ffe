"""Benchmark: time and memory to render an SVG and a diff from 100,000 distinct stacks (a script, not library code).

Run from the repository root:  .venv/bin/python -m tests.analysis.bench_flame --runs 7
Each measurement runs in a fresh child process so peaks do not leak between runs; SVG and diff
children alternate order run by run, and results are medians with min..max.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable

from analysis.flamegraph import (
    Limits,
    Profile,
    diff,
    format_folded,
    parse_folded,
    render_diff_svg,
    render_svg,
)
from analysis.flamegraph.pprof import to_pprof
from analysis.flamegraph.speedscope import to_speedscope

LIMITS = Limits(max_stacks=1_000_000)


def make_profiles(n_stacks: int, seed: int = 6) -> tuple[Profile, Profile]:
    """A baseline and a 'regressed' current: n distinct stacks over 5,000 function names, heavy-tailed counts."""
    rng = random.Random(seed)
    funcs = [f"fn_{i} (pkg/mod_{i % 97}.py:{10 + i % 400})" for i in range(5_000)]
    roots = [f"Thread-{i}" for i in range(8)]
    stacks: set[tuple[str, ...]] = set()
    while len(stacks) < n_stacks:
        depth = rng.randint(6, 32)
        # Shared prefixes like a real program: the first frames come from a small set.
        head = [rng.choice(roots)] + [funcs[rng.randrange(40)] for _ in range(3)]
        stacks.add(tuple(head + [rng.choice(funcs) for _ in range(depth - 4)]))
    base, cur = Profile(limits=LIMITS), Profile(limits=LIMITS)
    for stack in sorted(stacks):
        count = max(1, int(rng.paretovariate(1.2)))
        base.add(stack, count)
        # About a fifth of the stacks change: some grow, some vanish, the rest stay.
        roll = rng.random()
        if roll < 0.1:
            cur.add(stack, count * 3)
        elif roll >= 0.2:
            cur.add(stack, count)
    return base, cur


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _measure(fn: Callable[[], object], traced: bool) -> tuple[dict[str, float], float | None, object]:
    """Wall and CPU seconds (CPU time is what survives a shared, contended machine) and the heap peak."""
    if traced:
        tracemalloc.start()
    t0, c0 = time.perf_counter(), time.process_time()
    result = fn()
    elapsed = {"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0}
    peak = None
    if traced:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return elapsed, peak, result


def child(task: str, n_stacks: int, traced: bool) -> dict:
    base, cur = make_profiles(n_stacks)
    rss_input = _maxrss_mib()
    out: dict = {"task": task, "traced": traced, "stacks": len(base.stacks), "samples": base.total()}
    if task == "parse":
        text = format_folded(base)
        del cur
        rss_input = _maxrss_mib()
        out["render_s"], out["peak_mib"], parsed = _measure(lambda: parse_folded(text, limits=LIMITS), traced)
        assert parsed.total() == base.total()
    elif task == "svg":
        out["render_s"], out["peak_mib"], svg = _measure(lambda: render_svg(base, title="bench"), traced)
        out["svg_bytes"] = len(svg.encode())
        out["frames_drawn"] = svg.count("<g><title>")
    elif task == "diff":
        def run() -> str:
            return render_diff_svg(diff(base, cur), title="bench diff")
        out["render_s"], out["peak_mib"], svg = _measure(run, traced)
        out["svg_bytes"] = len(svg.encode())
        out["frames_drawn"] = svg.count("<g><title>")
    elif task == "exports":
        out["folded_s"], _, folded = _measure(lambda: format_folded(base), traced)
        out["folded_bytes"] = len(folded.encode())
        out["pprof_s"], _, pb = _measure(lambda: to_pprof(base), traced)
        out["pprof_bytes"] = len(pb)
        out["speedscope_s"], _, doc = _measure(lambda: json.dumps(to_speedscope(base, "bench")), traced)
        out["speedscope_bytes"] = len(doc.encode())
    else:
        raise ValueError(f"unknown task {task!r}; expected parse, svg, diff or exports")
    out["rss_input_mib"] = rss_input
    out["rss_peak_mib"] = _maxrss_mib()
    return out


def _spawn(task: str, n_stacks: int, traced: bool) -> dict:
    cmd = [sys.executable, "-m", "tests.analysis.bench_flame", "--child", task, "--stacks", str(n_stacks)]
    if traced:
        cmd.append("--traced")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
    return json.loads(proc.stdout)


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}..{max(values):.2f})"


def _times(runs: list[dict], key: str) -> str:
    return f"{_summary([r[key]['cpu'] for r in runs])} | {_summary([r[key]['wall'] for r in runs])}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--stacks", type=int, default=100_000)
    ap.add_argument("--child", choices=("parse", "svg", "diff", "exports"))
    ap.add_argument("--traced", action="store_true", help="measure the Python heap peak (slower)")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.stacks, args.traced)))
        return
    tasks = ("parse", "svg", "diff")
    timed: dict[str, list[dict]] = {task: [] for task in tasks}
    for i in range(args.runs):
        # Rotate the order so no task always runs first (or last) after a quiet spell on a shared machine.
        for task in tasks[i % 3:] + tasks[:i % 3]:
            timed[task].append(_spawn(task, args.stacks, traced=False))
    traced = {task: _spawn(task, args.stacks, traced=True) for task in tasks}
    exports = _spawn("exports", args.stacks, traced=False)
    first = timed["svg"][0]
    print(f"{first['stacks']:,} distinct stacks, {first['samples']:,} samples; {args.runs} runs per row, "
          "median (min..max)")
    print("| step | CPU s | wall s | Python heap peak MiB | process max RSS MiB (input alone) | SVG bytes "
          "| frames drawn |")
    print("|---|---|---|---|---|---|---|")
    labels = {"parse": f"parse_folded ({first['stacks']:,} lines)", "svg": "render_svg",
              "diff": "diff + render_diff_svg"}
    for task in tasks:
        runs = timed[task]
        rss_input = statistics.median(r["rss_input_mib"] for r in runs)
        drawn = f"{runs[0]['svg_bytes']:,} | {runs[0]['frames_drawn']:,}" if "svg_bytes" in runs[0] else " | "
        print(f"| {labels[task]} | {_times(runs, 'render_s')} | {traced[task]['peak_mib']:.0f} | "
              f"{_summary([r['rss_peak_mib'] for r in runs])} ({rss_input:.0f}) | {drawn} |")
    print(f"exports, one run, CPU s: format_folded {exports['folded_s']['cpu']:.2f} ({exports['folded_bytes']:,} B), "
          f"to_pprof {exports['pprof_s']['cpu']:.2f} ({exports['pprof_bytes']:,} B gzipped), "
          f"to_speedscope+json.dumps {exports['speedscope_s']['cpu']:.2f} ({exports['speedscope_bytes']:,} B)")


if __name__ == "__main__":
    main()
