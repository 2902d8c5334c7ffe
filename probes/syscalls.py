"""Syscall counts by name per target tgid, with optional sys_enter->sys_exit latency histograms.

Traces: raw tracepoint ``sys_enter`` (syscall id in ``ctx->args[1]``) and, only when
``SyscallsConfig.latency`` is set, raw tracepoint ``sys_exit``.

How: the program first looks the current tgid up with ``target_slot()`` (tgid -> slot in a
direct-mapped array written by user space, probes/target_filter.py, so targets change
without reloading) and returns at once for everyone else.
Counts go to a per-CPU array indexed ``slot * SYSCALL_SLOTS + id``: no hash update, no
shared cache line, exact. Latency mode adds a per-thread ``start`` map and a log2
histogram per (slot, id) in a per-CPU hash; user space reports the top N syscalls of each
window by count.

Overhead (getppid loop on this 2-vCPU VM, docs/BENCHMARKS.md, 2026-12-01 run): count-only
112 ns per syscall, target or not, 0.53x what ``syscount-bpfcc`` adds (211 ns); 91 ns of
that is the floor any program on ``sys_enter`` costs (the syscall slow path and the
dispatch), 13 ns ``bpf_get_current_pid_tgid()``, the rest the array filter and the count.
With a hash for the targets it was 161 ns. Latency mode: 353 ns for targets, 197 ns for
others (both hooks fire for every task).

Caveats: ids outside [0, SYSCALL_SLOTS - 1) (x32 ABI, -1 from seccomp/ptrace skips) are
counted together as ``syscall_other``. Maps are never zeroed (zeroing races with the
increments and loses counts); ``read()`` returns the difference to the previous read, which
is the same as snapshot-then-clear but exact.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.window import Log2Histogram, SyscallReading
from probes import c_helpers, target_filter
from probes.map_read import percpu_array_sums
from probes.slotted import SlottedProbe
from probes.syscall_names import SYSCALL_NAMES

SYSCALL_SLOTS = 512
OTHER_ID = SYSCALL_SLOTS - 1
TRACEPOINTS = ("raw_syscalls:sys_enter", "raw_syscalls:sys_exit", "task:task_newtask")

BPF_TEXT = r"""
BPF_PERCPU_ARRAY(counts, u64, MAX_TARGETS * SYSCALL_SLOTS);

#ifdef LATENCY
struct start_t {
    u64 ts;
    u32 tgid;
    u32 idx;
};
struct lat_key_t {
    u32 idx;
    u32 bucket;
};
// One entry per target thread, rewritten in place (ts = 0: no syscall open): an update plus a
// delete per syscall cost ~2x more. read() prunes the entries of threads that died.
BPF_HASH(start, u32, struct start_t, START_ENTRIES);
BPF_PERCPU_HASH(latency, struct lat_key_t, u64, LATENCY_ENTRIES);
#endif

RAW_TRACEPOINT_PROBE(sys_enter)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tgid = pid_tgid >> 32;
    u32 *slot = target_slot(tgid);
    if (!slot)
        return 0;
    long id = ctx->args[1];
    u32 nr = (id >= 0 && id < OTHER_ID) ? (u32)id : OTHER_ID;
    u32 idx = *slot * SYSCALL_SLOTS + nr;
    u64 *count = counts.lookup(&idx);
    if (count)
        (*count)++;
#ifdef LATENCY
    u32 tid = pid_tgid;
    struct start_t *s = start.lookup(&tid);
    if (s) {
        s->ts = bpf_ktime_get_ns();
        s->tgid = tgid;
        s->idx = idx;
    } else {
        struct start_t fresh = {.ts = bpf_ktime_get_ns(), .tgid = tgid, .idx = idx};
        if (start.update(&tid, &fresh))
            count_lost();
    }
#endif
    return 0;
}

#ifdef LATENCY
RAW_TRACEPOINT_PROBE(sys_exit)
{
    u64 pid_tgid = bpf_get_current_pid_tgid();
    u32 tid = pid_tgid;
    // Only targets' threads have a start entry: this lookup is the target filter.
    struct start_t *s = start.lookup(&tid);
    if (!s || !s->ts)
        return 0;
    u64 delta = bpf_ktime_get_ns() - s->ts;
    s->ts = 0;
    if (s->tgid != (u32)(pid_tgid >> 32))
        return 0;  // a reused tid: the entry belonged to a thread that died in a syscall
    struct lat_key_t key = {.idx = s->idx, .bucket = log2_slot(delta)};
    u64 *n = latency.lookup(&key);
    if (n) {
        (*n)++;
    } else {
        u64 one = 1;
        if (latency.update(&key, &one))
            count_lost();
    }
    return 0;
}
#endif
"""


@dataclass(frozen=True)
class SyscallsConfig:
    max_targets: int = 64  # processes: each member of a family target takes a slot
    latency: bool = False
    top_n: int = 10
    start_entries: int = 16384
    latency_entries: int = 16384

    def __post_init__(self) -> None:
        if not 1 <= self.max_targets <= 1024:
            raise ValueError(f"max_targets must be within [1, 1024], got {self.max_targets!r}")
        if self.top_n < 1:
            raise ValueError(f"top_n must be at least 1, got {self.top_n!r}")
        for name in ("start_entries", "latency_entries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")


def render(config: SyscallsConfig) -> str:
    """The C text for `config`: #defines first, the program's #ifdefs pick the features."""
    defines = [
        f"#define MAX_TARGETS {config.max_targets}",
        f"#define SYSCALL_SLOTS {SYSCALL_SLOTS}",
        f"#define OTHER_ID {OTHER_ID}",
        f"#define START_ENTRIES {config.start_entries}",
        f"#define LATENCY_ENTRIES {config.latency_entries}",
    ]
    if config.latency:
        defines.append("#define LATENCY 1")
    return ("\n".join(defines) + "\n" + target_filter.c_text(config.max_targets) + c_helpers.lost()
            + c_helpers.log2_slot() + BPF_TEXT)


# Newer than the generated 6.1 table. 335 is the syscall a uretprobe's return trampoline makes (Linux
# 6.11+): in a target it is caused by infersight's own GC probe (uretprobe on gc_collect_main).
NEWER_SYSCALL_NAMES: dict[int, str] = {335: "uretprobe"}

# Syscall numbers differ per architecture (aarch64's read is 63, x86-64's 0): a table is only ever applied to its
# own machine. Elsewhere syscalls are shown by number, and the probe's health says why.
SYSCALL_TABLES: dict[str, dict[int, str]] = {"x86_64": {**SYSCALL_NAMES, **NEWER_SYSCALL_NAMES}}


def syscall_name(nr: int, machine: str = platform.machine()) -> str:
    if nr == OTHER_ID:
        return "syscall_other"
    table = SYSCALL_TABLES.get(machine, {})
    return table.get(nr) or f"syscall_{nr}"


def _percpu_sum(values: Any) -> int:
    return int(sum(values))


class SyscallsProbe(SlottedProbe):
    """Counts (and optionally times) the syscalls of target processes."""

    name = "syscalls"
    tracepoints = TRACEPOINTS

    def __init__(self, config: SyscallsConfig | None = None, proc_root: Path = Path("/proc"),
                 machine: str = platform.machine()) -> None:
        super().__init__(config or SyscallsConfig(), proc_root)
        # slot -> its SYSCALL_SLOTS counters as last read (the baseline of the next reading)
        self._counts_seen: dict[int, list[int]] = {}
        self._latency_seen: dict[tuple[int, int], int] = {}
        self.machine = machine
        self._health.detail["syscall_names"] = (
            machine if machine in SYSCALL_TABLES else
            f"no syscall table shipped for {machine}: syscalls are shown by number (syscall_<nr>)")

    def _render(self) -> str:
        return render(self.config)

    def _take_baseline(self, added: list[tuple[int, int]]) -> None:
        counts = self._read_counts(slot for _, slot in added)
        latency = self._read_latency() if self.config.latency else {}
        for _, slot in added:
            # Baseline = whatever the slot's previous owner left: the new owner starts at zero.
            self._counts_seen[slot] = counts[slot]
            for key, value in latency.items():
                if key[0] // SYSCALL_SLOTS == slot:
                    self._latency_seen[key] = value

    def _read_slots(self) -> dict[int, SyscallReading]:
        if self.config.latency:
            self._prune_start()
        counts = self._read_counts(slot for _, slot in self._slots.items())
        latency = self._read_latency() if self.config.latency else {}
        readings = {tgid: self._reading(slot, counts[slot], latency) for tgid, slot in self._slots.items()}
        self._counts_seen.update(counts)
        self._latency_seen.update(latency)
        return readings

    def _prune_start(self) -> None:
        start = self._bpf[b"start"]
        for key, _ in list(start.items_lookup_batch()):
            tid = int(key)
            if not (self._proc_root / str(tid)).exists():
                try:
                    del start[start.Key(tid)]
                except KeyError:
                    pass  # gone already: nothing to prune

    def _read_counts(self, slots: Iterable[int]) -> dict[int, list[int]]:
        """The counters of these slots only: the array holds max_targets x SYSCALL_SLOTS of them (32,768 by
        default), and a read of all costs ~11 ms of CPU per window where one slot's costs ~0.2 ms
        (docs/BENCHMARKS.md "The syscalls probe reads the slots in use only")."""
        table = self._bpf[b"counts"]
        return {slot: percpu_array_sums(table, slot * SYSCALL_SLOTS, (slot + 1) * SYSCALL_SLOTS) for slot in slots}

    def _read_latency(self) -> dict[tuple[int, int], int]:
        return {(k.idx, k.bucket): _percpu_sum(v) for k, v in self._bpf[b"latency"].items_lookup_batch()}

    def _reading(self, slot: int, counts: list[int], latency: dict[tuple[int, int], int]) -> SyscallReading:
        seen = self._counts_seen[slot]
        by_name: dict[str, int] = {}
        for nr in range(SYSCALL_SLOTS):
            delta = counts[nr] - seen[nr]
            if delta:
                by_name[syscall_name(nr, self.machine)] = delta
        reading = SyscallReading(counts=by_name)
        if not self.config.latency:
            return reading
        buckets: dict[str, dict[int, int]] = {}
        for (idx, bucket), value in latency.items():
            if idx // SYSCALL_SLOTS != slot:
                continue
            delta = value - self._latency_seen.get((idx, bucket), 0)
            if delta:
                buckets.setdefault(syscall_name(idx % SYSCALL_SLOTS, self.machine), {})[bucket] = delta
        top = sorted(by_name, key=lambda n: by_name[n], reverse=True)[: self.config.top_n]
        reading.latency = {n: Log2Histogram.from_slots(buckets[n], unit="ns") for n in top if n in buckets}
        return reading
