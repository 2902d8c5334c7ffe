"""`infersight bench overhead|soak`: the agent's own cost, measured by the programs in `benchmarks/`.

The one module of `agent` that imports `benchmarks` (tests/test_layers.py): the benchmarks import nothing of the
agent, they run it as a separate process.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction, parser_class: type, ranged) -> None:
    bench = sub.add_parser("bench", help="measure the agent's own cost (root)")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH", parser_class=parser_class)

    overhead = bench_sub.add_parser("overhead", help="workload under fixed load, agent off/on in interleaved pairs")
    overhead.add_argument("--pairs", type=ranged(int, 1, 1000), default=3, help="off/on pairs per source (default 3)")
    overhead.add_argument("--seconds", type=ranged(float, 5, 3600), default=120.0,
                          help="seconds per side (default 120: long enough for what a steady agent does in minutes)")
    overhead.add_argument("--only", type=_source_list, default=None,
                          help="comma-separated sources measured alone (probes, stacks, store, page, all; 'each': "
                               "every one); default: the default agent")
    overhead.add_argument("--rate", type=ranged(float, 0.1, 1000), default=4.0,
                          help="open-loop requests per second (default 4)")
    overhead.add_argument("--settle", type=ranged(float, 0, 600), default=5.0,
                          help="seconds between an agent's first window and its measurement (default 5)")
    overhead.add_argument("--cold", action="store_true",
                          help="measure fresh agents, in their detector's warm-up (no bursts); by default each starts "
                               "from a store whose detector a first agent armed on the same server")
    overhead.add_argument("--compare-tree", type=Path, metavar="DIR",
                          help="also run each source's agent from this checkout (before/after, interleaved)")
    overhead.add_argument("--server", choices=("single", "engine-process", "gunicorn"), default="single",
                          help="the server watched: one process (default), an API and an engine process "
                               "(--engine-process), or a gunicorn master and 3 workers; the agent watches it as a "
                               "family (children = true) unless single")
    overhead.add_argument("--otlp", action="store_true",
                          help="also run each source's agent with [otlp] exporting to a loopback endpoint "
                               "(interleaved with the same agent without it)")
    overhead.add_argument("--json", action="store_true", help="also print one JSON object on the last line")
    overhead.set_defaults(func=_overhead)

    soak = bench_sub.add_parser("soak", help="workload, load and agent for M minutes: RSS, fds, threads, CPU, store")
    soak.add_argument("--minutes", type=ranged(float, 0.5, 7 * 24 * 60), required=True, help="how long to run")
    soak.add_argument("--every", type=ranged(float, 1, 3600), default=15.0, help="seconds between readings (default 15)")
    soak.add_argument("--rate", type=ranged(float, 0.1, 1000), default=4.0, help="requests per second (default 4)")
    soak.add_argument("--restart-every", type=ranged(float, 1, 24 * 60), default=None, metavar="MIN",
                      help="restart the server every MIN minutes (a new pid behind its pidfile): targets come and go")
    soak.add_argument("--plot", metavar="FILE.png", help="draw the readings (SVG rendered by headless chromium)")
    soak.add_argument("--json", action="store_true", help="also print one JSON object on the last line")
    soak.set_defaults(func=_soak)


def _source_list(text: str) -> list[str]:
    from benchmarks.harness import SOURCES

    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in (*SOURCES, "each")]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"unknown source(s) {bad or text!r}; choose from {','.join(SOURCES)},each")
    return names


def _overhead(args: argparse.Namespace) -> int:
    from benchmarks import overhead  # imported only when asked for: every other command stays light

    return overhead.main(args.pairs, args.seconds, args.only, args.rate, args.json, args.settle, args.compare_tree,
                         args.server, warm=not args.cold, otlp=args.otlp)


def _soak(args: argparse.Namespace) -> int:
    from agent.config import Config
    from benchmarks import soak

    # The soak's agent runs with the default retention; its store must stay within that bound.
    return soak.main(args.minutes, args.every, args.rate, args.plot, args.json, args.restart_every,
                     retention_bytes=Config().retention_bytes)
