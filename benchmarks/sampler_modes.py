"""py-spy's steady-rate alternatives side by side on the bundled server: CPU per mode and what each keeps.

`sudo .venv/bin/python -m benchmarks.sampler_modes [--seconds 45] [--rounds 2]`. Every mode records back-to-back
segments of its own length, as the agent's sampler does, for `--seconds`, its rounds interleaved with the others'
(a drift in the host's load spreads over all). CPU is py-spy's own, from the kernel (`RUSAGE_CHILDREN` of this
process, whose only children during a mode are that mode's recorders); samples are what py-spy wrote (every
thread's stacks, as folded counts).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.openloop import OpenLoop


@dataclass(frozen=True)
class Recorder:
    rate: int
    segment: int
    flags: tuple[str, ...]


@dataclass(frozen=True)
class Mode:
    name: str
    recorders: tuple[Recorder, ...]
    keeps: str


ALL = ("--idle", "--threads", "--function", "--nonblocking")
GIL = ("--gil", "--threads", "--function", "--nonblocking")
MODES = (
    Mode("every thread at 3 Hz, 5 s segments", (Recorder(3, 5, ALL),), "everything (the default before 15 s segments)"),
    Mode("--gil at 3 Hz, 5 s segments", (Recorder(3, 5, GIL),),
         "the GIL holder only: no idle stacks (the lock signal), no GIL-free torch threads"),
    Mode("every thread at 1 Hz, 5 s segments", (Recorder(1, 5, ALL),), "everything, a third of the samples"),
    Mode("every thread at 3 Hz, 15 s segments", (Recorder(3, 15, ALL),),
         "everything, a third of the attaches; a window's stacks arrive up to 10 s later (the steady default)"),
    Mode("every thread at 2 Hz, 15 s segments", (Recorder(2, 15, ALL),),
         "everything, two thirds of the 15 s default's samples"),
    Mode("every thread at 1 Hz, 15 s segments", (Recorder(1, 15, ALL),),
         "everything, a third of the 15 s default's samples"),
    Mode("--gil at 3 Hz (5 s) + every thread at 1 Hz (15 s)", (Recorder(3, 5, GIL), Recorder(1, 15, ALL)),
         "the GIL holder at 3 Hz, idle stacks at a third of the rate"),
)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _samples(path: Path) -> int:
    total = 0
    try:
        for line in path.read_text(errors="replace").splitlines():
            head, _, count = line.rpartition(" ")
            if head and count.isdigit():
                total += int(count)
    except OSError:
        return 0
    return total


def _record(pyspy: str, pid: int, rec: Recorder, until: float, tmp: Path, tally: list[int]) -> None:
    n = 0
    while time.monotonic() < until:
        n += 1
        out = tmp / f"{threading.get_ident()}-{n}.txt"
        subprocess.run([pyspy, "record", "--pid", str(pid), "--rate", str(rec.rate), "--duration", str(rec.segment),
                        "--format", "raw", "--output", str(out), *rec.flags], capture_output=True, check=False)
        tally[0] += _samples(out)
        tally[1] += 1
        out.unlink(missing_ok=True)


def measure(mode: Mode, pyspy: str, pid: int, seconds: float, tmp: Path) -> dict[str, float]:
    until = time.monotonic() + seconds
    tallies = [[0, 0] for _ in mode.recorders]
    cpu0, t0 = _children_cpu(), time.monotonic()
    threads = [threading.Thread(target=_record, args=(pyspy, pid, rec, until, tmp, tally))
               for rec, tally in zip(mode.recorders, tallies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"cpu_percent": 100 * (_children_cpu() - cpu0) / wall, "samples_per_min": 60 * sum(t[0] for t in tallies) / wall,
            "attaches_per_min": 60 * sum(t[1] for t in tallies) / wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=float, default=45.0, help="seconds per mode per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--rate", type=float, default=4.0, help="requests per second to the server")
    ap.add_argument("--only", nargs="+", metavar="TEXT",
                    help="measure only the modes whose name contains one of these (e.g. '15 s segments')")
    args = ap.parse_args()
    modes = tuple(m for m in MODES if not args.only or any(t in m.name for t in args.only))
    if not modes:
        ap.error(f"no mode's name contains any of {args.only}")
    from workload.launch import launched_server

    pyspy = str(Path(sys.executable).parent / "py-spy")
    results: dict[str, list[dict[str, float]]] = {m.name: [] for m in modes}
    with launched_server() as srv, tempfile.TemporaryDirectory() as tmp:
        load = OpenLoop(srv.url, args.rate)
        load.start()
        try:
            time.sleep(10)
            for r in range(args.rounds):
                for mode in (modes if r % 2 == 0 else tuple(reversed(modes))):
                    got = measure(mode, pyspy, srv.proc.pid, args.seconds, Path(tmp))
                    results[mode.name].append(got)
                    print(f"round {r + 1} {mode.name}: {got}", file=sys.stderr, flush=True)
        finally:
            load.stop()
    print("| mode | py-spy CPU % of one core (per round) | samples per minute | attaches per minute | keeps |")
    print("|---|---|---|---|---|")
    for mode in modes:
        rows = results[mode.name]
        cpu = " / ".join(f"{x['cpu_percent']:.2f}" for x in rows)
        smp = sum(x["samples_per_min"] for x in rows) / len(rows)
        att = sum(x["attaches_per_min"] for x in rows) / len(rows)
        print(f"| {mode.name} | {cpu} | {smp:.0f} | {att:.1f} | {mode.keeps} |")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
