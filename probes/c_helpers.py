"""C text several probes share, prepended the way target_filter's is: failure and lost-event counters, log2 slots."""

from __future__ import annotations

FAILURES_C = r"""
BPF_ARRAY(failures, u64, FAILURE_SLOTS);

static inline void count_failure(int which) {
    u64 *c = failures.lookup(&which);
    if (c)
        __sync_fetch_and_add(c, 1);
}
"""

# Per-CPU, so the hot path never shares a cache line; probes.slotted sums it at read.
LOST_C = r"""
BPF_PERCPU_ARRAY(lost, u64, 1);

static inline void count_lost(void)
{
    u32 zero = 0;
    u64 *n = lost.lookup(&zero);
    if (n)
        (*n)++;
}
"""

# bcc's bpf_log2l() is floor(log2)+1 (its print convention); Log2Histogram's slot i is [2^i, 2^(i+1)),
# slot 0 also holding 0.
LOG2_C = r"""
#define log2_slot(v) (bpf_log2l(v) - 1)
"""


def failures(slots: int) -> str:
    """A `failures` array of `slots` counters and count_failure(which), atomically incremented."""
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"failure slots must be a positive int, got {slots!r}")
    return f"#define FAILURE_SLOTS {slots}\n" + FAILURES_C


def lost() -> str:
    """A per-CPU `lost` counter at index 0 and count_lost()."""
    return LOST_C


def log2_slot() -> str:
    """log2_slot(v): the Log2Histogram slot of v."""
    return LOG2_C
