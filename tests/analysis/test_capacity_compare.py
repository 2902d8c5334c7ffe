"""Before/after comparison: run-to-run noise from repeated steps decides what counts as a difference."""

import pytest

from analysis.capacity import Slo, StepFigures
from analysis.capacity_compare import Run, compare, format_table, measure_noise

SLO = Slo(p95_s=1.0)


def step(index: int, rate: float, achieved: float, p95: float, repeat_of: int | None = None,
         tokens_per_request: float = 32.0, errors: int = 0) -> StepFigures:
    sent = int(achieved * 10) + errors
    return StepFigures(index=index, offered_rps=rate, planned_s=10, duration_s=10, sent=sent, ok=sent - errors,
                       achieved_rps=achieved, tokens_per_s=achieved * tokens_per_request,
                       errors={"5xx": errors} if errors else {}, client_p95_s=p95, repeat_of=repeat_of)


def run(name: str, steps: list[StepFigures]) -> Run:
    return Run(name, SLO, steps, measure_noise(steps))


def baseline(name: str = "a", wobble: float = 1.0) -> Run:
    return run(name, [step(0, 2, 2.0, 0.30 * wobble), step(1, 4, 4.0, 0.45 * wobble), step(2, 8, 7.9, 0.80),
                      step(3, 12, 9.0, 2.5), step(4, 8, 8.1, 0.70, repeat_of=2)])


def test_noise_is_the_spread_between_a_step_and_its_repeat():
    noise = measure_noise(baseline().steps)
    assert noise["client_p95_s"] == pytest.approx(0.10 / 0.75)
    assert noise["achieved_rps"] == pytest.approx(0.2 / 8.0)
    assert noise["error_rate"] == 0.0


def test_noise_unknown_without_repeats():
    assert measure_noise([step(0, 2, 2.0, 0.3)]) == {"achieved_rps": None, "tokens_per_s": None,
                                                    "client_p95_s": None, "error_rate": None}


def test_identical_runs_show_no_difference_beyond_noise():
    c = compare(baseline("run1"), baseline("run2", wobble=1.08))
    assert c.verdict == "no difference beyond noise"
    assert [r.beyond_noise for r in c.rows] == [False, False, False, False]
    assert c.equal_load_rps == 8


def test_a_slower_server_differs_beyond_noise():
    slow = run("nocache", [step(0, 2, 2.0, 0.60), step(1, 4, 3.2, 2.1), step(2, 2, 2.0, 0.65, repeat_of=0)])
    c = compare(baseline("cache"), slow)
    rows = {r.figure.split(" at ")[0]: r for r in c.rows}
    assert rows["max requests/s under SLO"].before == 7.9 and rows["max requests/s under SLO"].after == 2.0
    assert rows["max requests/s under SLO"].beyond_noise is True
    # No 8 req/s step in the slow run: the highest rate both passed is 2 req/s.
    assert rows["p95"].beyond_noise is True and c.equal_load_rps == 2
    assert c.verdict.startswith("difference beyond noise in: max requests/s under SLO")
    table = format_table(c)
    assert "YES" in table and "cache -> nocache" in table


def test_a_knee_one_step_away_is_within_the_schedule_resolution():
    moved = run("b", [step(0, 2, 2.0, 0.3), step(1, 4, 4.0, 0.45), step(2, 8, 7.9, 1.2), step(3, 4, 4.1, 0.47, 1)])
    c = compare(baseline(), moved)
    knee_row = c.rows[0]
    assert (knee_row.before, knee_row.after) == (7.9, 4.0)
    # Before holds 7.9 and breaks at 12; after holds 4 and breaks at 8: both could be 7.9-8.
    assert (knee_row.before_range, knee_row.after_range) == ((7.9, 12), (4.0, 8))
    assert knee_row.beyond_noise is False


def test_resolution_counts_only_above_a_knee():
    # 2,4,8,16: before holds 8 (breaks at 16), after holds 2 (breaks at 4). The step around the
    # before knee is 8 req/s wide, more than the 5.9 between the knees, but the ranges are apart.
    wide = run("a", [step(0, 2, 2.0, 0.2), step(1, 4, 4.0, 0.3), step(2, 8, 7.9, 0.5), step(3, 16, 9.0, 3.0),
                     step(4, 8, 8.1, 0.5, repeat_of=2)])
    slow = run("b", [step(0, 2, 2.0, 0.5), step(1, 4, 3.1, 2.5), step(2, 2, 2.0, 0.5, repeat_of=0)])
    row = compare(wide, slow).rows[0]
    assert (row.before_range, row.after_range) == ((7.9, 16), (2.0, 4))
    assert row.beyond_noise is True
    tokens = compare(wide, slow).rows[1]
    assert tokens.after_range == (64.0, 128.0) and tokens.beyond_noise is True


def test_an_exact_knee_against_an_upper_bound_below_it():
    # The audit's pair: 7.76 req/s held (8 -> 16 breaks, 10 % run-to-run noise) against "< 2".
    held = run("normal", [step(0, 2, 2.05, 0.2), step(1, 4, 4.66, 0.3), step(2, 8, 7.76, 0.5), step(3, 16, 11.6, 2.0),
                          step(4, 8, 7.01, 0.6, repeat_of=2)])
    fault = run("gc", [step(0, 2, 0.9, 3.0), step(1, 2, 0.9, 3.1, repeat_of=0)])
    row = compare(held, fault).rows[0]
    assert (row.after, row.after_bound, row.after_range) == (2, "<", (0.0, 2))
    assert row.beyond_noise is True
    assert "YES" in format_table(compare(held, fault)).splitlines()[2]


def test_an_upper_bound_just_above_an_exact_knee_cannot_be_told_apart():
    held = run("a", [step(0, 2, 2.0, 0.2), step(1, 4, 3.9, 0.3), step(2, 8, 6.0, 2.0)])
    below = run("b", [step(0, 4, 3.0, 3.0)])
    row = compare(held, below).rows[0]
    assert (row.before_range, row.after_range) == ((3.9, 8), (0.0, 4))
    assert row.beyond_noise is None and "a bound on one side" in row.note


@pytest.mark.parametrize("a_steps, b_steps, beyond", [
    ([(4, 4.0, 0.3)], [(3, 3.0, 3.0)], True),  # >= 4 against < 3
    ([(3, 3.0, 3.0)], [(2, 2.0, 3.0)], None),  # < 3 against < 2: both could be 1
    ([(4, 4.0, 0.3)], [(8, 8.0, 0.3)], None),  # >= 4 against >= 8: both could be 20
    ([(4, 4.0, 0.3)], [(4, 4.0, 3.0)], None),  # >= 4 against < 4: apart only by less than the noise floor
])
def test_bound_against_bound(a_steps, b_steps, beyond):
    a = run("a", [step(i, *s) for i, s in enumerate(a_steps)])
    b = run("b", [step(i, *s) for i, s in enumerate(b_steps)])
    assert compare(a, b).rows[0].beyond_noise is beyond


def test_error_rate_row_uses_an_absolute_threshold():
    errs = run("b", [step(0, 2, 2.0, 0.3), step(1, 4, 4.0, 0.45), step(2, 8, 7.9, 0.8, errors=1),
                     step(3, 12, 9.0, 2.5), step(4, 8, 8.0, 0.75, repeat_of=2)])
    row = compare(baseline(), errs).rows[3]
    assert row.unit == "share" and row.beyond_noise is False  # 1.3 % points apart, inside 2 x 0.6 % noise + 1 % floor
    worse = run("c", [step(0, 2, 2.0, 0.3), step(1, 4, 4.0, 0.45), step(2, 8, 7.0, 0.8, errors=8),
                      step(4, 4, 4.0, 0.45, repeat_of=1)])
    row = compare(baseline(), worse).rows[3]
    assert row.figure == "error rate at 8 req/s offered" and row.beyond_noise is True


def test_a_run_that_failed_its_lowest_step_is_an_upper_bound():
    other = run("b", [step(0, 3, 3.0, 2.0)])
    c = compare(baseline(), other)
    row = c.rows[0]
    assert (row.after, row.after_bound) == (3, "<") and row.beyond_noise is True  # below 3, against 7.9 +- 4
    assert "b: no step met the SLO (capacity below 3 req/s)" in c.notes
    assert "<3.00" in format_table(c)


def test_bounds_that_overlap_cannot_be_told_apart():
    untested = run("b", [step(0, 2, 2.0, 0.3), step(1, 4, 4.0, 0.4), step(2, 4, 4.0, 0.41, repeat_of=1)])
    c = compare(baseline(), untested)
    row = c.rows[0]
    assert (row.after, row.after_bound) == (4.0, ">=") and row.beyond_noise is None
    assert c.verdict == "no difference beyond noise in what both runs measured"


def test_a_run_without_steps_is_not_measured():
    c = compare(baseline(), run("empty", []))
    assert c.rows[0].after is None and c.rows[0].beyond_noise is None and c.equal_load_rps is None
