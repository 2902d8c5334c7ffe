"""The slotted probes' in-kernel target filter (probes/target_filter.py): its C text.

In the real kernel it is tested through the syscalls probe (test_probe_syscalls.py), whose
exact counts are the filter's ground truth."""

from __future__ import annotations

import pytest

from probes.target_filter import TARGET_BUCKETS, c_text


def test_c_text_sizes_and_rejects_a_bucket_count_that_is_no_power_of_two():
    text = c_text(16)
    assert text.startswith(f"#define TARGET_BUCKETS {TARGET_BUCKETS}\n")
    assert "BPF_HASH(target_spill, u32, u32, 16);" in text and "MAX_TARGETS" not in text
    assert c_text(4, buckets=8).startswith("#define TARGET_BUCKETS 8\n")
    with pytest.raises(ValueError, match="got 12"):
        c_text(4, buckets=12)
