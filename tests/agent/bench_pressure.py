"""CPU time of the pressure source's read (agent/sources/pressure.py), as a share of a core at one read per window.

Run: .venv/bin/python -m tests.agent.bench_pressure [--reads N] [--interval SECONDS]
"""

from __future__ import annotations

import argparse
import os
import resource

from agent.sources.pressure import PressureSource


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=2000)
    parser.add_argument("--interval", type=float, default=5.0, help="window length: one read per window")
    args = parser.parse_args()
    source = PressureSource(os.getpid())
    start = cpu_seconds()
    for _ in range(args.reads):
        source.read()
    per_read = (cpu_seconds() - start) / args.reads
    print(f"{args.reads} reads: {per_read * 1e6:.0f} us CPU per read; one read per {args.interval:g} s window: "
          f"{100 * per_read / args.interval:.4f} % of a core per target")


if __name__ == "__main__":
    main()
