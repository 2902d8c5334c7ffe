"""A lower steady stack rate, replayed: each recording's steady py-spy ticks thinned to a lower rate, seeded.

A steady window's `stacks` reading holds `samples` ticks; at every tick py-spy read every thread once, so a
thread's folded stacks sum to at most `samples`. A recorder at rate r' < r would have taken each tick with
probability r'/r (the ticks a lower rate keeps are a thinning of the higher rate's; their phase against the
workload is as random as the original's). Replayed that way, a window keeps k ~ Binomial(samples, r'/r) ticks,
and each thread's stacks are the ones it showed at k ticks drawn without replacement from the window's
`samples` (a multivariate hypergeometric draw per thread, the ticks it was absent from as one more colour):
every count is exact in expectation (p x n), `samples` is the ticks kept, and a per-tick figure such as the
lock signal (`app_wait_threads`, idle waits over ticks) is unbiased given k. Threads are drawn independently of
one another, so the replay does not keep which threads shared a tick (no signal the detector reads depends on it).

Burst windows (a rate above 1.5 x the recording's steady rate) and a family's windows (members carry their own
readings) are left as recorded. The thinned windows then go through `SteadySpans` (the default 15 s steady
recordings, three 5 s windows; `replay_spans` replays a recording already made that way as recorded) and the
detector, against the same recording at the steady rate of 3 Hz:

    .venv/bin/python -m agent.evaluation.thin_stacks --rates 1 2 --seeds 0 1 2 tests/scenarios/recorded*/*.jsonl.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from agent.evaluation.bursts import replay_bursts
from agent.evaluation.recording import LabelledWindow, read_recording
from agent.evaluation.steady_gaps import BURST_FACTOR, SteadySpans, replay_spans
from analysis.scoring import score_run, summarize
from analysis.window import StackReading

BASELINE_HZ = 3.0


def _thread(stack: str) -> str:
    return stack.split(";", 1)[0]


def thin_reading(s: StackReading, p: float, rng: np.random.Generator) -> StackReading:
    """`s` as a recorder at `p` times its rate would have read it (the module's docstring). p >= 1: unchanged."""
    if p >= 1.0:
        return s
    keys = [("active", k, n) for k, n in s.active.items()] + [("idle", k, n) for k, n in s.idle.items()]
    out = StackReading(rate_hz=s.rate_hz * p)
    total = int(s.samples)
    kept = int(rng.binomial(total, p)) if total > 0 else 0
    out.samples = kept
    by_thread: dict[str, list[int]] = {}
    for i, (_, stack, _) in enumerate(keys):
        by_thread.setdefault(_thread(stack), []).append(i)
    counts = [0] * len(keys)
    for idx in by_thread.values():
        n = np.array([int(keys[i][2]) for i in idx], dtype=np.int64)
        if total > 0 and int(n.sum()) <= total:
            colours = np.append(n, total - int(n.sum()))
            drawn = rng.multivariate_hypergeometric(colours, kept)[:-1]
        else:
            # Two threads of one name (their stacks sum past the ticks), or no tick count: each stack's samples
            # thinned alone at the kept share (still exact in expectation).
            share = kept / total if total > 0 else p
            drawn = rng.binomial(n, share)
        for i, c in zip(idx, drawn):
            counts[i] = int(c)
    for (part, stack, _), c in zip(keys, counts):
        if c:
            getattr(out, part)[stack] = c
    return out


def steady_rate(windows: Sequence[LabelledWindow]) -> float | None:
    rates = [w.window.stacks.rate_hz for w in windows
             if w.window.stacks is not None and not w.window.members and w.window.stacks.rate_hz > 0]
    return min(rates) if rates else None


def thin_windows(windows: Sequence[LabelledWindow], rate_hz: float, seed: int, name: str = "") -> list[LabelledWindow]:
    """Every steady window's stacks thinned to `rate_hz` (never raised), bursts and family windows as recorded;
    deterministic per (`seed`, `name`)."""
    steady = steady_rate(windows)
    if steady is None or rate_hz >= steady:
        return list(windows)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    p = rate_hz / steady
    out = []
    for item in windows:
        s = item.window.stacks
        if s is None or item.window.members or s.rate_hz > steady * BURST_FACTOR:
            out.append(item)
            continue
        out.append(dataclasses.replace(item, window=dataclasses.replace(item.window, stacks=thin_reading(s, p, rng))))
    return out


def _phases(score: Any) -> list[dict[str, Any]]:
    return [{"label": p.label, "detected": p.detected, "cause": p.top_cause, "delay_s": p.delay_seconds}
            for p in score.fault_phases]


def replay_one(path: Path, rate_hz: float, seed: int, span: int, sampling_noise: bool = True) -> dict[str, Any]:
    rec = read_recording(path)
    windows = thin_windows(rec.windows, rate_hz, seed, name=str(path))
    from analysis.detector import LatencyDetector

    factory = functools.partial(LatencyDetector, sampling_noise=sampling_noise)
    _, outcomes = replay_spans(windows, SteadySpans(span), factory=factory)
    score = score_run(rec.scenario.name, outcomes)
    bursts = replay_bursts(outcomes, rec.interval_seconds)
    return {"score": score, "phases": _phases(score), "false_alarms": sum(e.phase is None for e in score.episodes),
            "false_bursts": bursts.false_bursts, "hours": bursts.seconds / 3600.0}


def _job(args: tuple[str, list[tuple[float, int]], int, bool]) -> tuple[str, dict[str, dict[str, Any]]]:
    path, arms, span, noise = args
    return path, {f"{r}@{s}": replay_one(Path(path), r, s, span, noise) for r, s in arms}


def _figures(runs: dict[str, dict[str, Any]], arm: str) -> dict[str, Any]:
    summ = summarize([r[arm]["score"] for r in runs.values()])
    fb = {kind: [sum(r[arm]["false_bursts"] for p, r in runs.items() if Path(p).name.startswith(kind)),
                 sum(r[arm]["hours"] for p, r in runs.items() if Path(p).name.startswith(kind))]
          for kind in ("steady", "load_steps")}
    return {k: summ[k] for k in ("recall", "precision", "false_alarms", "false_alarms_per_hour", "attribution_top1",
                                 "median_delay_seconds", "fault_phases", "episodes")} | {
        "per_label": {lab: {k: v for k, v in c.items() if k in ("phases", "detected", "attributed")}
                      for lab, c in summ["per_label"].items()},
        "false_bursts_per_hour": {k: (round(n / h, 2) if h else None) for k, (n, h) in fb.items()},
        "false_bursts": {k: n for k, (n, _) in fb.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recordings", nargs="+", type=Path)
    parser.add_argument("--rates", type=float, nargs="+", default=[1.0, 2.0], help="steady rates to thin to (Hz)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--windows", type=int, default=3, help="windows one steady recording spans (default 3: 15 s)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="write every run's rows (JSON lines) here")
    parser.add_argument("--sampling-noise", action=argparse.BooleanOptionalAction, default=True,
                        help="the detector judges stack signals against their sampling noise (analysis.sampling; the "
                             "default): --no-sampling-noise replays the detector without those gates")
    args = parser.parse_args(argv)
    base = f"{BASELINE_HZ}@0"
    arms = [(BASELINE_HZ, 0)] + [(r, s) for r in args.rates for s in args.seeds]
    jobs = [(str(p), arms, args.windows, args.sampling_noise) for p in args.recordings]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = dict(pool.map(_job, jobs))
    rows = []
    for path, res in runs.items():
        for arm, r in res.items():
            same = r["phases"] == res[base]["phases"] and r["false_alarms"] == res[base]["false_alarms"]
            rows.append({"recording": path, "arm": arm, "same_as_3hz": same, "phases": r["phases"],
                         "false_alarms": r["false_alarms"], "false_bursts": r["false_bursts"]})
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = {"runs": len(runs), "arms": {}}
    for rate, seed in arms:
        arm = f"{rate}@{seed}"
        changed = [{"recording": r["recording"], "phases": r["phases"], "false_alarms": r["false_alarms"],
                    "at_3hz": {"phases": runs[r["recording"]][base]["phases"],
                               "false_alarms": runs[r["recording"]][base]["false_alarms"]}}
                   for r in rows if r["arm"] == arm and not r["same_as_3hz"]]
        report["arms"][arm] = {**_figures(runs, arm), "runs_changed": len(changed), "changed": changed}
    print(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
