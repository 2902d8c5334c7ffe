"""RSS growth of the agent's sink alone: a recording's windows through the store and the detector, as the daemon does.

    .venv/bin/python -m tests.agent.bench_sink_rss tests/scenarios/recorded-neighbours/steady.jsonl.gz --windows 720 \\
        [--sqlite-cache-kib 64]

No probe, py-spy or page runs: what grows here is the store's and the detector's (docs/BENCHMARKS.md "Where the steady
growth goes"). Windows are replayed in a loop, shifted in time, only the recording's `normal` ones.
"""

from __future__ import annotations

import argparse
import copy
import gc
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import agent.store.db as db
from agent.daemon import TRIM_EVERY_WINDOWS, _latency_detector
from agent.detection import Detection
from agent.evaluation.recording import read_recording
from agent.memory import trim_heap
from agent.store import Store
from agent.store.rollup import Rollup

ROLLUP_EVERY_WINDOWS = 60  # the daemon's housekeeping warms the rollup every 300 s


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _small_cache(kib: int) -> Callable[[], None]:
    """Every connection the store opens holds its SQLite page cache at `kib` KiB (the default is 2 MiB each);
    returns what puts the store's own connect functions back."""
    plain, read_only = db.connect, db.connect_read_only

    def connect(path: Path):
        conn = plain(path)
        conn.execute(f"PRAGMA cache_size=-{kib}")
        return conn

    def connect_ro(path: Path):
        conn = read_only(path)
        conn.execute(f"PRAGMA cache_size=-{kib}")
        return conn

    db.connect, db.connect_read_only = connect, connect_ro

    def restore() -> None:
        db.connect, db.connect_read_only = plain, read_only

    return restore


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recording", type=Path)
    ap.add_argument("--windows", type=int, default=720)
    ap.add_argument("--from-window", type=int, default=150, help="growth is measured from this window on")
    ap.add_argument("--sqlite-cache-kib", type=int, default=None)
    args = ap.parse_args(argv)
    restore = _small_cache(args.sqlite_cache_kib) if args.sqlite_cache_kib is not None else None
    try:
        return _run(args)
    finally:
        if restore is not None:
            restore()


def _run(args: argparse.Namespace) -> int:
    items = [i for i in read_recording(args.recording).windows if i.label == "normal"]
    if not items:
        print(f"{args.recording}: no normal window", file=sys.stderr)
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="infersight-sink-rss-"))
    store = Store.open(workdir)
    detection = Detection(store, make_detector=lambda: _latency_detector(24))
    rollup = Rollup(store)
    span = items[-1].window.end - items[0].window.start + 5.0
    start_rss = None
    cpu0 = time.process_time()
    for n in range(args.windows):
        window = copy.deepcopy(items[n % len(items)].window)
        shift = span * (n // len(items))
        window.start += shift
        window.end += shift
        store.add_window(window)
        detection.observe(window)
        if n % TRIM_EVERY_WINDOWS == 0:
            trim_heap()
        if n % ROLLUP_EVERY_WINDOWS == 0:
            rollup.warm([t.name for t in store.targets()])
        if n == args.from_window:
            gc.collect()
            start_rss = rss_mib()
    gc.collect()
    trim_heap()
    end_rss = rss_mib()
    if start_rss is None:
        print(f"--from-window {args.from_window} is not below --windows {args.windows}", file=sys.stderr)
        return 2
    print(f"windows {args.windows}, RSS at window {args.from_window}: {start_rss:.1f} MiB, at the end {end_rss:.1f} MiB, "
          f"growth {end_rss - start_rss:.1f} MiB; CPU {time.process_time() - cpu0:.1f} s; "
          f"SQLite cache {'default' if args.sqlite_cache_kib is None else f'{args.sqlite_cache_kib} KiB'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
