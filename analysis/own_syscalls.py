"""Syscalls that infersight's own probes make a target do, so every view can say they are ours."""

from __future__ import annotations

from collections.abc import Mapping

# 335 on x86-64 (Linux 6.11+): a uretprobe's return trampoline; the GC probe's uretprobe on gc_collect_main.
OWN_SYSCALLS: dict[str, str] = {"uretprobe": "infersight's GC probe"}


def workload_counts(counts: Mapping[str, int]) -> dict[str, int]:
    """`counts` without the syscalls the agent itself makes the target do: what the detector reads. A GC fault
    doubles them (one `uretprobe` per collection), which is the agent watching the fault, not the fault."""
    return {name: n for name, n in counts.items() if name not in OWN_SYSCALLS}
