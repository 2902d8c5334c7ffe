"""What naming a disk's writers from the block layer would cost and how well it names them (issue 34; not collected by
pytest; root, BCC).

A BPF program on `block:block_bio_queue` (it runs in the task that submits the bio) sums the bytes of writes per
process. While it is attached, the neighbour of `tests/scenarios/diskhog.py` writes and fsyncs on the disk of
/var/tmp; the kernel's own BPF statistics (`kernel.bpf_stats_enabled`, on for the run and restored after) give the
program's run count and run time, so the cost per event is the kernel's figure, not a wall-clock difference. The
share of the written bytes charged to the writer's own process says whether the tracepoint names it, or the
kernel's flusher threads that write dirty pages back for it.

    .venv/bin/python -m tests.probes.bench_block_writers [--seconds 10] [--sync-mib 32 512] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

DISKHOG = Path(__file__).resolve().parents[1] / "scenarios" / "diskhog.py"

PROGRAM = r"""
struct writer_t { u64 bytes; u64 bios; char comm[16]; };
BPF_HASH(writers, u32, struct writer_t, 4096);

TRACEPOINT_PROBE(block, block_bio_queue) {
    // rwbs: "W", "WS", "FWS"...: a write wherever W appears in the first three letters
    if (args->rwbs[0] != 'W' && args->rwbs[1] != 'W' && args->rwbs[2] != 'W')
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct writer_t zero = {};
    struct writer_t *w = writers.lookup_or_try_init(&tgid, &zero);
    if (!w)
        return 0;
    if (w->bios == 0)
        bpf_get_current_comm(&w->comm, sizeof(w->comm));
    __sync_fetch_and_add(&w->bytes, (u64)args->nr_sector << 9);
    __sync_fetch_and_add(&w->bios, 1);
    return 0;
}
"""


def prog_stats(name: str) -> tuple[int, int]:
    """(run_cnt, run_time_ns) summed over loaded programs named `name` (bpftool's JSON)."""
    out = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True, check=True).stdout
    progs = [p for p in json.loads(out) if p.get("name", "").startswith(name[:15])]
    return sum(p.get("run_cnt", 0) for p in progs), sum(p.get("run_time_ns", 0) for p in progs)


def condition(seconds: float, sync_mib: int) -> dict:
    from bcc import BPF

    bpf = BPF(text=PROGRAM)
    try:
        before = prog_stats("tracepoint__block__block_bio_queue")
        started = time.monotonic()
        hog = subprocess.Popen([sys.executable, str(DISKHOG), str(seconds), "/var/tmp", "128", "4", str(sync_mib)],
                               stdout=subprocess.PIPE, text=True)
        said = hog.communicate()[0].strip()
        time.sleep(1.0)  # writeback of the last chunk
        elapsed = time.monotonic() - started
        after = prog_stats("tracepoint__block__block_bio_queue")
        rows = sorted(((k.value, v.comm.decode(errors="replace"), v.bytes, v.bios) for k, v in bpf["writers"].items()),
                      key=lambda r: -r[2])
    finally:
        bpf.cleanup()
    events, run_ns = after[0] - before[0], after[1] - before[1]
    total = sum(r[2] for r in rows) or 1
    mine = sum(r[2] for r in rows if r[0] == hog.pid)
    return {"sync_mib": sync_mib, "seconds": round(elapsed, 1), "writer": said, "events": events,
            "events_per_second": round(events / elapsed), "ns_per_event": round(run_ns / events) if events else None,
            "core_percent": round(100 * run_ns / 1e9 / elapsed, 4),
            "writer_share": round(mine / total, 3),
            "top": [{"tgid": t, "comm": c, "mib": round(b / (1 << 20), 1), "bios": n} for t, c, b, n in rows[:5]]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--sync-mib", type=int, nargs="+", default=[32, 512])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    stats_path = Path("/proc/sys/kernel/bpf_stats_enabled")
    was = stats_path.read_text().strip()
    stats_path.write_text("1")
    try:
        results = [condition(args.seconds, s) for s in args.sync_mib]
    finally:
        stats_path.write_text(was)
    for r in results:
        print(json.dumps(r) if args.json else
              f"fsync every {r['sync_mib']} MiB: {r['events']} bios in {r['seconds']} s ({r['events_per_second']}/s), "
              f"{r['ns_per_event']} ns each, {r['core_percent']} % of a core; the writer's own share of the bytes "
              f"{r['writer_share']:.0%}; top {r['top'][:3]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
