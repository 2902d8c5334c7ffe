"""`infersight eval --replay` end to end on a written recording, with a stand-in detector; bad input is one line."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from agent.evaluation import command
from agent.evaluation.recording import LabelledWindow, RecordingError, RecordingWriter, read_recording
from analysis.scenario import parse_scenario
from analysis.window import GcReading, LatencyReading, Window
from tests.agent.eval_detector import ThresholdDetector

SCENARIO = parse_scenario('''
name = "synthetic gc"
interval_seconds = 5
[load]
rate = 4.0
[[phase]]
seconds = 50
label = "normal"
[[phase]]
seconds = 20
fault = "gc"
label = "gc"
[[phase]]
seconds = 30
label = "normal"
''')


def window(i: int, slow: bool) -> Window:
    mean = 0.5 if slow else 0.1
    return Window(target="workload", pid=7, start=1000.0 + 5 * i, end=1005.0 + 5 * i,
                  latency=LatencyReading(p50_seconds=mean, p95_seconds=mean * 2, p99_seconds=mean * 3,
                                         mean_seconds=mean, requests=20, request_rate=4.0,
                                         buckets={"0.1": 10.0, "+Inf": 10.0}),
                  gc=GcReading(collections=50 if slow else 1, pause_seconds=0.4 if slow else 0.004))


def write(path: Path, slow_windows: set[int], complete: bool = True) -> Path:
    writer = RecordingWriter(path, SCENARIO, 5.0, 1000.0)
    for i in range(20):
        phase = SCENARIO.phase_at(5 * i + 2.5)
        writer.add(LabelledWindow(window(i, i in slow_windows), SCENARIO.phases[phase].label, phase))
    return writer.close(complete=complete)


def run(*argv: str, replay: list[str] | None = None, **kw) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = {"scenarios": [], "replay_files": replay or [], "record": None, "as_json": False, "plot": None,
            "interval": None, "record_only": False}
    args.update(kw)
    code = command.main(**args, out=out, err=err, factory=ThresholdDetector)
    return code, out.getvalue(), err.getvalue()


def test_a_recording_round_trips_and_a_cut_one_stays_partial(tmp_path: Path) -> None:
    whole = write(tmp_path / "a.jsonl.gz", {11, 12})
    rec = read_recording(whole)
    assert rec.scenario == SCENARIO and rec.interval_seconds == 5.0 and len(rec.windows) == 20
    assert [w.label for w in rec.windows].count("gc") == 4 and rec.windows[11].window.gc.collections == 50
    assert rec.header["host"]["cpus"] >= 1 and len(rec.header["host"]["loadavg"]) == 3
    cut = write(tmp_path / "b.jsonl.gz", set(), complete=False)
    assert cut.name == "b.jsonl.gz.part" and not (tmp_path / "b.jsonl.gz").exists()


def test_replay_json_scores_the_detection(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl.gz", {11, 12, 13})
    code, out, err = run(replay=[str(path)], as_json=True)
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["recall"] == 1.0 and result["precision"] == 1.0 and result["attribution_top1"] == 1.0
    assert result["median_delay_windows"] == 1.0 and result["windows_scored"] == 17
    assert result["per_label"]["gc"]["detected"] == 1
    assert result["scenarios"]["synthetic gc"]["false_alarms"] == 0


def test_replay_counts_a_false_alarm_and_a_miss(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl.gz", {5})
    code, out, _ = run(replay=[str(path)], as_json=True)
    result = json.loads(out.strip().splitlines()[-1])
    assert code == 0 and result["recall"] == 0.0 and result["false_alarms"] == 1 and result["precision"] == 0.0


def test_text_table_and_plot(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl.gz", {11, 12})
    png = tmp_path / "eval.png"
    code, out, err = run(replay=[str(path)], plot=str(png))
    assert code == 0, err
    assert "precision 100%" in out and "gc" in out and "detected after 1 windows, top cause gc" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


@pytest.mark.parametrize("content, says", [(b"not gzip", "not a readable gzip"),
                                           (gzip.compress(b'{"format": "other"}\n'), "not an infersight recording"),
                                           (gzip.compress(b""), "empty file")])
def test_a_bad_recording_is_one_line_and_exit_2(tmp_path: Path, content: bytes, says: str) -> None:
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(content)
    code, out, err = run(replay=[str(bad)])
    assert code == 2 and says in err and err.count("\n") == 1 and out == ""
    with pytest.raises(RecordingError):
        read_recording(bad)


def test_bad_argument_combinations_are_one_line(tmp_path: Path) -> None:
    assert run()[0] == 2
    code, _, err = run(replay=["x"], record="y")
    assert code == 2 and "--replay" in err
    code, _, err = run(scenarios=["a.toml"], record_only=True)
    assert code == 2 and "--record-only needs --record" in err
    bad = tmp_path / "s.toml"
    bad.write_text('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="slow"\n')
    code, _, err = run(scenarios=[str(bad)])
    assert code == 2 and "phase[0].label" in err and err.count("\n") == 1


def test_the_cli_parses_eval() -> None:
    from agent.cli import build_parser

    args = build_parser().parse_args(["eval", "--replay", "a.jsonl.gz", "b.jsonl.gz", "--json", "--plot", "p.png"])
    assert args.replay == ["a.jsonl.gz", "b.jsonl.gz"] and args.json and args.plot == "p.png" and args.scenarios == []


def test_a_window_the_server_did_not_answer_is_marked_in_its_outcome_and_survives_the_recording(tmp_path: Path):
    # The plot hatches such windows ("no answer from the server"): a gap in the latency lines is otherwise
    # indistinguishable from a window in which no request finished.
    writer = RecordingWriter(tmp_path / "a.jsonl.gz", SCENARIO, 5.0, 1000.0)
    for i in range(20):
        w = window(i, False)
        if i in (12, 13):
            w = Window(target=w.target, pid=w.pid, start=w.start, end=w.end, unanswered=["latency"],
                       errors={"latency": "latency endpoint http://127.0.0.1:1/metrics unreachable: timed out"})
        phase = SCENARIO.phase_at(5 * i + 2.5)
        writer.add(LabelledWindow(w, SCENARIO.phases[phase].label, phase))
    path = writer.close(complete=True)
    (run_,) = command.replay([path], ThresholdDetector)
    assert [i for i, o in enumerate(run_.outcomes) if o.unanswered] == [12, 13]
    assert run_.outcomes[12].p99 is None
    png = tmp_path / "eval.png"
    code, _, err = run(replay=[str(path)], plot=str(png))
    assert code == 0 and "wrote" in err and png.stat().st_size > 10_000


def test_replay_bursts_table_counts_the_sampler_bursts(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl.gz", {11, 12})
    code, out, err = run(replay=[str(path)], bursts=True)
    assert code == 0, err
    header, row, total = out.splitlines()
    assert header.split()[:4] == ["scenario", "hours", "bursts", "false"]
    # The regression opens on window 11: one burst, from that window through its hold, and it is not false.
    assert row.split()[2:5] == ["1", "0", "0.0"] and total.split()[0] == "total"
    code, _, err = run(scenarios=["a.toml"], record="r.jsonl.gz", record_only=True, bursts=True)
    assert code == 2 and "--bursts" in err


def test_the_cli_parses_eval_bursts() -> None:
    from agent.cli import build_parser

    assert build_parser().parse_args(["eval", "--replay", "a.jsonl.gz", "--bursts"]).bursts is True


def test_a_recorded_culprit_pid_survives_the_recording_and_reaches_the_outcome(tmp_path: Path) -> None:
    writer = RecordingWriter(tmp_path / "c.jsonl.gz", SCENARIO, 5.0, 1000.0)
    for i in range(20):
        phase = SCENARIO.phase_at(5 * i + 2.5)
        label = SCENARIO.phases[phase].label
        writer.add(LabelledWindow(window(i, False), label, phase, culprit=4242 if label != "normal" else None))
    path = writer.close(complete=True)
    rec = read_recording(path)
    assert {w.culprit for w in rec.windows if w.label != "normal"} == {4242}
    assert {w.culprit for w in rec.windows if w.label == "normal"} == {None}
    (run_,) = command.replay([path], ThresholdDetector)
    assert {o.culprit for o in run_.outcomes if o.label != "normal"} == {4242}


def test_several_culprit_pids_survive_the_recording_as_a_tuple(tmp_path: Path) -> None:
    writer = RecordingWriter(tmp_path / "c.jsonl.gz", SCENARIO, 5.0, 1000.0)
    for i in range(20):
        phase = SCENARIO.phase_at(5 * i + 2.5)
        label = SCENARIO.phases[phase].label
        writer.add(LabelledWindow(window(i, False), label, phase, culprit=(41, 42) if label != "normal" else None))
    rec = read_recording(writer.close(complete=True))
    assert {w.culprit for w in rec.windows if w.label != "normal"} == {(41, 42)}
    assert {w.culprit for w in rec.windows if w.label == "normal"} == {None}


@pytest.mark.parametrize("culprit", ["pid 9911", [], [42, "43"], [42, True], -1, True])
def test_a_culprit_that_is_not_a_pid_or_a_list_of_them_is_a_bad_recording(tmp_path: Path, culprit) -> None:
    good = write(tmp_path / "g.jsonl.gz", set())
    lines = gzip.decompress(good.read_bytes()).decode().splitlines()
    row = json.loads(lines[1])
    row["culprit"] = culprit
    bad = tmp_path / "b.jsonl.gz"
    bad.write_bytes(gzip.compress(("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n").encode()))
    with pytest.raises(RecordingError, match="culprit must be a pid"):
        read_recording(bad)


def test_a_culprit_that_is_not_a_pid_is_a_bad_recording(tmp_path: Path) -> None:
    good = write(tmp_path / "g.jsonl.gz", set())
    lines = gzip.decompress(good.read_bytes()).decode().splitlines()
    row = json.loads(lines[1])
    row["culprit"] = "pid 9911"
    bad = tmp_path / "b.jsonl.gz"
    bad.write_bytes(gzip.compress(("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n").encode()))
    with pytest.raises(RecordingError, match="culprit must be a pid"):
        read_recording(bad)


def test_the_named_culprit_is_the_top_neighbour_else_the_top_memory_grower() -> None:
    from agent.evaluation.detection import _top_neighbour
    from analysis.regression import Cause, Grower, Neighbour, Regression

    def regression(*causes: Cause) -> Regression:
        return Regression(id="r", target="t", pid=7, opened_at=0.0, severity="warning", score=5.0, causes=list(causes))

    hog = Cause("cpu_contention", 3.0, "run queue", neighbours=(Neighbour(9911, "python3", 1.2, 0.7),))
    alloc = Cause("memory", 3.0, "memory stall", growers=(Grower(5150, "python3", 200 << 20, 60.0),
                                                          Grower(7, "python", 20 << 20, 60.0, member=True)))
    assert _top_neighbour(regression(hog, alloc)) == 9911
    assert _top_neighbour(regression(alloc, hog)) == 5150  # the memory cause first: who grew, not who ran
    assert _top_neighbour(regression(Cause("gc", 3.0, "gc"), hog)) is None  # only the top cause names a culprit
    assert _top_neighbour(None) is None
