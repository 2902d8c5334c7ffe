"""Measure one re-read of a family target (what discovery costs per window) with many processes on the host.

Run as root: `.venv/bin/python -m tests.agent.bench_families --host-processes 300 --members 4 --scans 50`.
Fills the host up to `--host-processes` with idle `sleep`s, starts a family of `--members` processes (a
listening parent and its children) in a cgroup v2 made for it, named like a Docker container and like a
systemd unit, and times `discover()` for each selector: the steady cost (what the daemon pays every window,
with one Families kept between discoveries) and the first lookup (nothing remembered: a unit's or container's
cgroup found by reading every process's /proc/PID/cgroup, a port's holder by listing every process's fds).
Prints one JSON object: median wall and CPU milliseconds per discovery.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from agent.config import TargetSpec
from agent.families import Families, cgroup_v2_mount
from agent.targets import discover

SERVER = r"""
import os, socket, sys, time
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen()
for _ in range(int(sys.argv[1]) - 1):
    if os.fork() == 0:
        time.sleep(3600)
        os._exit(0)
print(sock.getsockname()[1], flush=True)
time.sleep(3600)
"""


def timed(spec: TargetSpec, scans: int, *, keep: bool) -> dict[str, float]:
    families = Families()
    walls, cpus = [], []
    expected = None
    for _ in range(scans):
        fam = families if keep else Families()
        w0, c0 = time.perf_counter(), time.process_time()
        found = discover([spec], allowed_uids=frozenset({0}), families=fam)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
        members = len(found[0].member_keys) if found else 0
        if expected is None:
            expected = members
        assert members == expected and members > 0, f"{spec.selector}: {members} members"
    return {"median_wall_ms": round(statistics.median(walls) * 1e3, 2),
            "median_cpu_ms": round(statistics.median(cpus) * 1e3, 2), "members": expected or 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host-processes", type=int, default=300)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--scans", type=int, default=50)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench_families: run as root (it makes a cgroup)")
    mount = cgroup_v2_mount()
    if mount is None:
        raise SystemExit("bench_families: no cgroup v2 mount")
    ident = uuid.uuid4().hex + uuid.uuid4().hex
    root = mount / f"infersight-bench-{ident[:8]}"
    unit = f"infersight-bench-{ident[:8]}.service"
    cgroup = root / f"docker-{ident}.scope" / unit
    cgroup.mkdir(parents=True)
    fillers: list[subprocess.Popen] = []
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(args.members)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True,
                              preexec_fn=lambda: Path(cgroup / "cgroup.procs").write_text(str(os.getpid())))
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        present = len([n for n in os.listdir("/proc") if n.isdigit()])
        fillers = [subprocess.Popen(["sleep", "3600"], start_new_session=True)
                   for _ in range(max(0, args.host_processes - present))]
        time.sleep(1)
        processes = len([n for n in os.listdir("/proc") if n.isdigit()])
        specs = {
            "pid (today, one process)": TargetSpec(name="t", pid=server.pid),
            "pid + children": TargetSpec(name="t", pid=server.pid, children=True),
            "cgroup": TargetSpec(name="t", cgroup=str(cgroup)),
            "systemd_unit": TargetSpec(name="t", systemd_unit=unit),
            "container": TargetSpec(name="t", container=ident[:12]),
            "port": TargetSpec(name="t", port=port),
        }
        out: dict[str, object] = {"host_processes": processes, "family_members": args.members}
        for label, spec in specs.items():
            out[label] = {"steady": timed(spec, args.scans, keep=True)}
            if spec.selector in ("systemd_unit", "container", "port"):
                out[label]["first_lookup"] = timed(spec, max(5, args.scans // 5), keep=False)  # type: ignore[index]
        print(json.dumps(out, indent=1))
    finally:
        for p in [server, *fillers]:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        deadline = time.monotonic() + 30
        for folder in (cgroup, cgroup.parent, root):
            while True:
                try:
                    folder.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)


if __name__ == "__main__":
    main()
