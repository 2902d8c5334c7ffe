"""The soak of tests/benchmarks/test_steady_live.py (`soak.run`, default config, bundled server at 4 req/s) with the
agent's memory recorded by mapping at every reading: /proc/PID/status and the whole /proc/PID/smaps, gzipped.

    flock /work/wt/live.lock .venv/bin/python -m benchmarks.rss_soak --minutes 5 --out /tmp/rss-soak

`--pageout-at S` asks the kernel, from outside (process_madvise), to page out every clean file-backed page of the
agent's mappings S seconds in, and records smaps right after: what that frees, and (from the later readings) how
much of it the agent faults back. It changes the agent from then on: take the steady figures before S."""

from __future__ import annotations

import argparse
import ctypes
import gzip
import io
import json
import os
import sys
import time
from pathlib import Path

from benchmarks import smaps, soak

SYS_PROCESS_MADVISE = 440  # x86_64
SYS_PIDFD_OPEN = 434
MADV_PAGEOUT = 21


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def pageout_files(pid: int) -> int:
    """process_madvise(MADV_PAGEOUT) over every file-backed mapping of pid; bytes the kernel accepted (it skips pages
    other processes map too, and dirty ones)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pidfd = os.pidfd_open(pid)
    done = 0
    try:
        maps = smaps.parse(Path(f"/proc/{pid}/smaps").read_text())
        for m in maps:
            if not m.path.startswith("/") or m.rss == 0:
                continue
            iov = _Iovec(m.start, m.size)
            n = libc.syscall(SYS_PROCESS_MADVISE, pidfd, ctypes.byref(iov), ctypes.c_size_t(1), MADV_PAGEOUT, 0)
            if n > 0:
                done += n
    finally:
        os.close(pidfd)
    return done


def status(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem", "Threads", "VmSize"):
            out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--pageout-at", type=float, default=None)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    log: list[dict] = []
    done: dict[str, float] = {}

    def observe(r: soak.Reading, pid: int) -> None:
        row = {"t": round(r.t, 1), "armed": r.armed, "utc": time.strftime("%H:%M:%S", time.gmtime()), **status(pid)}
        try:
            row["threads_named"] = sorted(Path(f"/proc/{pid}/task/{t}/comm").read_text().strip()
                                          for t in os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
        text = Path(f"/proc/{pid}/smaps").read_text()
        with gzip.open(args.out / f"smaps-{int(r.t):04d}.gz", "wt") as f:
            f.write(text)
        if args.pageout_at is not None and "pageout" not in done and r.t >= args.pageout_at:
            t0 = time.monotonic()
            done["pageout"] = pageout_files(pid)
            row["pageout_bytes_accepted"] = done["pageout"]
            row["pageout_seconds"] = round(time.monotonic() - t0, 3)
            row["after_pageout"] = status(pid)
            with gzip.open(args.out / f"smaps-{int(r.t):04d}-after-pageout.gz", "wt") as f:
                f.write(Path(f"/proc/{pid}/smaps").read_text())
        log.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "threads_named"}), file=sys.stderr, flush=True)

    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    readings, cut = soak.run(minutes=args.minutes, every=10.0, rate=4.0, progress=io.StringIO(), slice_seconds=60.0,
                             observe=observe)
    end = time.strftime("%H:%M:%S", time.gmtime())
    before_fit = max((r.peak_rss_bytes for r in readings if not r.armed), default=None)
    armed = [r.rss_bytes for r in readings if r.armed and (args.pageout_at is None or r.t < args.pageout_at)]
    summary = {"utc": f"{start}-{end}", "readings": len(readings), "peak_before_armed_mib": before_fit and before_fit / 2**20,
               "peak_mib": max(r.peak_rss_bytes for r in readings) / 2**20,
               "rss_armed_min_max_mib": [min(armed) / 2**20, max(armed) / 2**20] if armed else None,
               "slices": [s.__dict__ for s in cut]}
    (args.out / "log.json").write_text(json.dumps({"summary": summary, "log": log}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
