"""The identity read's cost on the bundled torch server (docs/changes.md): CPU seconds of the agent's reads per window.

    .venv/bin/python tests/agent/bench_identity.py [--windows 600] [--refresh 12]

Starts `python -m workload serve`, reads its identity once per simulated window the way the agent does (one read per
window, distributions and model files again every `--refresh` windows) and prints the CPU time per window, the first
read's cost and the share of a core at 5 s windows. CPU time (process_time), so a busy host does not inflate it."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request

from agent.identity import IdentityReader
from agent.targets import Target, read_proc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=600)
    parser.add_argument("--refresh", type=int, default=12)
    args = parser.parse_args()
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "workload", "serve", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        info = read_proc(server.pid)
        target = Target(name="workload", pid=server.pid, start_time=info.start_time, cmdline=info.cmdline, spec=None)
        reader = IdentityReader(refresh_windows=args.refresh)
        began = time.process_time()
        identity = reader.read(target)
        first = time.process_time() - began
        began = time.process_time()
        for _ in range(args.windows):
            reader.read(target)
        per_window = (time.process_time() - began) / args.windows
        print(json.dumps({"first_read_ms": round(first * 1e3, 3), "per_window_ms": round(per_window * 1e3, 4),
                          "core_share_at_5s_percent": round(per_window / 5.0 * 100, 5),
                          "refresh_windows": args.refresh, "dists": len(identity.dists or ()),
                          "models": len(identity.models or ()), "python": identity.python}))
    finally:
        server.terminate()
        server.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
