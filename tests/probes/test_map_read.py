"""percpu_array_sums reads a real BPF per-CPU array: the same sums as bcc's per-entry batch, at a fraction of the CPU."""

from __future__ import annotations

import resource

import pytest

from probes.map_read import percpu_array_sums

pytestmark = [pytest.mark.bpf, pytest.mark.root]

N = 64 * 512  # the syscalls probe's counters at its default max_targets


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def test_sums_every_entry_over_cpus_as_bcc_does(require_bpf) -> None:
    from bcc import BPF

    bpf = BPF(text=f"BPF_PERCPU_ARRAY(counts, u64, {N});")
    try:
        table = bpf[b"counts"]
        ncpu = len(table.Leaf())
        # Distinct values on every CPU of a spread of entries, the first and last included.
        for i in (0, 1, 511, 4096, N - 1):
            table[table.Key(i)] = table.Leaf(*[i * 10 + c + 1 for c in range(ncpu)])
        expected = [0] * N
        for key, values in table.items_lookup_batch():
            expected[int(key)] = int(sum(values))
        sums = percpu_array_sums(table)
        assert sums == expected and type(sums[N - 1]) is int
        assert sums[N - 1] == sum((N - 1) * 10 + c + 1 for c in range(ncpu)) and sums[2] == 0
        # The point of it: bcc builds a ctypes key and value per entry; best of three each way.
        cost_bcc, cost_ours = [], []
        for _ in range(3):
            c = _cpu()
            dict(table.items_lookup_batch())
            cost_bcc.append(_cpu() - c)
            c = _cpu()
            percpu_array_sums(table)
            cost_ours.append(_cpu() - c)
        assert min(cost_ours) < min(cost_bcc) / 2, (cost_ours, cost_bcc)
    finally:
        bpf.cleanup()
