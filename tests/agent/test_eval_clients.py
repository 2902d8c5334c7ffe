"""The clients' own latency per agent window: binning the load generator's requests log by the windows' bounds,
carrying the figures beside each recorded window, and scoring the agent's clients' estimate against them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from agent.evaluation.clients import (
    ClientFigures,
    OneWindowLate,
    RequestsLog,
    RequestTiming,
    compare,
    figures,
)
from agent.evaluation.recording import LabelledWindow, RecordingWriter, read_recording
from analysis.client_latency import estimate
from analysis.scenario import Phase, Scenario
from analysis.window import DeliveryReading, LatencyReading, Window


def line(end: float, latency: float, ok: bool = True) -> str:
    return json.dumps({"end": end, "latency_s": latency, "ok": ok}) + "\n"


def test_a_request_counts_in_the_window_its_reply_finished_in() -> None:
    timings = [RequestTiming(99.999, 9.0, True), RequestTiming(100.0, 1.0, True), RequestTiming(102.0, 3.0, True),
               RequestTiming(104.999, 2.0, True), RequestTiming(105.0, 7.0, True)]
    # [start, end): the request at exactly 105.0 belongs to the next window, the one at 100.0 to this one, and one
    # that started in an earlier window but finished in this one is this window's.
    got = figures(timings, 100.0, 105.0)
    assert (got.requests, got.failed) == (3, 0)
    assert (got.p50_seconds, got.p95_seconds, got.p99_seconds) == (2.0, 3.0, 3.0)
    assert figures(timings, 105.0, 110.0).p99_seconds == 7.0


def test_quantiles_are_nearest_rank_of_the_succeeded_requests_and_failures_are_counted_apart() -> None:
    timings = [RequestTiming(1.0 + i / 100, float(i + 1), True) for i in range(100)]
    timings.append(RequestTiming(1.5, 60.0, False))  # a timeout is no latency: counted, not ranked
    got = figures(timings, 0.0, 5.0)
    assert (got.requests, got.failed) == (101, 1)
    assert (got.p50_seconds, got.p95_seconds, got.p99_seconds) == (50.0, 95.0, 99.0)


def test_a_window_without_a_finished_request_has_no_quantiles_not_zero() -> None:
    got = figures([RequestTiming(1.0, 0.5, False)], 0.0, 5.0)
    assert got == ClientFigures(requests=1, failed=1, p50_seconds=None, p95_seconds=None, p99_seconds=None)


def test_the_log_is_read_as_it_grows_and_a_torn_last_line_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestsLog(path)
    assert log.read() == []  # the load has not written yet
    path.write_text(line(1.0, 0.2) + "not json\n" + '{"end": 2.0, "lat')
    assert log.read() == [RequestTiming(1.0, 0.2, True)]
    with path.open("a") as f:
        f.write('ency_s": 0.3, "ok": false}\n' + line(3.0, float("nan")))
    assert log.read() == [RequestTiming(1.0, 0.2, True), RequestTiming(2.0, 0.3, False)]


def window(start: float, end: float, latency: LatencyReading | None = None,
           delivery: DeliveryReading | None = None) -> LabelledWindow:
    return LabelledWindow(Window(target="t", pid=1, start=start, end=end, latency=latency, delivery=delivery),
                          "normal", 0)


def test_each_window_is_handed_on_one_window_late_with_the_requests_logged_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    emitted: list[LabelledWindow] = []
    late = OneWindowLate(RequestsLog(path), emitted.append)
    path.write_text(line(1.0, 0.5))
    late.add(window(0.0, 5.0))
    assert emitted == []
    # A reply that finished just before the first window closed, logged only after it closed.
    path.write_text(line(1.0, 0.5) + line(4.99, 0.9) + line(6.0, 0.1))
    late.add(window(5.0, 10.0))
    assert [w.window.start for w in emitted] == [0.0]
    assert emitted[0].clients == ClientFigures(2, 0, 0.5, 0.9, 0.9)
    late.flush()
    late.flush()  # nothing held: nothing emitted twice
    assert [w.window.start for w in emitted] == [0.0, 5.0] and emitted[1].clients.p99_seconds == 0.1


def test_the_figures_travel_beside_the_window_in_a_recording(tmp_path: Path) -> None:
    scenario = Scenario(name="s", rate=4.0, phases=(Phase(seconds=10, label="normal"),))
    writer = RecordingWriter(tmp_path / "r.jsonl.gz", scenario, 5.0, 0.0)
    first, second = window(0.0, 5.0), window(5.0, 10.0)
    first.clients = ClientFigures(20, 1, 0.1, 0.4, 0.5)
    writer.add(first)
    writer.add(second)
    windows = read_recording(writer.close(complete=True)).windows
    assert windows[0].clients == first.clients and windows[1].clients is None
    assert "clients" not in windows[0].window.to_dict()  # never in the window: the detector does not see it


def histogram(values: dict[str, float]) -> dict[str, float]:
    return {**values, "+Inf": 0.0}


def test_compare_sets_the_estimate_beside_the_clients_p99_and_counts_those_within_20_percent() -> None:
    latency = LatencyReading(requests=20, buckets=histogram({"0.25": 10.0, "0.5": 10.0, "1": 0.0, "2.5": 0.0}))
    delivery = DeliveryReading(replies=20, buckets=histogram({"0.25": 20.0, "0.5": 0.0, "1": 0.0, "2.5": 0.0}))
    guess = estimate(latency, delivery)
    assert guess is not None
    near, far, empty, blind = (window(i * 5.0, i * 5.0 + 5, latency, delivery) for i in range(4))
    near.clients = ClientFigures(20, 0, 0.2, 0.4, guess.p99_seconds * 1.1)
    far.clients = ClientFigures(20, 0, 0.2, 0.4, guess.p99_seconds * 2.0)
    far.label = "network"
    empty.clients = ClientFigures(0, 0, None, None, None)  # no request: nothing to compare
    blind.window.delivery = None  # no estimate: nothing to compare
    blind.clients = ClientFigures(20, 0, 0.2, 0.4, 0.5)
    got = compare([near, far, empty, blind])
    assert got is not None
    assert (got["windows"], got["share_within"], got["fault_windows"], got["fault_share_within"]) == (2, 0.5, 1, 0.0)
    assert [r["window"] for r in got["per_window"]] == [0, 1]
    assert got["per_window"][0]["ratio"] == pytest.approx(1 / 1.1) and got["per_window"][0]["within"]
    assert got["per_window"][1]["ratio"] == pytest.approx(0.5) and not got["per_window"][1]["within"]


def test_a_recording_without_the_clients_figures_has_no_comparison() -> None:
    assert compare([window(0.0, 5.0)]) is None


def test_eval_replay_json_and_table_show_the_comparison_per_scenario(tmp_path: Path) -> None:
    from agent.evaluation import command
    from tests.agent.eval_detector import ThresholdDetector

    scenario = Scenario(name="loss", rate=4.0, phases=(Phase(seconds=30, label="normal"),
                                                       Phase(seconds=20, label="network")))
    latency = LatencyReading(requests=20, request_rate=4.0, p50_seconds=0.2, p99_seconds=0.4,
                             buckets=histogram({"0.25": 10.0, "0.5": 10.0, "1": 0.0, "2.5": 0.0}))
    delivery = DeliveryReading(replies=20, buckets=histogram({"0.25": 20.0, "0.5": 0.0, "1": 0.0, "2.5": 0.0}))
    p99 = estimate(latency, delivery).p99_seconds
    writer = RecordingWriter(tmp_path / "loss.jsonl.gz", scenario, 5.0, 0.0)
    for i in range(10):
        item = window(i * 5.0, i * 5.0 + 5, latency, delivery)
        item.phase = scenario.phase_at(i * 5.0 + 2.5)
        item.label = scenario.phases[item.phase].label
        # The clients saw the estimate in the normal windows and three times it in the network ones.
        item.clients = ClientFigures(20, 0, 0.2, 0.4, p99 * (3.0 if item.label == "network" else 1.0))
        writer.add(item)
    path = str(writer.close(complete=True))
    for as_json in (True, False):
        out, err = io.StringIO(), io.StringIO()
        code = command.main([], [path], None, as_json, None, None, False, out=out, err=err, factory=ThresholdDetector)
        assert code == 0, err.getvalue()
        if as_json:
            got = json.loads(out.getvalue())["clients"]["loss"]
            assert (got["windows"], got["share_within"], got["fault_windows"], got["fault_share_within"]) == (
                10, 0.6, 4, 0.0)
        else:
            assert "loss                                 60% of 10, fault phases 0% of 4" in out.getvalue()


def test_a_fault_shorter_than_a_window_labels_the_window_that_holds_most_of_it() -> None:
    from agent.evaluation.live import phase_of_window

    burst = Scenario(name="b", rate=4.0, phases=(Phase(seconds=240, label="normal"), Phase(seconds=3, label="network"),
                                                 Phase(seconds=120, label="normal")))
    # 240-243: the windows from 237.5 have their middles at 240 and 245, outside it; the first holds 2.5 s of it.
    assert [phase_of_window(burst, s, s + 5) for s in (232.5, 237.5, 242.5, 247.5)] == [0, 1, 2, 2]
    assert [phase_of_window(burst, s, s + 5) for s in (235.0, 240.0, 245.0)] == [0, 1, 2]
    # A phase as long as the window or longer keeps the middle rule, as every recorded scenario was labelled.
    step = Scenario(name="s", rate=4.0, phases=(Phase(seconds=10, label="normal"), Phase(seconds=5, label="gc"),
                                                Phase(seconds=10, label="normal")))
    assert [phase_of_window(step, s, s + 5) for s in (7.0, 8.0, 12.0, 13.0)] == [0, 1, 1, 2]
