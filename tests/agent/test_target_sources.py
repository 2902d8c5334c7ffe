"""source_factories: the stack sampler gets the config's rates, a segment no longer than a window, the trigger."""

from __future__ import annotations

import os
import time

import pytest

from agent.config import Config, StacksConfig, TargetSpec
from agent.target_sources import source_factories
from agent.targets import Target, read_proc
from analysis.errors import ReadingError


@pytest.mark.parametrize("interval, segment, expected", [(5.0, 5, 5), (3.0, 5, 3), (2.5, 1, 1), (60.0, 10, 10)])
def test_sampler_segment_is_at_most_one_window(interval: float, segment: int, expected: int) -> None:
    spec = TargetSpec(name="me", pid=os.getpid())
    config = Config(interval_seconds=interval, targets=(spec,),
                    stacks=StacksConfig(segment_seconds=segment, rate_hz=5, burst_rate_hz=31))
    target = Target(name="me", pid=os.getpid(), start_time=read_proc(os.getpid()).start_time, cmdline=("python",), spec=spec)
    sampler = source_factories(target, config)["stacks"]()
    try:
        assert sampler.segment_seconds == expected
        assert (sampler.rate_hz, sampler.burst_rate_hz) == (5, 31)
    finally:
        sampler.close()


def test_the_burst_trigger_asks_by_target_name_and_switches_to_the_burst_rate() -> None:
    spec = TargetSpec(name="me", pid=os.getpid())
    config = Config(interval_seconds=1.0, targets=(spec,),
                    stacks=StacksConfig(segment_seconds=1, rate_hz=5, burst_rate_hz=31))
    asked: list[str] = []
    target = Target(name="me", pid=os.getpid(), start_time=read_proc(os.getpid()).start_time, cmdline=("python",), spec=spec)
    sampler = source_factories(target, config, wants_burst=lambda name: asked.append(name) or True)["stacks"]()
    try:
        sampler.start()
        deadline = time.monotonic() + 60
        while True:  # a segment lasts a second; a loaded machine may take many to finish and merge one
            try:
                reading = sampler.read()
                break
            except ReadingError:
                assert time.monotonic() < deadline, sampler.health()
                time.sleep(0.5)
        assert reading.rate_hz == 31  # sampled at the burst rate the trigger asked for
        assert asked and set(asked) == {"me"}  # the trigger asks by target name
    finally:
        sampler.close()


def test_no_stack_sampler_when_the_config_turns_stacks_off() -> None:
    spec = TargetSpec(name="me", pid=os.getpid())
    target = Target(name="me", pid=os.getpid(), start_time=read_proc(os.getpid()).start_time, cmdline=("python",), spec=spec)
    off = Config(targets=(spec,), stacks=StacksConfig(enabled=False))
    assert "stacks" not in source_factories(target, off)
    assert "stacks" in source_factories(target, Config(targets=(spec,)))


def test_latency_url_credentials_never_reach_the_log(caplog: pytest.LogCaptureFixture) -> None:
    from agent.config import LatencySpec
    from analysis.errors import ReadingError

    spec = TargetSpec(name="me", pid=os.getpid(),
                      latency=LatencySpec(url="https://user:s3cretpw@127.0.0.1:1/metrics?token=t0ken", metric="lat",
                                          timeout_seconds=0.2))
    target = Target(name="me", pid=os.getpid(), start_time=read_proc(os.getpid()).start_time, cmdline=("python",), spec=spec)
    with caplog.at_level("DEBUG"):
        source = source_factories(target, Config(targets=(spec,), stacks=StacksConfig(enabled=False)))["latency"]()
        try:
            with pytest.raises(ReadingError):
                source.read()  # the baseline scrape begun by the factory failed: said once, in the log
            with pytest.raises(ReadingError):
                source.read()
        finally:
            source.close()
    assert caplog.text.count("not answering yet") == 1, caplog.text
    assert "https://***@127.0.0.1:1/metrics?…" in caplog.text
    assert "s3cretpw" not in caplog.text and "user:" not in caplog.text and "t0ken" not in caplog.text


@pytest.mark.parametrize("timeout, interval, deadline", [(2.0, 5.0, 2.0), (10.0, 3.0, 1.5), (2.0, 1.0, 0.5)])
def test_a_scrape_never_waits_more_than_half_the_interval(timeout: float, interval: float, deadline: float) -> None:
    from agent.config import LatencySpec

    spec = TargetSpec(name="me", pid=os.getpid(),
                      latency=LatencySpec(url="http://127.0.0.1:1/metrics", metric="lat", timeout_seconds=timeout,
                                          max_body_bytes=1 << 20, max_series=500))
    target = Target(name="me", pid=os.getpid(), start_time=0, cmdline=("python",), spec=spec)
    config = Config(interval_seconds=interval, targets=(spec,), stacks=StacksConfig(enabled=False))
    source = source_factories(target, config)["latency"]()
    try:
        detail = source.health().detail
        assert (detail["deadline_seconds"], detail["max_body_bytes"], detail["max_series"]) == (deadline, 1 << 20, 500)
    finally:
        source.close()
