"""Where the agent process's own CPU goes past warm-up: py-spy on the default agent, bundled server at 4 req/s.

    sudo .venv/bin/python -m benchmarks.profile_agent [--seconds 120] [--rate 4] [--out DIR]

Starts the bundled server (one process) under the open-loop load, a default agent watching it from a fresh store,
waits until the agent's detector is armed (its warm-up done: `infersight_detector_armed`), then records the agent
process with py-spy (`--function --threads`, 49 Hz, only the agent's own pid: its py-spy recorders are children, not
sampled) for `--seconds`, and prints the top functions by share of the agent's on-CPU samples: self (leaf) and total
(anywhere in the stack), plus per thread. The raw folded stacks are written to DIR/agent.folded. The agent's own CPU
(utime+stime from /proc) over the same seconds is printed beside it, so shares turn into % of a core.
"""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import AgentProcess, agent_config, free_port
from benchmarks.openloop import OpenLoop
from benchmarks.overhead import _wait_healthy
from benchmarks.procstat import usage


def _pyspy() -> str:
    """The py-spy installed beside this interpreter (the venv's), else the one on PATH (as the agent finds it)."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy") or "py-spy"


def _frame(f: str) -> str:
    return f.split(" (")[0].strip()


def summarize(folded: Path, top: int = 25) -> dict:
    """Self and total shares of the on-CPU samples, by function, and samples by thread."""
    self_n: collections.Counter[str] = collections.Counter()
    total_n: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    n = 0
    for line in folded.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = stack.split(";")
        n += c
        threads[frames[0].split(": ", 1)[-1]] += c
        seen = {_frame(f) for f in frames[1:]}
        for f in seen:
            total_n[f] += c
        if len(frames) > 1:
            self_n[_frame(frames[-1])] += c
    share = lambda k: round(100.0 * k / n, 1) if n else 0.0  # noqa: E731
    return {"samples": n,
            "self": [(f, share(k)) for f, k in self_n.most_common(top)],
            "total": [(f, share(k)) for f, k in total_n.most_common(top)],
            "threads": [(t, share(k)) for t, k in threads.most_common(10)]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--hz", type=int, default=49)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    from workload.launch import launched_server

    out = args.out or Path(tempfile.mkdtemp(prefix="infersight-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="infersight-profile-agent-"))
    with launched_server() as server:
        _wait_healthy(server.url)
        load = OpenLoop(server.url, args.rate)
        load.start()
        listen = f"127.0.0.1:{free_port()}"
        agent = AgentProcess(work, agent_config("all", work / "store", listen, server.proc.pid, server.url), listen)
        agent.start()
        try:
            agent.wait_ready()
            armed_by = time.monotonic() + 600
            while agent.scrape().get("infersight_detector_armed", 0) < 1:
                if time.monotonic() > armed_by:
                    print("the agent's detector was not armed within 600 s", file=sys.stderr)
                    return 1
                time.sleep(2.0)
            print(f"armed at {time.strftime('%H:%M:%S', time.gmtime())} UTC; recording the agent (pid {agent.pid}) "
                  f"for {args.seconds:.0f} s", file=sys.stderr)
            u0, t0 = usage(agent.pid), time.monotonic()
            folded = out / "agent.folded"
            subprocess.run([_pyspy(), "record", "--pid", str(agent.pid), "--rate", str(args.hz), "--duration",
                            str(int(args.seconds)), "--format", "raw", "--function", "--threads", "--nonblocking",
                            "--output", str(folded)], check=True, stdout=subprocess.DEVNULL)
            u1, t1 = usage(agent.pid), time.monotonic()
        finally:
            agent.stop()
            load.stop()
    result = {"utc_end": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "seconds": round(t1 - t0, 1),
              "agent_process_cpu_percent": round(100.0 * (u1.own_cpu - u0.own_cpu) / (t1 - t0), 3),
              "agent_with_children_cpu_percent": round(100.0 * (u1.total_cpu - u0.total_cpu) / (t1 - t0), 3),
              **summarize(folded)}
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
