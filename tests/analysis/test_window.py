"""Window (de)serialisation: every reading survives a JSON round trip byte for byte; bad input is one ValueError."""

import json

import pytest

from analysis.window import (
    GcReading,
    GpuReading,
    LatencyReading,
    Log2Histogram,
    OffCpuReading,
    ProcessReading,
    RunQueueReading,
    StackReading,
    SyscallReading,
    TcpFlow,
    TcpReading,
    Window,
)


def full_window() -> Window:
    return Window(
        target="server", pid=4242, start=1000.0, end=1005.000001,
        syscalls=SyscallReading(counts={"futex": 120}, latency={"futex": Log2Histogram(unit="ns", counts=[0, 4, 1])}),
        offcpu=OffCpuReading(seconds=2.5, by_thread={4243: 1.25, 4244: 1.25}, stacks={"a;-;b": 17},
                             histogram=Log2Histogram(unit="us", counts=[1, 2])),
        gc=GcReading(collections=3, pause_seconds=1e-05, max_pause_seconds=6e-06,
                     histogram=Log2Histogram(unit="us", counts=[0] * 12 + [3])),
        tcp=TcpReading(retransmits=2, flows=[TcpFlow("10.0.0.1", 8000, "10.0.0.2", 51000, "TCP_ESTABLISHED", 2)]),
        runqueue=RunQueueReading(histogram=Log2Histogram(unit="us", counts=[5, 10]), total_seconds=0.0001),
        process=ProcessReading(cpu_seconds=2.0, rss_bytes=300 * 2**20, threads=9),
        stacks=StackReading(active={"main;f": 40}, idle={"w;wait": 9}, rate_hz=49.0, samples=48),
        latency=LatencyReading(p50_seconds=0.05, requests=40.0, request_rate=8.0, buckets={"0.1": 30.0, "+Inf": 10.0},
                               waiting=None, tokens_per_second=512.5),
        gpu=GpuReading(available=False, reason="no NVIDIA GPU: NVML Shared Library Not Found"),
        errors={"stacks": "py-spy exited: boom"},
    )


def test_round_trip_keeps_every_field_and_the_json_text():
    w = full_window()
    text = w.to_json()
    back = Window.from_json(text)
    assert back == w
    assert back.offcpu.by_thread == {4243: 1.25, 4244: 1.25}  # int keys again, not JSON's strings
    assert back.to_json() == text
    assert Window.from_dict(json.loads(text)) == w


def test_missing_readings_stay_null_and_older_rows_take_defaults():
    w = Window.from_dict({"target": "t", "pid": 1, "start": 0.0, "end": 1.0, "gc": None,
                          "latency": {"p99_seconds": 0.2, "requests": 1.0, "request_rate": 1.0}})
    assert w.gc is None and w.syscalls is None
    assert w.latency.p99_seconds == 0.2 and w.latency.buckets == {} and w.latency.tokens_per_second is None


@pytest.mark.parametrize("data,says", [
    ({"target": "t", "pid": "x", "start": 0, "end": 1}, r"\$\.pid"),
    ({"target": "t", "pid": 1, "start": 0}, "end"),
    ({"target": "t", "pid": 1, "start": 0, "end": 1, "gc": {"collections": "many"}}, r"\$\.gc\.collections"),
])
def test_bad_input_is_one_value_error_naming_the_field(data, says):
    with pytest.raises(ValueError, match=says) as info:
        Window.from_dict(data)
    assert "\n" not in str(info.value)


def test_readings_are_exactly_the_optional_reading_fields_of_window():
    from dataclasses import fields

    from analysis.window import READINGS

    about = {"target", "pid", "start", "end", "errors", "unanswered", "unreachable", "closed", "members"}
    assert READINGS == tuple(f.name for f in fields(Window) if f.name not in about)
    assert "unanswered" not in READINGS and "unreachable" not in READINGS
