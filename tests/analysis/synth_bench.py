"""The synthetic benchmark quoted in docs/detector.md: `.venv/bin/python -m tests.analysis.synth_bench [SEEDS]`."""

import sys

from analysis.detector import LatencyDetector
from tests.analysis.synth import Load, windows

FAULTS = {"gc": Load(slowdown=1.8, gc_pause=0.05), "lock": Load(slowdown=1.8, lock_wait_threads=0.5),
          "blocked": Load(slowdown=1.8, fsync=0.4), "blocked (stop)": Load(slowdown=1.8, stopped=5.0),
          "syscalls": Load(slowdown=1.8, syscalls_per_request=50000), "network": Load(slowdown=1.8, retransmits=50),
          "cpu_contention": Load(slowdown=1.8, runq_per_cpu=3.0),
          "compute": Load(slowdown=1.8, cpu_per_token=0.005, hot_function="attn_nocache"),
          "unknown": Load(slowdown=3.0)}


def run(seed: int) -> tuple[list[int], dict[str, list[tuple[int, str]]]]:
    """False-alarm window indexes, and per fault (delay in windows, top cause at opening)."""
    det = LatencyDetector()
    ws = (windows(0, 200, Load(), seed) + windows(200, 60, Load(rate=6.0), seed)
          + windows(260, 60, Load(rate=2.0), seed) + windows(320, 60, Load(), seed))
    starts, t = {}, 380
    for name, load in FAULTS.items():
        starts[name] = t
        ws += windows(t, 12, load, seed) + windows(t + 12, 24, Load(), seed)
        t += 36
    opens = [(i, v.opened.top_cause) for i, v in enumerate(det.update(w) for w in ws) if v.opened]
    found = {name: [(i - t0, top) for i, top in opens if t0 <= i < t0 + 14] for name, t0 in starts.items()}
    return [i for i, _ in opens if i < 380], found


def main(seeds: int) -> None:
    for seed in range(seeds):
        false, found = run(seed)
        print(f"seed {seed}: false alarms {false}; " + ", ".join(f"{n} {f}" for n, f in found.items()), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
