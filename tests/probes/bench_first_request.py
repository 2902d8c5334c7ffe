"""What the first request's wait costs the delivery probe, per BPF program run, with and without it.

Run as root from the repository root, under the exclusive lock (about a minute; docs/BENCHMARKS.md "The first
request's wait, cost"):

    .venv/bin/python -m tests.probes.bench_first_request [--rounds 4] [--connections 3000] [--json]

The delivery probe (target: the workload's server) is attached with `DeliveryConfig(first_request=True)` and
`False` in alternation, `--rounds` pairs of each mode, the order within each pair drawn at random (`--seed`); the
figure is each pair's difference (on - off), given as the median and the p10..p90 of the pairs. While it is attached, the workload of tests/probes/bench_delivery.py
runs in its connection mode (a connection per op: connect, a byte each way, close; client and server pinned to one
CPU) and then in its ping-pong mode (one connection, a byte each way per round trip). The kernel's own BPF
statistics (`kernel.bpf_stats_enabled`, on for the run and restored after; each program fd's fdinfo) give each program's
run count and run time: ns per run of each hook, and ns per connection and per segment summed over the hooks,
the kernel's figure rather than a wall-clock difference. With the wait, a completed handshake makes the new
socket's `flows` entry (`inet_sock_set_state`), and the first segment after it takes one more branch and a few
counter increments (`tcp_probe`); every other segment pays one load and a branch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from probes.delivery import DeliveryConfig, DeliveryProbe
from tests.probes.bench_delivery import WORKLOAD_C, Workload

HOOKS = ("tcp_probe", "inet_sock_set_state", "sock_send_length", "sock_recv_length", "tcp_destroy_sock")


def prog_stats(bpf, hooks: tuple[str, ...] = HOOKS) -> dict[str, tuple[int, int]]:
    """Hook -> (run_cnt, run_time_ns) of the probe's own program on it, from its fd's fdinfo (the kernel truncates
    program names to 15 characters, so bpftool's names do not tell the tcp tracepoints apart)."""
    got: dict[str, tuple[int, int]] = {}
    for name, fn in bpf.funcs.items():
        hook = next((h for h in hooks if (name.decode() if isinstance(name, bytes) else name).endswith(h)), None)
        if hook is None:
            continue
        info = dict(line.split(":", 1) for line in Path(f"/proc/self/fdinfo/{fn.fd}").read_text().splitlines()
                    if ":" in line)
        got[hook] = (int(info.get("run_cnt", "0")), int(info.get("run_time_ns", "0")))
    for hook in hooks:
        got.setdefault(hook, (0, 0))
    return got


def hook_runs(binary: Path, connections: bool, ops: int, probe, targets_self: bool = False) -> tuple[dict, object]:
    """Run the workload under a started `probe` (the workload's server as its target, or this process with
    `targets_self`): per hook (runs, ns) from the kernel's BPF stats, and the server's reading."""
    w = Workload(binary, argparse.Namespace(round_trips=ops, cpu=1, connections=connections))
    try:
        probe.start([os.getpid()] if targets_self else [w.server])
        before = prog_stats(probe._bpf)
        w.go()
        after = prog_stats(probe._bpf)
        reading = probe.read().get(w.server)
    finally:
        probe.stop()
        w.kill()
    return {h: (after[h][0] - before[h][0], after[h][1] - before[h][1]) for h in HOOKS}, reading


def measure(binary: Path, mode: str, ops: int, first_request: bool) -> dict:
    runs, reading = hook_runs(binary, mode == "conn", ops, DeliveryProbe(DeliveryConfig(first_request=first_request)))
    return {"runs": runs, "total_ns": sum(t for _, t in runs.values()),
            "first_requests": reading.first_requests if reading else None,
            "late_requests": reading.late_requests if reading else None}


def _p10_p90(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (float("nan"), float("nan"))
    q = statistics.quantiles(xs, n=10, method="inclusive")
    return q[0], q[-1]


@contextlib.contextmanager
def bpf_stats_and_workload() -> Iterator[Path]:
    """The workload compiled into a scratch folder, with the kernel's BPF run statistics on while it is used (set
    back as they were after)."""
    stats_path = Path("/proc/sys/kernel/bpf_stats_enabled")
    was = stats_path.read_text().strip()
    with tempfile.TemporaryDirectory() as tmp:
        src, binary = Path(tmp) / "w.c", Path(tmp) / "w"
        src.write_text(WORKLOAD_C)
        subprocess.run(["cc", "-O2", "-o", str(binary), str(src)], check=True)
        stats_path.write_text("1")
        try:
            yield binary
        finally:
            stats_path.write_text(was)


def pair_summary(first: list[dict], second: list[dict], ops: int) -> dict:
    """Per pair, the first run's BPF ns per op less the second's: median, p10..p90 and every pair."""
    pairs = [(a["total_ns"] - b["total_ns"]) / ops for a, b in zip(first, second, strict=True)]
    return {"ns_per_op_median": round(statistics.median(pairs), 1), "p10_p90": [round(x, 1) for x in _p10_p90(pairs)],
            "ns_per_op": [round(x, 1) for x in pairs]}


def condition_summary(rs: list[dict], ops: int) -> dict:
    """One condition's runs: BPF ns per op (median, p10..p90) and, per hook, runs per op and ns per run."""
    hooks = {}
    for h in HOOKS:
        per_run = [r["runs"][h][1] / r["runs"][h][0] for r in rs if r["runs"][h][0]]
        hooks[h] = {"runs_per_op": round(sum(r["runs"][h][0] for r in rs) / ops / len(rs), 2),
                    "ns_per_run": round(statistics.median(per_run), 1) if per_run else None,
                    "ns_per_run_p10_p90": [round(x, 1) for x in _p10_p90(per_run)] if per_run else None}
    per_op = [r["total_ns"] / ops for r in rs]
    return {"ns_per_op_median": round(statistics.median(per_op), 1),
            "p10_p90": [round(x, 1) for x in _p10_p90(per_op)], "hooks": hooks}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--round-trips", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    results: dict[str, dict[str, list[dict]]] = {m: {"on": [], "off": []} for m in ("conn", "pingpong")}
    with bpf_stats_and_workload() as binary:
        for _ in range(args.rounds):
            for mode, ops in rng.sample([("conn", args.connections), ("pingpong", args.round_trips)], 2):
                for on in rng.sample([True, False], 2):  # a pair, in a random order
                    results[mode]["on" if on else "off"].append(measure(binary, mode, ops, on))
    summary = {}
    for mode, per in results.items():
        ops = args.connections if mode == "conn" else args.round_trips
        summary[f"{mode} on-off"] = pair_summary(per["on"], per["off"], ops)
        for cond, rs in per.items():
            summary[f"{mode} {cond}"] = {**condition_summary(rs, ops),
                                         "ns_per_op": [round(r["total_ns"] / ops, 1) for r in rs],
                                         "first_requests": [r["first_requests"] for r in rs],
                                         "late_requests": [r["late_requests"] for r in rs]}
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        for name, r in summary.items():
            if name.endswith("on-off"):
                print(f"{name}: {r['ns_per_op_median']} ns per op [p10..p90 {r['p10_p90']}] over {len(r['ns_per_op'])} "
                      f"pairs")
                continue
            hooks = ", ".join(f"{h} {v['ns_per_run']} ns x{v['runs_per_op']}" for h, v in r["hooks"].items()
                              if v["runs_per_op"])
            print(f"{name}: {r['ns_per_op_median']} ns per op (BPF, all hooks) {r['ns_per_op']}; {hooks}; "
                  f"first requests {r['first_requests']} late {r['late_requests']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
