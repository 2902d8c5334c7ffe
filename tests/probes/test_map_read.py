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


@pytest.mark.parametrize("start, stop", [(0, 512), (512, 1024), (N - 512, N), (4095, 4097), (7, 7)])
def test_a_range_reads_those_entries_only(require_bpf, start, stop) -> None:
    """The syscalls probe reads the 512 counters of each slot in use: the same sums as the whole array's, for
    ranges at its start, in the middle, at its end, across a batch boundary and empty."""
    from bcc import BPF

    bpf = BPF(text=f"BPF_PERCPU_ARRAY(counts, u64, {N});".encode())
    try:
        table = bpf[b"counts"]
        ncpu = len(table.Leaf())
        for i in (0, 1, 511, 512, 513, 1023, 1024, 4095, 4096, 4097, N - 513, N - 512, N - 1):
            table[table.Key(i)] = table.Leaf(*[i * 10 + c + 1 for c in range(ncpu)])
        whole = percpu_array_sums(table)
        assert percpu_array_sums(table, start, stop) == whole[start:stop]
    finally:
        bpf.cleanup()


def test_a_range_outside_the_array_is_refused(require_bpf) -> None:
    from bcc import BPF

    bpf = BPF(text=b"BPF_PERCPU_ARRAY(counts, u64, 16);")
    try:
        with pytest.raises(ValueError, match="not within"):
            percpu_array_sums(bpf[b"counts"], 8, 17)
    finally:
        bpf.cleanup()
