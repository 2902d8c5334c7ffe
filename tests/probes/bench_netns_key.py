"""What keying the targets' ports by network namespace costs the delivery probe, per BPF program run: this tree's
probe against the same probe at an earlier commit (ports keyed alone), side by side.

Run as root from the repository root, under the exclusive lock (a few minutes; docs/BENCHMARKS.md "Ports keyed by
network namespace, cost"):

    .venv/bin/python -m tests.probes.bench_netns_key --against f9ed8cc [--rounds 10] [--json]

`--against REV`: probes/delivery.py at REV (`git show`), loaded beside this tree's. Each round runs, for each mode
in a random order, a pair (this tree, REV) in a random order, on the workload of tests/probes/bench_delivery.py
(client and server pinned to one CPU):

- `conn`: a connection per op (connect, a byte each way, close), the server a target: each handshake on the
  target's port reads the socket's namespace (two `bpf_probe_read_kernel`) and looks up (namespace, port);
- `pingpong`: one connection, a byte each way per round trip, the server a target: every segment's `tcp_probe`
  finds the flow (the per-segment path). Its replies complete only when the connection ends (each inbound segment
  both acknowledges a reply and asks for the next, and `tcp_probe` sees `snd_una` before the segment moves it), so
  the per-reply test of the port is in `conn`, where each connection's reply is delivered;
- `conn-other`: a connection per op with another process as the target: handshakes on a port no target listens
  on, what every other server on the host pays (this tree: an array load; REV: a hash miss).

The kernel's own BPF statistics (`kernel.bpf_stats_enabled`, on for the run, restored after) give each program's
run count and run time: ns per op summed over the hooks, each pair's difference (this tree - REV) given as the
median and p10..p90 over the pairs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from probes.delivery import DeliveryProbe
from tests.probes.bench_first_request import bpf_stats_and_workload, condition_summary, hook_runs, pair_summary

MODES = ("conn", "pingpong", "conn-other")


def load_at(rev: str, tmp: Path, source: str = "probes/delivery.py", name: str = "DeliveryProbe"):
    """Class `name` of `source` at `rev` (its imports resolve to this tree's modules): the delivery probe by default."""
    text = subprocess.run(["git", "show", f"{rev}:{source}"], capture_output=True, text=True, check=True).stdout
    module_name = Path(source).stem + "_at_rev"
    path = tmp / f"{module_name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return getattr(module, name)


def measure(binary: Path, mode: str, ops: int, probe_class) -> dict:
    runs, reading = hook_runs(binary, mode != "pingpong", ops, probe_class(), targets_self=mode == "conn-other")
    return {"runs": runs, "total_ns": sum(t for _, t in runs.values()),
            "connects": reading.connects if reading else None, "replies": reading.replies if reading else None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the commit whose probes/delivery.py is compared")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--round-trips", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    results: dict[str, dict[str, list[dict]]] = {m: {"this": [], "rev": []} for m in MODES}
    with tempfile.TemporaryDirectory() as tmp, bpf_stats_and_workload() as binary:
        classes = {"this": DeliveryProbe, "rev": load_at(args.against, Path(tmp))}
        for _ in range(args.rounds):
            for mode in rng.sample(MODES, len(MODES)):
                ops = args.round_trips if mode == "pingpong" else args.connections
                for cond in rng.sample(["this", "rev"], 2):
                    results[mode][cond].append(measure(binary, mode, ops, classes[cond]))
    summary = {}
    for mode, per in results.items():
        ops = args.round_trips if mode == "pingpong" else args.connections
        summary[f"{mode} this-rev"] = pair_summary(per["this"], per["rev"], ops)
        for cond, rs in per.items():
            summary[f"{mode} {cond}"] = {**condition_summary(rs, ops), "connects": [r["connects"] for r in rs],
                                         "replies": [r["replies"] for r in rs]}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for name, r in summary.items():
            extra = ("; " + ", ".join(f"{h} {v['ns_per_run']} ns x{v['runs_per_op']}" for h, v in r["hooks"].items()
                                      if v["runs_per_op"])) if "hooks" in r else ""
            print(f"{name}: {r['ns_per_op_median']} ns per op [p10..p90 {r['p10_p90']}]{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
