"""percpu_array_sums reads a real BPF per-CPU array: the same sums as bcc's per-entry batch.

What it saves in CPU is a benchmark, not a test (a timed assertion fails on a busy host):
`python -m tests.probes.bench_map_read`, figures in docs/BENCHMARKS.md."""

from __future__ import annotations

import pytest

from probes.map_read import percpu_array_sums

pytestmark = [pytest.mark.bpf, pytest.mark.root]

N = 64 * 512  # the syscalls probe's counters at its default max_targets


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
    finally:
        bpf.cleanup()
