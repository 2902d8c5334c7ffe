"""The schedule, range and sweep arguments: good forms parse, bad ones give one line quoting the bad part."""

import pytest

from agent.loadtest.schedule import Step, Sweep, parse_range, parse_schedule, parse_sweep


def test_schedule_parses_steps_in_order():
    assert parse_schedule("2:15, 4:15,8.5:20") == (Step(2, 15), Step(4, 15), Step(8.5, 20))


@pytest.mark.parametrize("text, message", [
    ("", "schedule is empty"),
    ("4", "'4' is not RATE:SECONDS"),
    ("4:x", "'4:x' is not RATE:SECONDS"),
    ("2:10,,4:10", "'' is not RATE:SECONDS"),
    ("0:10", "rate must be within"),
    ("-2:10", "rate must be within"),
    ("2:0", "seconds must be within"),
    ("2:9999", "seconds must be within"),
    ("nan:10", "rate must be within"),
])
def test_bad_schedules_say_which_part(text, message):
    with pytest.raises(ValueError, match=message):
        parse_schedule(text)


def test_range():
    assert parse_range("16", "x") == (16, 16)
    assert parse_range("16-48", "x") == (16, 48)
    for bad in ("0", "9-3", "a-b", ""):
        with pytest.raises(ValueError, match="--max-tokens must be N or MIN-MAX"):
            parse_range(bad, "--max-tokens")


def test_sweep():
    sweep = parse_sweep("max-batch=1,2,4")
    assert sweep == Sweep("max-batch", (1, 2, 4)) and sweep.server_flag == "--max-batch"
    assert parse_sweep("http-threads=4,32").server_flag == "--http-threads"
    for bad, message in (("threads=1,2", "SETTING=V1"), ("max-batch", "SETTING=V1"), ("max-batch=1,x", "whole"),
                         ("max-batch=0,2", "within")):
        with pytest.raises(ValueError, match=message):
            parse_sweep(bad)
