"""Run-queue latency per target tgid: time from becoming runnable to running, as a log2 histogram.

Traces: tracepoints ``sched:sched_wakeup``, ``sched:sched_wakeup_new`` and ``sched:sched_switch``.

How: ``sched_wakeup`` carries only the wakee's tid, so the program keeps ``threads`` (tid ->
target slot): user space seeds it from ``/proc/PID/task`` when a target is added, and
``sched_switch`` learns every target thread that switches out (there the current task is
``prev``, so its tgid is at hand) and forgets threads that switch out dead. A queued
thread's enqueue time goes to ``start`` at wakeup, or at switch-out when it was preempted
(``prev_state`` without a sleep bit); at switch-in the delta goes to a per-CPU histogram
in microseconds and a per-CPU total in nanoseconds, both indexed by the target's slot.

Who delayed it: every switch also writes the task switching out (tgid, comm, when it ran) into a per-CPU
ring of the last RUN_HISTORY runs; when a target thread switches in after waiting, its wait is charged to
the runs that overlap it on that CPU, each for its overlap, into ``culprits`` (target slot, tgid) -> ns.
A wait longer than the ring (over 64 runs of other tasks in it) keeps its older part uncharged
(``charged_ns`` counts what was charged). A thread that waited on one CPU and was
migrated to another before it ran is charged to the runs of the CPU it ran on. User space names each
culprit from /proc at the read (probes/runq_culprits.py), keeping the kernel's comm for one that is gone.

Overhead: every context switch on the host pays the target filter for prev (an inlined
array lookup, probes/target_filter.py) and one hash lookup (``start`` for next); every
wakeup one (``threads``). Target threads add a few map updates.
Pipe ping-pong on one CPU (docs/BENCHMARKS.md): ~460 ns per switch of a target, ~165 ns
for other tasks, vs ~610 ns for ``runqlat-bpfcc`` (which traces every task). Charging the
culprits adds a ring write to every switch and a short walk at a target's switch-in:
219 vs 195 ns (target) and 74 vs 79 ns (other tasks, noise) in one run where runqlat-bpfcc took 280.

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

import os
from dataclasses import dataclass
from pathlib import Path

from analysis.window import Log2Histogram, RunQueueReading
from probes import c_helpers, runq_culprits, target_filter
from probes.map_read import percpu_array_sums
from probes.slotted import SlottedProbe

HIST_SLOTS = 32
# Runs kept per CPU (a power of two): a wait that spans more switches than this is charged for its newest part.
RUN_HISTORY = 64
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

#ifdef CULPRITS
// Who ran on each CPU: its last RUN_HISTORY runs (a ring), so that a target thread's wait can be charged to
// the tasks that held the CPU meanwhile, each for its overlap with the wait.
struct run_t {
    u64 start;
    u64 end;
    u32 tgid;  // 0: the idle task
    u32 pad;
    char comm[16];
};

struct cpu_runs_t {
    u64 last;  // the end of the newest run: when the running task switched in
    u32 head;
    u32 pad;
    struct run_t runs[RUN_HISTORY];
};

struct culprit_key_t {
    u32 slot;
    u32 tgid;
};

struct culprit_t {
    u64 ns;
    char comm[16];
};

BPF_PERCPU_ARRAY(cpu_runs, struct cpu_runs_t, 1);
BPF_HASH(culprits, struct culprit_key_t, struct culprit_t, CULPRIT_ENTRIES);
BPF_PERCPU_ARRAY(charged_ns, u64, MAX_TARGETS);
#endif

#define EEXIST_ERR -17

#ifdef CULPRITS
static inline u64 charge(u32 slot, struct run_t *r, u64 ns)
{
    struct culprit_key_t k = {.slot = slot, .tgid = r->tgid};
    struct culprit_t *c = culprits.lookup(&k);
    if (!c) {
        struct culprit_t v = {.ns = 0};
        __builtin_memcpy(v.comm, r->comm, sizeof(v.comm));
        culprits.insert(&k, &v);
        c = culprits.lookup(&k);
        if (!c)
            return 0;  // the table is full: left uncharged, so charged_ns says how much is missing
    }
    __sync_fetch_and_add(&c->ns, ns);
    return ns;
}
#endif

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

    u64 now = bpf_ktime_get_ns();
#ifdef CULPRITS
    u32 zero = 0;
    struct cpu_runs_t *cr = cpu_runs.lookup(&zero);
    if (cr) {
        u32 h = (cr->head + 1) & (RUN_HISTORY - 1);
        struct run_t *r = &cr->runs[h];
        r->start = cr->last;
        r->end = now;
        r->tgid = tgid;
        __builtin_memcpy(r->comm, args->prev_comm, sizeof(r->comm));
        cr->head = h;
        cr->last = now;
    }
#endif

    u32 next = args->next_pid;
    struct start_t *st = start.lookup(&next);
    if (!st)
        return 0;
    u64 since = st->ts;
    u64 delta = now - since;
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
#ifdef CULPRITS
    if (!cr)
        return 0;
    // The runs the ring still holds that overlap the wait, newest first; a wait longer than the ring keeps its
    // older part uncharged (charged_ns says how much was charged), never guessed.
    u64 charged = 0;
    u32 head = cr->head;
#pragma unroll
    for (int i = 0; i < RUN_HISTORY; i++) {
        struct run_t *r = &cr->runs[(head - i) & (RUN_HISTORY - 1)];
        if (r->end <= since)
            break;
        u64 from = r->start > since ? r->start : since;
        if (r->end > from)
            charged += charge(which, r, r->end - from);
    }
    u64 *c = charged_ns.lookup(&which);
    if (c)
        *c += charged;
#endif
    return 0;
}
"""


@dataclass(frozen=True)
class RunqlatConfig:
    max_targets: int = 64  # processes: each member of a family target takes a slot
    thread_entries: int = 65536
    # Charge each wait to the processes that ran meanwhile (on by default; off: the histogram and total only).
    culprits: bool = True
    # (target slot, culprit process) pairs charged between two reads; beyond it a wait is left uncharged.
    culprit_entries: int = 4096
    top_culprits: int = 5

    def __post_init__(self) -> None:
        if not 1 <= self.max_targets <= 1024:
            raise ValueError(f"max_targets must be within [1, 1024], got {self.max_targets!r}")
        if self.thread_entries < 1:
            raise ValueError(f"thread_entries must be at least 1, got {self.thread_entries!r}")
        if self.culprit_entries < 1:
            raise ValueError(f"culprit_entries must be at least 1, got {self.culprit_entries!r}")
        if not 0 <= self.top_culprits <= 100:
            raise ValueError(f"top_culprits must be within [0, 100], got {self.top_culprits!r}")


def render(config: RunqlatConfig) -> str:
    """The C text for `config`: #defines first, then the program."""
    defines = [
        f"#define MAX_TARGETS {config.max_targets}",
        f"#define THREAD_ENTRIES {config.thread_entries}",
        f"#define HIST_SLOTS {HIST_SLOTS}",
        f"#define RUN_HISTORY {RUN_HISTORY}",
        f"#define CULPRIT_ENTRIES {config.culprit_entries}",
    ]
    if config.culprits:
        defines.append("#define CULPRITS 1")
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
        self._charged_seen: list[int] = [0] * self.config.max_targets

    def _render(self) -> str:
        return render(self.config)

    def _take_baseline(self, added: list[tuple[int, int]]) -> None:
        hist, totals = self._read_arrays()
        threads = self._bpf[b"threads"]
        for tgid, slot in added:
            self._hist_seen[slot * HIST_SLOTS:(slot + 1) * HIST_SLOTS] = hist[slot * HIST_SLOTS:(slot + 1) * HIST_SLOTS]
            self._total_seen[slot] = totals[slot]
            if self.config.culprits:
                self._charged_seen[slot] = self._read_charged()[slot]
            for tid in thread_ids(tgid, self._proc_root):
                threads[threads.Key(tid)] = threads.Leaf(slot)

    def _read_slots(self) -> dict[int, RunQueueReading]:
        hist, totals = self._read_arrays()
        charged = self._read_charged() if self.config.culprits else None
        by_slot = self._drain_culprits() if self.config.culprits else {}
        agent = (runq_culprits.agent_pids(self._proc_root, os.getpid(), {t for c in by_slot.values() for t in c})
                 if by_slot else set())
        readings: dict[int, RunQueueReading] = {}
        for tgid, slot in self._slots.items():
            base = slot * HIST_SLOTS
            counts = [hist[base + i] - self._hist_seen[base + i] for i in range(HIST_SLOTS)]
            while counts and counts[-1] == 0:
                counts.pop()
            culprits = runq_culprits.top(by_slot.get(slot, {}), tgid, agent, self.config.top_culprits,
                                         self._proc_root)
            readings[tgid] = RunQueueReading(histogram=Log2Histogram(unit="us", counts=counts),
                                             total_seconds=(totals[slot] - self._total_seen[slot]) / 1e9,
                                             culprits=culprits,
                                             charged_seconds=None if charged is None else
                                             (charged[slot] - self._charged_seen[slot]) / 1e9)
        self._hist_seen, self._total_seen = hist, totals
        if charged is not None:
            self._charged_seen = charged
        return readings

    def _read_charged(self) -> list[int]:
        return percpu_array_sums(self._bpf[b"charged_ns"])

    def _drain_culprits(self) -> dict[int, dict[int, tuple[str, int]]]:
        """slot -> culprit tgid -> (comm, ns) charged since the last read; the table is emptied as it is read."""
        out: dict[int, dict[int, tuple[str, int]]] = {}
        for key, value in self._bpf[b"culprits"].items_lookup_and_delete_batch():
            comm = bytes(value.comm).split(b"\0", 1)[0].decode("utf-8", "replace")
            out.setdefault(int(key.slot), {})[int(key.tgid)] = (comm, int(value.ns))
        return out

    def _forget(self, slot: int) -> None:
        # Forget the slot's threads so that their wakeups stop counting for whoever gets it next.
        if self.config.culprits:
            culprits = self._bpf[b"culprits"]
            for key in [k for k in culprits.keys() if int(k.slot) == slot]:
                try:
                    del culprits[key]
                except KeyError:
                    pass  # drained by a read in between
        threads = self._bpf[b"threads"]
        for key, value in list(threads.items_lookup_batch()):
            if int(value) == slot:
                try:
                    del threads[threads.Key(int(key))]
                except KeyError:
                    pass  # the kernel removed it first (the thread exited)

    def _read_arrays(self) -> tuple[list[int], list[int]]:
        return percpu_array_sums(self._bpf[b"hist"]), percpu_array_sums(self._bpf[b"total_ns"])
