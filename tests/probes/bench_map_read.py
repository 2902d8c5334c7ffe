"""What reading the syscalls probe's per-CPU counters costs per window: bcc's per-entry batch against
`probes.map_read.percpu_array_sums` (issue 33; not collected by pytest).

The syscalls probe keeps 64 x 512 per-CPU u64 counters and reads them once per window. This builds a real BPF
per-CPU array of that size, and times, in CPU seconds of this process, three reads interleaved (order reversed every
other round): bcc's per-entry batch, the whole array into numpy, and the 512 counters of one slot (what the probe
reads now, per target). It reports medians with their 10th and 90th percentiles.

    .venv/bin/python -m tests.probes.bench_map_read [--rounds 50] [--json]

Root and a BPF-capable kernel are needed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from probes.map_read import percpu_array_sums

N = 64 * 512  # the syscalls probe's counters at its default max_targets


def _spread(values: list[float]) -> dict[str, float]:
    deciles = statistics.quantiles(values, n=10)
    return {"median_ms": 1e3 * statistics.median(values), "p10_ms": 1e3 * deciles[0], "p90_ms": 1e3 * deciles[-1]}


def main() -> int:
    from bcc import BPF

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    bpf = BPF(text=f"BPF_PERCPU_ARRAY(counts, u64, {N});".encode())
    try:
        table = bpf[b"counts"]
        ncpu = len(table.Leaf())
        for i in range(0, N, 64):  # a target's worth of non-zero counters spread over the array
            table[table.Key(i)] = table.Leaf(*[i + c + 1 for c in range(ncpu)])
        reads = {"bcc": lambda: dict(table.items_lookup_batch()), "numpy": lambda: percpu_array_sums(table),
                 "one_slot": lambda: percpu_array_sums(table, 512, 1024)}
        costs: dict[str, list[float]] = {name: [] for name in reads}
        for r in range(args.rounds):
            for name in (list(reads) if r % 2 else list(reads)[::-1]):
                t0 = time.process_time()
                reads[name]()
                costs[name].append(time.process_time() - t0)
    finally:
        bpf.cleanup()
    ratios = [b / n for b, n in zip(costs["bcc"], costs["numpy"]) if n > 0]
    out = {"entries": N, "cpus": ncpu, "rounds": args.rounds, "load_average": os.getloadavg(),
           **{name: _spread(values) for name, values in costs.items()},
           "ratio_bcc_over_numpy_median": statistics.median(ratios)}
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{N} entries x {ncpu} CPUs, {args.rounds} interleaved rounds, load {out['load_average'][0]:.2f}")
        for name in reads:
            s = out[name]
            print(f"  {name:6s} {s['median_ms']:6.2f} ms  [{s['p10_ms']:.2f}-{s['p90_ms']:.2f}]")
        print(f"  bcc / numpy, median of per-round ratios: {out['ratio_bcc_over_numpy_median']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
