"""Run-queue latency per target tgid: time from becoming runnable to running, as a log2 histogram.

Traces: tracepoints ``sched:sched_wakeup``, ``sched:sched_wakeup_new`` and ``sched:sched_switch``.

How: ``sched_wakeup`` carries only the wakee's tid, so the program keeps ``threads`` (tid ->
target slot): user space seeds it from ``/proc/PID/task`` when a target is added, and
``sched_switch`` learns every target thread that switches out (there the current task is
``prev``, so its tgid is at hand) and forgets threads that switch out dead. A queued
thread's enqueue time goes to ``start`` at wakeup, or at switch-out when it was preempted
(``prev_state`` without a sleep bit); at switch-in the delta goes to a per-CPU histogram
in microseconds and a per-CPU total in nanoseconds, both indexed by the target's slot.

Overhead: every context switch on the host pays the target filter for prev (an inlined
array lookup, probes/target_filter.py) and one hash lookup (``start`` for next); every
wakeup one (``threads``). Target threads add a few map updates.
Pipe ping-pong on one CPU (docs/BENCHMARKS.md): ~460 ns per switch of a target, ~165 ns
for other tasks, vs ~610 ns for ``runqlat-bpfcc`` (which traces every task).

Caveats: ``sched_wakeup_new`` runs in the parent's context and the tracepoint has no tgid,
so a target that forks a child process counts the child's first wait (one sample per fork).
The histogram never gets zeroed (that races with increments): ``read()`` returns the
difference to the previous read. The total agrees with the kernel's own schedstat
``run_delay`` (see the tests). Classic tracepoint programs share a per-CPU recursion guard
with every other tracepoint/kprobe program on the host: a wakeup that fires in an interrupt
while any of them runs on that CPU is skipped by the kernel (~0.5% of waits here while other
tools traced sched_switch); health().lost_events counts those misses.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from analysis.window import Log2Histogram, RunQueueReading
from probes import c_helpers, target_filter
from probes.slotted import SlottedProbe

HIST_SLOTS = 32
TRACEPOINTS = ("sched:sched_wakeup", "sched:sched_wakeup_new", "sched:sched_switch", "task:task_newtask")

BPF_TEXT = r"""
// sched_switch's prev_state: 0 = runnable ("R"), TASK_REPORT_MAX (0x100) = preempted ("R+");
// the low byte holds the sleep/exit states (S D T t X Z P I).
#define STATE_MASK 0xff
#define STATE_DEAD 0x30

struct start_t {
    u64 ts;
    u32 slot;
};

BPF_HASH(threads, u32, u32, THREAD_ENTRIES);
BPF_HASH(start, u32, struct start_t, THREAD_ENTRIES);
BPF_PERCPU_ARRAY(hist, u64, MAX_TARGETS * HIST_SLOTS);
BPF_PERCPU_ARRAY(total_ns, u64, MAX_TARGETS);

#define EEXIST_ERR -17

// At wakeup: a thread already queued (preempted, then woken) keeps its earlier time.
static inline void enqueue_woken(u32 tid, u32 slot)
{
    struct start_t s = {.ts = bpf_ktime_get_ns(), .slot = slot};
    int err = start.insert(&tid, &s);
    if (err && err != EEXIST_ERR)
        count_lost();
}

static inline void enqueue_preempted(u32 tid, u32 slot)
{
    struct start_t s = {.ts = bpf_ktime_get_ns(), .slot = slot};
    if (start.update(&tid, &s))
        count_lost();
}

TRACEPOINT_PROBE(sched, sched_wakeup)
{
    u32 tid = args->pid;
    u32 *slot = threads.lookup(&tid);
    if (!slot)
        return 0;
    enqueue_woken(tid, *slot);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    u32 tid = args->pid;
    /* A followed child process's first wakeup is its own (its slot from task_newtask), not its parent's. */
    struct newborn_t *nb = newborn.lookup(&tid);
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 *slot = nb ? &nb->slot : target_slot(tgid);
    if (!slot)
        return 0;
    u32 s = *slot;
    if (threads.update(&tid, &s))
        count_lost();
    enqueue_woken(tid, s);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 *slot = target_slot(tgid);
    if (slot) {
        u32 prev = args->prev_pid;
        long state = args->prev_state;
        u32 s = *slot;
        if (state & STATE_DEAD) {
            threads.delete(&prev);
            start.delete(&prev);
        } else {
            u32 *known = threads.lookup(&prev);
            if (!known || *known != s) {
                if (threads.update(&prev, &s))
                    count_lost();
            }
            if ((state & STATE_MASK) == 0)
                enqueue_preempted(prev, s);
            else if (start.lookup(&prev))
                start.delete(&prev);  // asleep: a wakeup seen while it ran must not count (rare: lookup first, delete locks)
        }
    }

    u32 next = args->next_pid;
    struct start_t *st = start.lookup(&next);
    if (!st)
        return 0;
    u64 delta = bpf_ktime_get_ns() - st->ts;
    u32 which = st->slot;
    start.delete(&next);
    if (which >= MAX_TARGETS)
        return 0;
    u32 bucket = log2_slot(delta / 1000);  // Log2Histogram's slot i is [2^i, 2^(i+1)) us
    if (bucket >= HIST_SLOTS)
        bucket = HIST_SLOTS - 1;
    u32 idx = which * HIST_SLOTS + bucket;
    u64 *n = hist.lookup(&idx);
    if (n)
        (*n)++;
    u64 *total = total_ns.lookup(&which);
    if (total)
        *total += delta;
    return 0;
}
"""


@dataclass(frozen=True)
class RunqlatConfig:
    max_targets: int = 64  # processes: each member of a family target takes a slot
    thread_entries: int = 65536

    def __post_init__(self) -> None:
        if not 1 <= self.max_targets <= 1024:
            raise ValueError(f"max_targets must be within [1, 1024], got {self.max_targets!r}")
        if self.thread_entries < 1:
            raise ValueError(f"thread_entries must be at least 1, got {self.thread_entries!r}")


def render(config: RunqlatConfig) -> str:
    """The C text for `config`: #defines first, then the program."""
    defines = [
        f"#define MAX_TARGETS {config.max_targets}",
        f"#define THREAD_ENTRIES {config.thread_entries}",
        f"#define HIST_SLOTS {HIST_SLOTS}",
    ]
    return ("\n".join(defines) + "\n" + target_filter.c_text(config.max_targets) + c_helpers.lost()
            + c_helpers.log2_slot() + BPF_TEXT)


def thread_ids(tgid: int, proc_root: Path = Path("/proc")) -> list[int]:
    """Thread ids of `tgid` from `proc_root`/PID/task; [] once the process is gone."""
    try:
        return [int(p.name) for p in (proc_root / str(tgid) / "task").iterdir() if p.name.isdigit()]
    except FileNotFoundError:
        return []


class RunqlatProbe(SlottedProbe):
    """Run-queue latency histograms of target processes."""

    name = "runqueue"
    tracepoints = TRACEPOINTS

    def __init__(self, config: RunqlatConfig | None = None, proc_root: Path = Path("/proc")) -> None:
        super().__init__(config or RunqlatConfig(), proc_root)
        self._hist_seen: list[int] = [0] * (self.config.max_targets * HIST_SLOTS)
        self._total_seen: list[int] = [0] * self.config.max_targets

    def _render(self) -> str:
        return render(self.config)

    def _take_baseline(self, added: list[tuple[int, int]]) -> None:
        hist, totals = self._read_arrays()
        threads = self._bpf[b"threads"]
        for tgid, slot in added:
            self._hist_seen[slot * HIST_SLOTS:(slot + 1) * HIST_SLOTS] = hist[slot * HIST_SLOTS:(slot + 1) * HIST_SLOTS]
            self._total_seen[slot] = totals[slot]
            for tid in thread_ids(tgid, self._proc_root):
                threads[threads.Key(tid)] = threads.Leaf(slot)

    def _read_slots(self) -> dict[int, RunQueueReading]:
        hist, totals = self._read_arrays()
        readings: dict[int, RunQueueReading] = {}
        for tgid, slot in self._slots.items():
            base = slot * HIST_SLOTS
            counts = [hist[base + i] - self._hist_seen[base + i] for i in range(HIST_SLOTS)]
            while counts and counts[-1] == 0:
                counts.pop()
            readings[tgid] = RunQueueReading(histogram=Log2Histogram(unit="us", counts=counts),
                                             total_seconds=(totals[slot] - self._total_seen[slot]) / 1e9)
        self._hist_seen, self._total_seen = hist, totals
        return readings

    def _forget(self, slot: int) -> None:
        # Forget the slot's threads so that their wakeups stop counting for whoever gets it next.
        threads = self._bpf[b"threads"]
        for key, value in list(threads.items_lookup_batch()):
            if int(value) == slot:
                try:
                    del threads[threads.Key(int(key))]
                except KeyError:
                    pass  # the kernel removed it first (the thread exited)

    def _read_arrays(self) -> tuple[list[int], list[int]]:
        hist = [0] * (self.config.max_targets * HIST_SLOTS)
        for key, values in self._bpf[b"hist"].items_lookup_batch():
            hist[int(key)] = int(sum(values))
        totals = [0] * self.config.max_targets
        for key, values in self._bpf[b"total_ns"].items_lookup_batch():
            totals[int(key)] = int(sum(values))
        return hist, totals
