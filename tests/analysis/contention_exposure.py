"""What a harmless heavy neighbour costs the contention rule (docs/BENCHMARKS.md, "The outside hog found by its
stall and its neighbour"): per seed, 60 baseline windows of test_contention's shared host (stall 0.25 s/s, tenants
that come and go), then WINDOWS windows of a hog charged 40 % of the server's run-queue wait with the stall at
0.8 s/s and the server's latency untouched but for `host_noise`. Prints the windows each seed opened on.

    python -m tests.analysis.contention_exposure [HOST_NOISE ...] [--windows 200] [--seeds 10] [--onset 12]
"""

from __future__ import annotations

import argparse

from analysis.detector import LatencyDetector
from tests.analysis import synth
from tests.analysis.synth import Load
from tests.analysis.test_contention import shared


def opened(noise: float, seed: int, windows: int, onset: int) -> list[int]:
    det = LatencyDetector(contention_onset_windows=onset)
    for w in synth.windows(0, 60, Load(host_noise=noise), seed=seed):
        det.update(shared(w, 0.25, None, seed))
    out = []
    for i, w in enumerate(synth.windows(60, windows, Load(host_noise=noise), seed=seed)):
        if det.update(shared(w, 0.8, 0.4, seed)).opened is not None:
            out.append(i)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("noise", nargs="*", type=float, default=[0.0, 0.1, 0.2, 0.3, 0.5])
    ap.add_argument("--windows", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--onset", type=int, default=LatencyDetector().contention_onset_windows)
    args = ap.parse_args()
    for noise in args.noise:
        runs = [opened(noise, seed, args.windows, args.onset) for seed in range(args.seeds)]
        print(f"host_noise {noise}: {sum(bool(r) for r in runs)} of {args.seeds} seeds opened, "
              f"{sum(map(len, runs))} regressions; windows after the hog came: {[r for r in runs if r]}")


if __name__ == "__main__":
    main()
