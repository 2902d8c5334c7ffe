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

/* The slot of `tgid` when it is a target, else NULL. */
static __always_inline u32 *target_slot(u32 tgid)
{
    u32 bucket = tgid & (TARGET_BUCKETS - 1);
    struct target_t *t = targets.lookup(&bucket);
    if (!t)
        return 0;
    if (t->used && t->tgid == tgid)
        return &t->slot;
    if (!t->spilled)
        return 0;
    return target_spill.lookup(&tgid);
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

    def _write(self, bucket: int, used: int) -> None:
        entry = self._array.Leaf()
        home = self._home.get(bucket)
        if home is not None:
            entry.tgid, entry.slot = home, self._slots[home]
        entry.used = used
        entry.spilled = len(self._spilled.get(bucket, ()))
        self._array[self._array.Key(bucket)] = entry
