"""What reading each retransmit's network namespace costs the tcpretrans probe, per BPF program run: the probe keyed
by namespace against the same probe with the namespace not read (`TcpRetransConfig(netns=False)`: the program
before the namespace was keyed, which read the tracepoint's fields only), side by side.

Run as root from the repository root, under the exclusive lock (a few minutes; docs/BENCHMARKS.md "tcpretrans keyed
by network namespace"):

    .venv/bin/python -m tests.probes.bench_tcpretrans_netns [--against REV] [--rounds 8] [--json]

`--against REV` adds a third condition: probes/tcpretrans.py at REV (`git show`; before the namespace was keyed,
its flow key 4 bytes shorter), loaded beside this tree's, so each round is then a triple in a random order.

Workload: one namespace pair (tests/probes/netns_helper.py, one MSS per packet, rto_min 10 ms), a fifth of the
packets to and from the server's port dropped in both namespaces; per run, the server of
tests/probes/delivery_peers.py (the probe's target) answers `--connections` clients' `--requests` requests of
`--size` bytes each. Each round runs a pair (keyed, not keyed) in a random order (`--seed`). The kernel's own BPF
statistics (`kernel.bpf_stats_enabled`, on for the run, restored after; each program fd's fdinfo) give the
`tcp_retransmit_skb` and `tcp_retransmit_synack` programs' run counts and run times: ns per run of each, and each
pair's difference (keyed - not keyed) in ns per retransmit (the two programs' time over their runs), as the median
and p10..p90 over the pairs. The server namespace's RetransSegs over each run is printed next to the runs, as the
check that the programs ran for the retransmits the kernel counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from probes.tcpretrans import TcpRetransConfig, TcpRetransProbe
from tests.probes.bench_first_request import _p10_p90, prog_stats
from tests.probes.bench_netns_key import load_at
from tests.probes.netns_helper import NetnsPair, netns_pair_context

HOOKS = ("tcp_retransmit_skb", "tcp_retransmit_synack")
PORT = 18434


@contextlib.contextmanager
def bpf_stats() -> Iterator[None]:
    """The kernel's BPF run statistics on while inside, set back as they were after."""
    path = Path("/proc/sys/kernel/bpf_stats_enabled")
    was = path.read_text().strip()
    path.write_text("1")
    try:
        yield
    finally:
        path.write_text(was)


def measure(pair: NetnsPair, probe, args: argparse.Namespace) -> dict:
    server = subprocess.Popen(pair.exec_argv(pair.a, [sys.executable, "-m", "tests.probes.delivery_peers", "server",
                                                      str(PORT)]), stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError("the server did not start")
        probe.start([server.pid])
        segs = pair.retrans_segs(pair.a)
        before = prog_stats(probe._bpf, HOOKS)
        subprocess.run(pair.exec_argv(pair.b, [sys.executable, "-m", "tests.probes.delivery_peers", "client",
                                               pair.addr_a, str(PORT), str(args.connections), str(args.requests),
                                               str(args.size), "0"]),
                       check=True, capture_output=True, timeout=300)
        after = prog_stats(probe._bpf, HOOKS)
        segs = pair.retrans_segs(pair.a) - segs
        reading = probe.read().get(server.pid)
        health = probe.health().detail.get("netns", "not keyed (REV)")
    finally:
        probe.stop()
        server.kill()
        server.wait()
    runs = {h: (after[h][0] - before[h][0], after[h][1] - before[h][1]) for h in HOOKS}
    return {"runs": runs, "server_retrans_segs": segs, "attributed": reading.retransmits if reading else None,
            "netns": health}


def _ns_per_run(r: dict) -> float:
    n = sum(c for c, _ in r["runs"].values())
    return sum(t for _, t in r["runs"].values()) / n if n else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a commit whose probes/tcpretrans.py is compared too")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--size", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    factories = {"keyed": lambda: TcpRetransProbe(TcpRetransConfig(netns=True)),
                 "alone": lambda: TcpRetransProbe(TcpRetransConfig(netns=False))}
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            factories["rev"] = load_at(args.against, Path(tmp), "probes/tcpretrans.py", "TcpRetransProbe")
        results: dict[str, list[dict]] = {c: [] for c in factories}
        with bpf_stats(), netns_pair_context(tag="isbr", rto_min_ms=10) as pair:
            pair.add_random_drop(pair.a, PORT)
            pair.add_random_drop(pair.b, PORT)
            for _ in range(args.rounds):
                for cond in rng.sample(sorted(factories), len(factories)):
                    results[cond].append(measure(pair, factories[cond](), args))
    summary: dict = {}
    for other in [c for c in results if c != "keyed"]:
        pairs = [_ns_per_run(k) - _ns_per_run(a) for k, a in zip(results["keyed"], results[other], strict=True)]
        summary[f"keyed-{other} ns per retransmit"] = {
            "median": round(statistics.median(pairs), 1), "p10_p90": [round(x, 1) for x in _p10_p90(pairs)],
            "pairs": [round(x, 1) for x in pairs]}
    for cond, rs in results.items():
        per = [_ns_per_run(r) for r in rs]
        summary[cond] = {"ns_per_retransmit_median": round(statistics.median(per), 1),
                         "p10_p90": [round(x, 1) for x in _p10_p90(per)],
                         "runs": [sum(c for c, _ in r["runs"].values()) for r in rs],
                         "synack_runs": [r["runs"]["tcp_retransmit_synack"][0] for r in rs],
                         "server_retrans_segs": [r["server_retrans_segs"] for r in rs],
                         "attributed": [r["attributed"] for r in rs], "netns": rs[0]["netns"]}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for name, r in summary.items():
            print(f"{name}: {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
