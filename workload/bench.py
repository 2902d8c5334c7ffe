"""`python -m workload bench faults|batch|kvcache|engine-process`: bounded benchmarks that print Markdown tables."""

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from workload.client import CompletionResult, complete, set_fault
from workload.faults import FAULT_NAMES
from workload.launch import launched_server
from workload.loadgen import LoadSpec, Phase, run_load, summarize
from workload.stats import percentile

DEFAULT_RATE = 2.0  # req/s: the "default load" of the fault table; well inside capacity on 2 shared cores


@dataclass
class PairResult:
    off_p99: float
    on_p99: float


def _p99(values: list[float]) -> float:
    return percentile(values, 99)


def _phase(url: str, rate: float, seconds: float, seed: int) -> tuple[list[float], int, int, float]:
    spec = LoadSpec((Phase(rate, seconds),), seed=seed)
    result = run_load(url, spec)
    summary = summarize(result)
    latencies = [o.result.latency_s for o in result.outcomes if o.result.ok]
    return latencies, summary.sent, summary.sent - summary.ok, summary.throughput_rps


def bench_faults(args: argparse.Namespace) -> dict:
    """Interleaved off/on phases per fault at the default load; the order flips every pair."""
    rows = {}
    with launched_server("--device", args.device) as server:
        _phase(server.url, args.rate, 3, seed=999)  # warm-up
        for name in args.faults:
            pooled = {"off": [], "on": []}
            pairs: list[PairResult] = []
            errors = {"off": 0, "on": 0}
            sent = {"off": 0, "on": 0}
            thr = {"off": [], "on": []}
            for pair in range(args.pairs):
                order = ("off", "on") if pair % 2 == 0 else ("on", "off")
                p99 = {}
                for state in order:
                    rate = args.rate
                    if name == "load+50%":
                        rate = args.rate * 1.5 if state == "on" else args.rate
                    else:
                        set_fault(server.url, name, state == "on", server.token)
                    try:
                        lat, n, err, tput = _phase(server.url, rate, args.seconds, seed=pair * 2 + (state == "on"))
                    finally:
                        if name != "load+50%":
                            set_fault(server.url, name, False, server.token)
                    pooled[state] += lat
                    errors[state] += err
                    sent[state] += n
                    thr[state].append(tput)
                    p99[state] = _p99(lat)
                pairs.append(PairResult(p99["off"], p99["on"]))
                print(f"  {name} pair {pair}: p99 off {p99['off']*1000:.0f} ms on {p99['on']*1000:.0f} ms",
                      file=sys.stderr)
            ratios = [p.on_p99 / p.off_p99 for p in pairs]
            rows[name] = {
                "p99_off_ms": _p99(pooled["off"]) * 1000, "p99_on_ms": _p99(pooled["on"]) * 1000,
                "ratio_pooled": _p99(pooled["on"]) / _p99(pooled["off"]),
                "ratio_pairs_median": statistics.median(ratios), "ratio_pairs_min": min(ratios),
                "ratio_pairs_max": max(ratios), "requests_off": sent["off"], "requests_on": sent["on"],
                "errors_off": errors["off"], "errors_on": errors["on"],
                "throughput_on_rps": statistics.mean(thr["on"]), "throughput_off_rps": statistics.mean(thr["off"]),
            }
    return rows


def faults_markdown(rows: dict, args: argparse.Namespace) -> str:
    lines = [(f"Default load: Poisson {args.rate:g} req/s, prompt 64-256 bytes, max_tokens 16-48, temperature 0.8; "
             f"{args.pairs} interleaved off/on pairs of {args.seconds:g} s per row."), "",
             ("| change | p99 off (ms) | p99 on (ms) | ratio (pooled) | ratio per pair: median [min-max] "
             "| requests off/on | errors off/on |"),
             "|---|---|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['p99_off_ms']:.0f} | {r['p99_on_ms']:.0f} | {r['ratio_pooled']:.2f}x | "
                     f"{r['ratio_pairs_median']:.2f}x [{r['ratio_pairs_min']:.2f}-{r['ratio_pairs_max']:.2f}] | "
                     f"{r['requests_off']}/{r['requests_on']} | {r['errors_off']}/{r['errors_on']} |")
    return "\n".join(lines)


def closed_loop(url: str, concurrency: int, seconds: float, prompt: str, max_tokens: int) -> list[CompletionResult]:
    results: list[CompletionResult] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def worker(i: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            result = complete(url, prompt, max_tokens, temperature=0.8, seed=i * 1000 + n)
            n += 1
            with lock:
                results.append(result)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _metric_sum(url: str, name: str) -> float:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def bench_batch(args: argparse.Namespace) -> list[dict]:
    rows = []
    prompt = "the model token cache batch latency " * 4
    for max_batch in args.max_batch:
        with launched_server("--device", args.device, "--max-batch", str(max_batch)) as server:
            closed_loop(server.url, 2, 2, prompt, 8)  # warm-up
            for concurrency in args.concurrency:
                steps0 = _metric_sum(server.url, "workload_batch_size_count")
                seqs0 = _metric_sum(server.url, "workload_batch_size_sum")
                start = time.perf_counter()
                results = closed_loop(server.url, concurrency, args.seconds, prompt, args.tokens)
                elapsed = time.perf_counter() - start
                steps = _metric_sum(server.url, "workload_batch_size_count") - steps0
                ok = [r for r in results if r.ok]
                rows.append({
                    "max_batch": max_batch, "concurrency": concurrency, "requests": len(ok),
                    "errors": len(results) - len(ok),
                    "tokens_per_s": sum(len(r.token_ids) for r in ok) / elapsed,
                    "p50_ms": percentile([r.latency_s for r in ok], 50) * 1000,
                    "p99_ms": percentile([r.latency_s for r in ok], 99) * 1000,
                    "mean_batch": (_metric_sum(server.url, "workload_batch_size_sum") - seqs0) / max(steps, 1),
                })
                print(f"  {rows[-1]}", file=sys.stderr)
    return rows


def batch_markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [(f"Closed loop: each client sends the next request when the last one ends; prompt 145 bytes, "
             f"{args.tokens} output tokens, {args.seconds:g} s per cell."), "",
             "| max batch | concurrency | mean batch | tokens/s | p50 (ms) | p99 (ms) | requests | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['max_batch']} | {r['concurrency']} | {r['mean_batch']:.2f} | {r['tokens_per_s']:.0f} | "
                     f"{r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['requests']} | {r['errors']} |")
    return "\n".join(lines)


def bench_kvcache(args: argparse.Namespace) -> list[dict]:
    """Same requests with the cache on and off, interleaved; tokens checked identical."""
    rows = []
    with launched_server("--device", args.device) as server:
        closed_loop(server.url, 1, 2, "warm", 8)
        for prompt_bytes in args.prompt_bytes:
            prompt = ("kv cache " * 64)[:prompt_bytes]
            lat = {"on": [], "off": []}
            mismatches = 0
            for pair in range(args.pairs):
                tokens = {}
                for state in (("on", "off") if pair % 2 == 0 else ("off", "on")):
                    set_fault(server.url, "nocache", state == "off", server.token)
                    result = complete(server.url, prompt, args.tokens, temperature=0.8, seed=pair)
                    set_fault(server.url, "nocache", False, server.token)
                    if not result.ok:
                        raise RuntimeError(f"request failed with the cache {state}: {result.error}")
                    lat[state].append(result.latency_s)
                    tokens[state] = result.token_ids
                mismatches += tokens["on"] != tokens["off"]
            on, off = statistics.median(lat["on"]), statistics.median(lat["off"])
            rows.append({"prompt_bytes": prompt_bytes, "tokens": args.tokens, "median_on_ms": on * 1000,
                         "median_off_ms": off * 1000, "p99_on_ms": _p99(lat["on"]) * 1000,
                         "p99_off_ms": _p99(lat["off"]) * 1000, "latency_reduction": 1 - on / off,
                         "pairs": args.pairs, "token_mismatches": mismatches})
            print(f"  {rows[-1]}", file=sys.stderr)
    return rows


def kvcache_markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [f"One request at a time, {args.tokens} output tokens, {args.pairs} interleaved on/off pairs per row.", "",
             ("| prompt bytes | median cache on (ms) | median cache off (ms) | latency reduction with cache | "
             "p99 on/off (ms) | token mismatches |"), "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['prompt_bytes']} | {r['median_on_ms']:.0f} | {r['median_off_ms']:.0f} | "
                     f"{r['latency_reduction'] * 100:.0f}% | {r['p99_on_ms']:.0f}/{r['p99_off_ms']:.0f} | "
                     f"{r['token_mismatches']} |")
    return "\n".join(lines)


MODES = {"single process": (), "--engine-process": ("--engine-process",)}


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of `pid` and its children (the engine process), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    pids = [pid] + [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
                    for c in (task / "children").read_text().split()]
    total = 0.0
    for each in pids:
        try:
            fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue  # a child that ended between the listing and the read
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def bench_engine_process(args: argparse.Namespace) -> dict:
    """The same open-loop load on a single-process server and on an --engine-process one, phases interleaved
    (the order flips every pair), both servers up throughout so neither pays for the other's start."""
    phases: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with launched_server("--device", args.device) as single, \
            launched_server("--device", args.device, "--engine-process") as split:
        urls = {"single process": single.url, "--engine-process": split.url}
        server_pids = {"single process": single.proc.pid, "--engine-process": split.proc.pid}
        for url in urls.values():
            _phase(url, args.rate, 3, seed=999)  # warm-up
        for pair in range(args.pairs):
            order = list(MODES) if pair % 2 == 0 else list(reversed(MODES))
            for mode in order:
                # The same arrivals and requests for both sides of a pair.
                cpu = _cpu_seconds(server_pids[mode])
                lat, sent, errors, tput = _phase(urls[mode], args.rate, args.seconds, seed=pair)
                cpu_ms = (_cpu_seconds(server_pids[mode]) - cpu) * 1000 / max(1, len(lat))
                phases[mode].append({"p50": percentile(lat, 50), "p99": _p99(lat), "rps": tput, "sent": sent,
                                     "errors": errors, "cpu_ms": cpu_ms})
                print(f"  pair {pair} {mode}: {tput:.2f} req/s, p50 {phases[mode][-1]['p50'] * 1000:.0f} ms, "
                      f"p99 {phases[mode][-1]['p99'] * 1000:.0f} ms, {cpu_ms:.0f} CPU ms/request, {errors} errors",
                      file=sys.stderr)
    return {mode: {"rps_median": statistics.median(p["rps"] for p in rows),
                   "p50_ms_median": statistics.median(p["p50"] for p in rows) * 1000,
                   "p99_ms_median": statistics.median(p["p99"] for p in rows) * 1000,
                   "cpu_ms_per_request_median": statistics.median(p["cpu_ms"] for p in rows),
                   "p50_ms_each": [round(p["p50"] * 1000) for p in rows],
                   "requests": sum(p["sent"] for p in rows), "errors": sum(p["errors"] for p in rows)}
            for mode, rows in phases.items()}


def engine_process_markdown(rows: dict, args: argparse.Namespace) -> str:
    lines = [(f"Open loop: Poisson {args.rate:g} req/s, prompt 64-256 bytes, max_tokens 16-48, temperature 0.8; "
              f"{args.pairs} interleaved pairs of {args.seconds:g} s phases; medians over the phases."), "",
             ("| server | throughput (req/s) | p50 (ms) | p99 (ms) | CPU per request, all its processes (ms) "
              "| p50 per phase (ms) | requests | errors |"),
             "|---|---|---|---|---|---|---|---|"]
    for mode, r in rows.items():
        lines.append(f"| {mode} | {r['rps_median']:.2f} | {r['p50_ms_median']:.0f} | {r['p99_ms_median']:.0f} | "
                     f"{r['cpu_ms_per_request_median']:.0f} | "
                     f"{', '.join(map(str, r['p50_ms_each']))} | {r['requests']} | {r['errors']} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m workload bench")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--json", action="store_true", help="print raw rows as JSON instead of Markdown")
    sub = parser.add_subparsers(dest="which", required=True)
    faults = sub.add_parser("faults", help="p99 with each fault on vs off at the default load")
    faults.add_argument("--rate", type=float, default=DEFAULT_RATE)
    faults.add_argument("--seconds", type=float, default=8.0, help="per phase")
    faults.add_argument("--pairs", type=int, default=2)
    faults.add_argument("--faults", nargs="+", default=[*FAULT_NAMES, "load+50%"],
                        choices=[*FAULT_NAMES, "load+50%"])
    batch = sub.add_parser("batch", help="tokens/s and p99 against max batch size and concurrency")
    batch.add_argument("--max-batch", type=int, nargs="+", default=[1, 4, 8])
    batch.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    batch.add_argument("--seconds", type=float, default=6.0)
    batch.add_argument("--tokens", type=int, default=32)
    kv = sub.add_parser("kvcache", help="latency with the KV cache on vs off")
    kv.add_argument("--prompt-bytes", type=int, nargs="+", default=[32, 128, 320])
    kv.add_argument("--tokens", type=int, default=64)
    kv.add_argument("--pairs", type=int, default=6)
    split = sub.add_parser("engine-process", help="single process vs --engine-process at the same load")
    split.add_argument("--rate", type=float, default=4.0)
    split.add_argument("--seconds", type=float, default=15.0, help="per phase")
    split.add_argument("--pairs", type=int, default=4)
    args = parser.parse_args(argv)
    run = {"faults": (bench_faults, faults_markdown), "batch": (bench_batch, batch_markdown),
           "kvcache": (bench_kvcache, kvcache_markdown),
           "engine-process": (bench_engine_process, engine_process_markdown)}[args.which]
    rows = run[0](args)
    print(json.dumps(rows, indent=2) if args.json else run[1](rows, args))
    return 0
