"""The in-kernel target filter of the slotted probes (syscalls, runqlat): tgid -> slot.

Every syscall or context switch on the host asks "is the current tgid a target?", so the
answer has to be cheap. A BPF hash lookup is a call into the map code (jhash, bucket walk):
~35 ns on this VM, a third of what the whole syscall probe costs. An array lookup is
inlined by the verifier into a bounds check and an add. So targets live in a direct-mapped
array indexed by the tgid's low bits; each entry holds the tgid it belongs to, so a lookup
is one inlined array access plus a compare.

Two targets whose tgids share the low bits cannot both sit in their bucket: the second goes
to the small `target_spill` hash and the bucket's `spilled` count says so. Only tgids that
land on such a bucket pay the hash lookup; with 16 targets in 4,096 buckets that is rare.

Updates never show a program a half-written entry that matches: an entry is filled while
`used` is 0 and switched on by a second write that changes only `used` (and is emptied by
switching `used` off first). Array updates copy 8 bytes at a time, and `used` never shares
those 8 bytes with `tgid` or `slot`.

Families (docs/window.md "members"): a process of a family target that forks a child process makes that
child a target from its first instruction, in the kernel, so a child that lives 200 ms between two windows
is counted and not missed. `task:task_newtask` runs in the parent before the child can run; when the parent
is in `follow` and the clone is a process (no CLONE_THREAD), the child takes a slot from `free_slots` (a
queue of slots whose baseline user space already took) into `newborn`, and is followed in turn. Lookups
find it there until user space adopts it into the array (at its next read); while any newborn waits
(`newborns` non-zero) a tgid that misses the array pays one hash lookup more, otherwise one inlined array
read. `follow_missed` counts children the kernel could not place (no free slot, a full map).
"""

from __future__ import annotations

from typing import Any

TARGET_BUCKETS = 4096  # a power of two: the bucket is tgid & (TARGET_BUCKETS - 1)

C_TEXT = r"""
struct target_t {
    u32 tgid;
    u32 slot;
    u32 used;     /* 0: empty, or being written */
    u32 spilled;  /* targets in `target_spill` whose tgid lands in this bucket */
};
BPF_ARRAY(targets, struct target_t, TARGET_BUCKETS);
BPF_HASH(target_spill, u32, u32, MAX_TARGETS);

struct newborn_t {
    u32 slot;
    u32 parent;
};
BPF_HASH(follow, u32, u8, MAX_TARGETS);
BPF_QUEUE(free_slots, u32, MAX_TARGETS);
BPF_HASH(newborn, u32, struct newborn_t, MAX_TARGETS);
BPF_ARRAY(newborns, u32, 1);
BPF_ARRAY(follow_missed, u64, 1);

/* The slot of `tgid` when it is a target, else NULL. */
static __always_inline u32 *target_slot(u32 tgid)
{
    u32 bucket = tgid & (TARGET_BUCKETS - 1);
    struct target_t *t = targets.lookup(&bucket);
    if (!t)
        return 0;
    if (t->used && t->tgid == tgid)
        return &t->slot;
    if (t->spilled) {
        u32 *spilled = target_spill.lookup(&tgid);
        if (spilled)
            return spilled;
    }
#ifdef NO_FAMILY_LOOKUP
    return 0;  /* the filter as it was before families: for the benchmark's side-by-side figure only */
#else
    u32 zero = 0;
    u32 *waiting = newborns.lookup(&zero);
    if (!waiting || !*waiting)
        return 0;
    struct newborn_t *nb = newborn.lookup(&tgid);
    return nb ? &nb->slot : 0;
#endif
}

static __always_inline void follow_missed_one(void)
{
    u32 zero = 0;
    u64 *n = follow_missed.lookup(&zero);
    if (n)
        __sync_fetch_and_add(n, 1);
}

#define CLONE_THREAD_FLAG 0x00010000

TRACEPOINT_PROBE(task, task_newtask)
{
    if (args->clone_flags & CLONE_THREAD_FLAG)
        return 0;
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    if (!follow.lookup(&parent))
        return 0;
    u32 slot;
    if (free_slots.pop(&slot)) {
        follow_missed_one();
        return 0;
    }
    u32 child = args->pid;
    struct newborn_t nb = {.slot = slot, .parent = parent};
    if (newborn.update(&child, &nb)) {
        free_slots.push(&slot, 0);
        follow_missed_one();
        return 0;
    }
    u8 one = 1;
    follow.update(&child, &one);
    u32 zero = 0;
    u32 *waiting = newborns.lookup(&zero);
    if (waiting)
        __sync_fetch_and_add(waiting, 1);
    return 0;
}
"""


def c_text(max_targets: int, buckets: int | None = None) -> str:
    """The filter's C text with its sizes defined; include it before the programs that call target_slot().

    `buckets` (a power of two, default TARGET_BUCKETS) must match the TargetTable's.
    """
    buckets = buckets or TARGET_BUCKETS
    if buckets & (buckets - 1):
        raise ValueError(f"buckets must be a power of two, got {buckets!r}")
    return f"#define TARGET_BUCKETS {buckets}\n" + C_TEXT.replace("MAX_TARGETS", str(max_targets))


class TargetTable:
    """User space's side of the filter: adds and removes targets in a loaded program's maps."""

    def __init__(self, bpf: Any, buckets: int | None = None) -> None:
        self._mask = (buckets or TARGET_BUCKETS) - 1
        self._array = bpf[b"targets"]
        self._spill = bpf[b"target_spill"]
        self._home: dict[int, int] = {}          # bucket -> the tgid living in it
        self._spilled: dict[int, set[int]] = {}  # bucket -> tgids of that bucket in target_spill
        self._slots: dict[int, int] = {}
        self._free_slots = bpf[b"free_slots"]
        self._newborn = bpf[b"newborn"]
        self._waiting = bpf[b"newborns"]
        self._missed = bpf[b"follow_missed"]

    def add(self, tgid: int, slot: int) -> None:
        if tgid in self._slots:
            raise ValueError(f"tgid {tgid} is already a target")
        bucket = tgid & self._mask
        self._slots[tgid] = slot
        if bucket not in self._home:
            self._home[bucket] = tgid
            self._write(bucket, used=0)
            self._write(bucket, used=1)
            return
        self._spill[self._spill.Key(tgid)] = self._spill.Leaf(slot)
        self._spilled.setdefault(bucket, set()).add(tgid)
        self._write(bucket, used=1)

    def remove(self, tgid: int) -> None:
        if tgid not in self._slots:
            return  # never added (a failed add): nothing to take out
        bucket = tgid & self._mask
        if self._home.get(bucket) == tgid:
            self._write(bucket, used=0)
            del self._home[bucket]
            del self._slots[tgid]
            return
        self._spilled[bucket].discard(tgid)
        self._write(bucket, used=int(bucket in self._home))
        del self._spill[self._spill.Key(tgid)]
        del self._slots[tgid]

    def offer_slot(self, slot: int) -> None:
        """A free slot, its baseline taken, for the kernel to give the next followed child."""
        self._free_slots.push(self._free_slots.Leaf(slot))

    def newborns(self) -> list[tuple[int, int, int]]:
        """(child tgid, slot, parent tgid) of the children the kernel placed since the last adopt()."""
        return sorted((int(k.value), int(v.slot), int(v.parent)) for k, v in self._newborn.items())

    def adopt(self, child: int, slot: int) -> None:
        """Move a newborn into the array (or spill): from then on it is a target like any other."""
        self.add(child, slot)
        try:
            del self._newborn[self._newborn.Key(child)]
        except KeyError:
            pass

    def settle_newborns(self) -> None:
        """Lookups stop trying `newborn` once it is empty. Cleared, then looked at again: a child the kernel placed
        between the two is seen, and the flag set again (the kernel counts up; the flag only needs to be non-zero)."""
        if len(self._newborn.items()):
            return
        zero = self._waiting.Key(0)
        self._waiting[zero] = self._waiting.Leaf(0)
        if len(self._newborn.items()):
            self._waiting[zero] = self._waiting.Leaf(1)

    def missed_children(self) -> int:
        return int(self._missed[self._missed.Key(0)].value)

    def _write(self, bucket: int, used: int) -> None:
        entry = self._array.Leaf()
        home = self._home.get(bucket)
        if home is not None:
            entry.tgid, entry.slot = home, self._slots[home]
        entry.used = used
        entry.spilled = len(self._spilled.get(bucket, ()))
        self._array[self._array.Key(bucket)] = entry
