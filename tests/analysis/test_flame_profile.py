"""Profile model: counts, merging over windows, normalising, and the bounds on untrusted names."""

import pytest

from analysis.flamegraph.profile import (
    TRUNCATED,
    UNKNOWN,
    Limits,
    Profile,
    clean_frame,
    merge,
)


def test_add_sums_repeated_stacks_and_total_counts_every_sample():
    prof = Profile()
    prof.add(["main", "a"], 3)
    prof.add(("main", "a"), 4)
    prof.add(["main", "b"])
    assert prof.stacks == {("main", "a"): 7, ("main", "b"): 1}
    assert prof.total() == 8
    assert prof.frame_count() == 3


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_add_rejects_counts_that_are_not_non_negative_ints(bad):
    with pytest.raises(ValueError, match=repr(bad).replace("(", r"\(")):
        Profile().add(["a"], bad)


def test_a_string_is_not_taken_for_a_stack_of_characters():
    with pytest.raises(TypeError, match="'main;work'"):
        Profile().add("main;work", 1)


def test_from_folded_dict_reads_the_window_form():
    prof = Profile.from_folded_dict({"MainThread;run (a.py:1);work (a.py:9)": 5, "MainThread;idle": 2},
                                    unit="samples", start=10.0, end=20.0)
    assert prof.stacks[("MainThread", "run (a.py:1)", "work (a.py:9)")] == 5
    assert prof.total() == 7
    assert (prof.start, prof.end) == (10.0, 20.0)


def test_merge_over_windows_adds_counts_and_widens_the_time_range():
    w1 = Profile({("m", "a"): 2, ("m", "b"): 1}, start=100.0, end=110.0)
    w2 = Profile({("m", "a"): 5}, start=110.0, end=120.0)
    w3 = Profile({("m", "c"): 1}, start=90.0, end=95.0)
    out = merge([w1, w2, w3])
    assert out.stacks == {("m", "a"): 7, ("m", "b"): 1, ("m", "c"): 1}
    assert (out.start, out.end) == (90.0, 120.0)


def test_merge_refuses_mixed_units():
    with pytest.raises(ValueError, match="'microseconds'"):
        Profile(unit="samples").merge(Profile({("a",): 1}, unit="microseconds"))


def test_scaled_keeps_the_exact_target_total_and_proportions():
    prof = Profile({("a",): 1, ("b",): 1, ("c",): 1})
    out = prof.scaled(10)
    assert out.total() == 10
    assert sorted(out.stacks.values()) == [3, 3, 4]
    assert Profile({("a",): 30, ("b",): 10}).scaled(4).stacks == {("a",): 3, ("b",): 1}


def test_fractions_are_shares_of_the_total():
    assert Profile({("a",): 3, ("b",): 1}).fractions() == {("a",): 0.75, ("b",): 0.25}
    assert Profile().fractions() == {}


def test_clean_frame_escapes_what_folded_text_and_xml_cannot_carry():
    assert clean_frame("a;b")[0] == "a\\x3bb"
    assert clean_frame("line\nbreak\r")[0] == "line\\x0abreak\\x0d"
    assert clean_frame("nul\x00")[0] == "nul\\x00"
    assert clean_frame("nel\x85 ls\u2028")[0] == "nel\\x85 ls\\u2028"
    assert clean_frame("lone \ud800 surrogate")[0] == "lone \\ud800 surrogate"
    assert clean_frame("")[0] == UNKNOWN
    # Bidi controls would reorder the name, or the counts printed after it, where it is shown.
    assert clean_frame("evil\u202egnp.exe")[0] == "evil\\u202egnp.exe"
    assert clean_frame("\u2066a\u2069\u200f\u061c")[0] == "\\u2066a\\u2069\\u200f\\u061c"
    # flamegraph.pl would read a trailing " 12" as a second count column.
    assert clean_frame("worker 12")[0] == "worker\\x2012"
    # Left alone: what py-spy and the kernel actually produce.
    for ok in ("forward (torch/nn/modules/module.py:1501)", "do_nanosleep", "<script>alert(1)</script>",
               "x&y\"q'", "thread (0x7f3a)", "ünïcödé ✓"):
        assert clean_frame(ok) == (ok, False)


def test_long_names_are_cut_to_the_limit_and_counted():
    prof = Profile(limits=Limits(max_frame_len=16))
    prof.add(["x" * 100, "short"], 2)
    (stack,) = prof.stacks
    assert stack == ("x" * 13 + "...", "short")
    assert len(stack[0]) == 16
    assert prof.truncation.long_frames == 1


def test_deep_stacks_keep_their_root_side_and_end_in_the_truncated_frame():
    prof = Profile(limits=Limits(max_depth=4))
    prof.add([f"f{i}" for i in range(10)], 1)
    assert list(prof.stacks) == [("f0", "f1", "f2", TRUNCATED)]
    assert prof.truncation.deep_stacks == 1


def test_distinct_frame_names_past_the_limit_go_to_the_truncated_bucket():
    prof = Profile(limits=Limits(max_frames=4))
    for i in range(10):
        prof.add(["main", f"fn{i}"], 1)
    assert prof.total() == 10  # no sample is lost, only names
    assert prof.stacks[("main", TRUNCATED)] == 7
    assert prof.truncation.dropped_frames == 7
    assert prof.frame_count() <= 5  # the limit plus the bucket itself


def test_distinct_stacks_past_the_limit_go_to_one_truncated_stack_with_their_samples_counted():
    prof = Profile(limits=Limits(max_stacks=3))
    for i in range(6):
        prof.add(["main", f"fn{i}"], i + 1)
    assert len(prof.stacks) == 4
    assert prof.stacks[(TRUNCATED,)] == 4 + 5 + 6
    assert prof.total() == sum(range(1, 7))
    assert (prof.truncation.dropped_stacks, prof.truncation.dropped_samples) == (3, 15)


def test_limits_validate_their_values():
    with pytest.raises(ValueError, match="max_depth.*0"):
        Limits(max_depth=0)
