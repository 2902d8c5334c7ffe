"""Profile shift: leaf functions, Jensen-Shannon divergence bounds, the functions that grew, the decayed merge."""

import random
import statistics

import pytest

from analysis.profile import jensen_shannon, jensen_shannon_of_share, leaf_counts, leaf_function, merge, top_shifts


def test_leaf_function_drops_the_line_number_only():
    assert leaf_function("t;a (x.py:1);Model.forward (app/model.py:42)") == "Model.forward (app/model.py)"
    assert leaf_counts({"t;f (a.py:1)": 2, "u;f (a.py:9)": 3, "t;g (b.py:2)": 1}) == {"f (a.py)": 5.0, "g (b.py)": 1.0}


def test_jensen_shannon_is_zero_for_the_same_shape_one_for_disjoint_and_symmetric():
    assert jensen_shannon({"a": 1, "b": 3}, {"a": 10, "b": 30}) == pytest.approx(0.0)
    assert jensen_shannon({"a": 1}, {"b": 1}) == pytest.approx(1.0)
    p, q = {"a": 3, "b": 1}, {"a": 1, "b": 1, "c": 2}
    assert jensen_shannon(p, q) == pytest.approx(jensen_shannon(q, p))
    assert 0 < jensen_shannon(p, q) < 1


def test_jensen_shannon_of_an_empty_profile_is_an_error():
    with pytest.raises(ValueError, match="non-empty"):
        jensen_shannon({}, {"a": 1})


def test_top_shifts_rank_growth_and_leave_out_growth_below_the_edge():
    base = {"forward": 80, "sample": 20}
    cur = {"forward": 40, "sample": 19, "gc_churn": 40, "tiny": 1}
    shifts = top_shifts(base, cur, min_delta=0.02)
    assert [s.function for s in shifts] == ["gc_churn"]
    assert shifts[0].baseline_share == 0 and shifts[0].current_share == pytest.approx(0.4)
    # "sample" grew 0.20 -> 0.19: shrank; "tiny" 0 -> 0.01: below the edge until the edge is lowered.
    assert [s.function for s in top_shifts(base, cur, min_delta=0.01)] == ["gc_churn", "tiny"]


def test_merge_decays_what_was_there_and_drops_vanishing_entries():
    prof = {"a": 10.0, "b": 1e-7}
    merge(prof, {"c": 1.0}, decay=0.5)
    assert prof == {"a": 5.0, "c": 1.0}


def test_the_shift_of_a_share_is_the_mean_shift_over_every_draw_of_that_size_and_the_shift_itself_at_full_size():
    import itertools

    p = {"a": 5, "b": 3, "c": 2}
    counts = {"a": 2, "b": 1, "d": 2}
    held = [k for k, n in counts.items() for _ in range(n)]
    draws = list(itertools.combinations(range(len(held)), 2))
    mean = sum(jensen_shannon(p, {held[i]: 1} if held[i] == held[j] else {held[i]: 1, held[j]: 1})
               for i, j in draws) / len(draws)
    assert jensen_shannon_of_share(p, counts, 2) == pytest.approx(mean, abs=1e-12)
    assert jensen_shannon_of_share(p, counts, 5) == jensen_shannon(p, counts)
    assert jensen_shannon_of_share(p, counts, 50) == jensen_shannon(p, counts)
    with pytest.raises(ValueError, match="non-empty"):
        jensen_shannon_of_share(p, {}, 2)


def test_read_at_one_windows_share_a_longer_recordings_shift_does_not_depend_on_its_length():
    # The same healthy profile recorded in windows of 4 samples and in recordings of 3 windows (12 samples): the plain
    # divergence of the longer ones reads far lower (fewer samples fall on fewer functions), which made a fault's
    # shift look larger against their baseline; read at a third of their samples, both read alike.
    rng = random.Random(7)
    p = {"forward": 40, "attention": 25, "tokenize": 15, "wait": 10, "json": 5, "log": 5}
    functions, weights = list(p), list(p.values())

    def recording(n: int) -> dict[str, float]:
        out: dict[str, float] = {}
        for f in rng.choices(functions, weights, k=n):
            out[f] = out.get(f, 0.0) + 1
        return out

    one = statistics.median(jensen_shannon(p, recording(4)) for _ in range(400))
    three = [recording(12) for _ in range(400)]
    plain = statistics.median(jensen_shannon(p, r) for r in three)
    share = statistics.median(jensen_shannon_of_share(p, r, 4) for r in three)
    assert plain < 0.75 * one
    assert share == pytest.approx(one, rel=0.1)
