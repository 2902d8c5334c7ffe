"""Whole BPF per-CPU arrays read in one batch into numpy: the sum over CPUs of every entry, without a Python
object per entry.

bcc's `items_lookup_batch()` yields a ctypes key and value per entry: for the syscalls probe's 64 x 512 counters
that is ~20 ms of the agent's CPU per window (measured, docs/BENCHMARKS.md "Where the agent process's own CPU goes
in steady state"), for the ~512 a single target uses. The same kernel call (BPF_MAP_LOOKUP_BATCH) fills two flat
buffers here, and numpy sums them.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
from typing import Any

import numpy as np


def percpu_array_sums(table: Any, start: int = 0, stop: int | None = None) -> list[int]:
    """Entries start..stop-1 of a bcc per-CPU array of u64 (`BPF_PERCPU_ARRAY(name, u64, N)`), summed over CPUs;
    every entry by default.

    The kernel copies every CPU's value of each entry read (~0.3 us an entry on this VM), so a caller that uses a
    few slots of a large array reads just those ranges.
    Raises OSError when the kernel refuses the batch lookup (kernels before 5.6 lack it for arrays)."""
    from bcc.libbcc import lib

    size = int(table.max_entries)
    stop = size if stop is None else stop
    if not 0 <= start <= stop <= size:
        raise ValueError(f"range {start}..{stop} is not within the array's {size} entries")
    n = stop - start
    if n == 0:
        return []
    keys = (table.Key * n)()
    values = (table.Leaf * n)()
    key_size, leaf_size = ct.sizeof(table.Key), ct.sizeof(table.Leaf)
    if leaf_size % 8:
        raise ValueError(f"not a per-CPU array of u64: a value is {leaf_size} bytes")
    # The batch cursor is the last key read; the first batch starts after `start - 1` (or at 0 with no cursor).
    batch, count = ct.c_uint32(max(start - 1, 0)), ct.c_uint32(0)
    total = 0
    while total < n:
        count.value = n - total
        res = lib.bpf_lookup_batch(table.map_fd, ct.byref(batch) if start + total else None, ct.byref(batch),
                                   ct.byref(keys, key_size * total), ct.byref(values, leaf_size * total),
                                   ct.byref(count))
        err = ct.get_errno()
        total += count.value
        if res != 0:
            if err != errno.ENOENT:  # ENOENT: the last batch, read in full
                raise OSError(err, f"BPF_MAP_LOOKUP_BATCH failed: {os.strerror(err)}")
            break
        if count.value == 0:
            break
    index = np.frombuffer(keys, dtype=np.uint32, count=total).astype(np.int64) - start
    sums = np.frombuffer(values, dtype=np.uint64, count=total * (leaf_size // 8)).reshape(total, -1).sum(axis=1)
    out = np.zeros(n, dtype=np.uint64)
    inside = (index >= 0) & (index < n)
    out[index[inside]] = sums[inside]
    return out.tolist()
