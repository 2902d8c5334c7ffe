"""Measure the agent's own cost during `make demo`: CPU (% of one core, with and without py-spy) and RSS.

    sudo .venv/bin/python -m tests.agent.bench_demo --seconds 180

Runs the demo as a child process, scrapes the agent's /metrics every few seconds, and prints
the agent's CPU share over the steady part of the run (after the probes compiled), its peak
RSS, and the collection tick's duration.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if not s.labels}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--warmup", type=float, default=30, help="seconds ignored at the start (BPF compiles)")
    parser.add_argument("--listen", default="127.0.0.1:9474")
    parser.add_argument("--port", type=int, default=8017)
    parser.add_argument("--var", default="/tmp/infersight-bench-demo")
    args = parser.parse_args(argv)
    url = f"http://{args.listen}/metrics"
    demo = subprocess.Popen([sys.executable, "-m", "agent.demo", "--listen", args.listen, "--port", str(args.port),
                             "--var", args.var, "--duration", str(args.seconds + args.warmup + 30)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    samples = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                scrape(url)
                break
            except OSError:
                time.sleep(1)
        time.sleep(args.warmup)
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            m = scrape(url)
            samples.append((time.monotonic(), m))
            time.sleep(5)
    finally:
        demo.terminate()
        demo.wait(60)
    (t0, first), (t1, last) = samples[0], samples[-1]
    wall = t1 - t0
    own = (last["infersight_agent_cpu_seconds_total"] - first["infersight_agent_cpu_seconds_total"]) / wall
    kids = (last["infersight_agent_children_cpu_seconds_total"]
            - first["infersight_agent_children_cpu_seconds_total"]) / wall
    rss = [m["infersight_agent_resident_memory_bytes"] / 2**20 for _, m in samples]
    ticks = [m["infersight_agent_window_duration_seconds"] for _, m in samples]
    result = {
        "seconds_measured": round(wall, 1),
        "agent_cpu_percent_of_one_core": round(100 * own, 1),
        "pyspy_children_cpu_percent_of_one_core": round(100 * kids, 1),
        "total_cpu_percent_of_one_core": round(100 * (own + kids), 1),
        "rss_mib_median": round(statistics.median(rss), 1),
        "peak_rss_mib": round(last["infersight_agent_peak_resident_memory_bytes"] / 2**20, 1),
        "tick_seconds_median": round(statistics.median(ticks), 3),
        "tick_seconds_max": round(max(ticks), 3),
        "windows": int(last["infersight_agent_windows_total"]),
        "late_ticks": int(last["infersight_agent_late_ticks_total"]),
        "dropped_windows": int(last["infersight_agent_dropped_windows_total"]),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
