"""Detection: findings stored and passed on, baselines kept across restarts, reset on request or a new model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agent.cli import main as cli_main
from agent.detection import Detection
from agent.detection_metrics import DetectionCollector
from agent.store import Store
from analysis.regression import Cause, Regression
from analysis.window import LatencyReading, Window


@dataclass(frozen=True)
class Verdict:
    state: str
    score: float | None
    expected: dict[str, float]
    regression: Regression | None
    opened: Regression | None = None
    closed: Regression | None = None


@dataclass
class ScriptedDetector:
    """Stands in for the statistics (tested on their own in tests/analysis): opens at a window number it is
    told, closes at another, and counts what it learned so a restore can be seen."""

    open_at: int = 3
    close_at: int = 6
    split_at: int | None = None  # the open regression ends and a syscalls one begins on this window
    learned: int = 0
    resets: int = 0
    open: Regression | None = None
    log: list[str] = field(default_factory=list)

    def update(self, w: Window) -> Verdict:
        self.learned += 1
        opened = closed = None
        if self.learned == self.open_at:
            self.open = opened = Regression(
                id=f"{w.target}-{int(w.end)}", target=w.target, pid=w.pid, opened_at=w.end, severity="critical",
                score=9.0, causes=[Cause("gc", 5.0, "GC pause 41 ms/s vs 0.8 ms/s baseline (x51)", 0.041, 0.0008)])
        elif self.learned == self.split_at and self.open is not None:
            closed = Regression(**{**self.open.__dict__, "closed_at": w.start})
            self.open = opened = Regression(
                id=f"{w.target}-{int(w.end)}", target=w.target, pid=w.pid, opened_at=w.end, severity="warning",
                score=6.0, causes=[Cause("syscalls", 4.0, "syscalls per request x20", 8000.0, 400.0)])
        elif self.learned == self.close_at and self.open is not None:
            closed = Regression(**{**self.open.__dict__, "closed_at": w.end})
            self.open = None
        state = "warmup" if self.learned < 2 else ("regression" if self.open else "healthy")
        return Verdict(state=state, score=None if state == "warmup" else float(self.learned),
                       expected={} if state == "warmup" else {"p50": 0.1, "p99": 0.4},
                       regression=self.open, opened=opened, closed=closed)

    def interrupt(self, at: float) -> Regression | None:
        closed = Regression(**{**self.open.__dict__, "closed_at": at}) if self.open else None
        self.open = None
        self.log.append("interrupted")
        return closed

    def get_state(self) -> dict:
        return {"learned": self.learned, "open": self.open.id if self.open else None}

    def set_state(self, state: dict) -> None:
        self.log.append("restored")
        self.learned = state["learned"]

    def reset(self) -> None:
        self.resets += 1
        self.learned = 0
        self.open = None


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def regression_opened(self, r: Regression) -> None:
        self.events.append(("opened", r.id))

    def regression_updated(self, r: Regression) -> None:
        self.events.append(("updated", r.id))

    def regression_closed(self, r: Regression) -> None:
        self.events.append(("closed", r.id))


def window(i: int, target: str = "server") -> Window:
    return Window(target=target, pid=42, start=1000.0 + 5 * i, end=1005.0 + 5 * i,
                  latency=LatencyReading(p50_seconds=0.1, requests=10, request_rate=2.0))


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(tmp_path / "store") as s:
        yield s


def _registry(detection: Detection) -> CollectorRegistry:
    """A registry that exposes `detection` as /metrics does."""
    registry = CollectorRegistry()
    registry.register(DetectionCollector(detection.snapshot))
    return registry


def test_episode_is_stored_passed_on_and_exposed(store):
    made: list[ScriptedDetector] = []
    rec = Recorder()
    detection = Detection(store, make_detector=lambda: made.append(ScriptedDetector()) or made[-1],
                          listeners=[rec])
    for i in range(4):
        store.add_window(window(i))
        detection.observe(window(i))
    assert rec.events == [("opened", "server-1015"), ("updated", "server-1015")]
    [stored] = store.regressions(open_only=True)
    assert stored.id == "server-1015" and stored.top_cause == "gc" and stored.closed_at is None

    registry = _registry(detection)
    text = generate_latest(registry).decode()
    assert 'infersight_regression_active{target="server"} 1.0' in text
    assert 'infersight_regression_score{target="server"} 4.0' in text
    assert 'infersight_latency_expected_seconds{percentile="p99",target="server"} 0.4' in text
    assert 'infersight_regressions_total{cause="gc",target="server"} 1.0' in text

    for i in range(4, 6):
        detection.observe(window(i))
    assert rec.events[-1] == ("closed", "server-1015")
    assert store.regressions(open_only=True) == []
    assert store.regression("server-1015").closed_at == 1030.0
    assert 'infersight_regression_active{target="server"} 0.0' in generate_latest(registry).decode()


def test_a_window_that_ends_one_regression_and_begins_the_next_stores_both_and_tells_the_end_first(store):
    rec = Recorder()
    detection = Detection(store, make_detector=lambda: ScriptedDetector(split_at=5, close_at=8), listeners=[rec])
    for i in range(5):
        detection.observe(window(i))
    assert rec.events[-2:] == [("closed", "server-1015"), ("opened", "server-1025")]
    [old, new] = sorted(store.regressions(), key=lambda r: r.opened_at)
    assert (old.id, old.top_cause, old.closed_at) == ("server-1015", "gc", 1020.0)
    assert (new.id, new.top_cause, new.closed_at) == ("server-1025", "syscalls", None)
    registry = _registry(detection)
    text = generate_latest(registry).decode()
    assert 'infersight_regression_active{target="server"} 1.0' in text
    assert 'infersight_regressions_total{cause="gc",target="server"} 1.0' in text
    assert 'infersight_regressions_total{cause="syscalls",target="server"} 1.0' in text


def test_restart_restores_the_baseline_and_keeps_the_episode_open(tmp_path: Path):
    path = tmp_path / "store"
    with Store.open(path) as store:
        detection = Detection(store, make_detector=ScriptedDetector, identity=lambda t: "python -m workload serve")
        for i in range(4):
            detection.observe(window(i))
    with Store.open(path) as store:
        made: list[ScriptedDetector] = []
        detection = Detection(store, make_detector=lambda: made.append(ScriptedDetector()) or made[-1],
                              identity=lambda t: "python -m workload serve")
        detection.observe(window(4))
        assert made[0].log == ["restored"] and made[0].learned == 5  # no second warm-up
        assert [r.id for r in store.regressions(open_only=True)] == ["server-1015"]


def test_a_new_served_program_drops_the_saved_baseline(tmp_path: Path):
    path = tmp_path / "store"
    with Store.open(path) as store:
        first = Detection(store, make_detector=ScriptedDetector, identity=lambda t: "serve --model a")
        first.observe(window(0))
        first.flush()
    with Store.open(path) as store:
        made: list[ScriptedDetector] = []
        detection = Detection(store, make_detector=lambda: made.append(ScriptedDetector()) or made[-1],
                              identity=lambda t: "serve --model b")
        detection.observe(window(1))
        assert made[0].log == [] and made[0].learned == 1
        assert store.detector_state("server") is None  # the old model's baseline is gone at once
        detection.flush()
        assert store.detector_state("server")[0] == "serve --model b"


def test_baseline_reset_from_the_cli_reaches_the_running_detector_and_closes_the_episode(tmp_path: Path, capsys):
    path = tmp_path / "store"
    with Store.open(path) as store:
        made: list[ScriptedDetector] = []
        rec = Recorder()
        detection = Detection(store, make_detector=lambda: made.append(ScriptedDetector(close_at=99)) or made[-1],
                              listeners=[rec])
        for i in range(4):
            store.add_window(window(i))
            detection.observe(window(i))
        assert store.regressions(open_only=True)

        assert cli_main(["baseline", "reset", "server", "--store", str(path)]) == 0
        assert "baseline of server reset" in capsys.readouterr().out
        detection.observe(window(4))
        assert made[0].resets == 1 and made[0].learned == 1
        assert ("closed", "server-1015") in rec.events
        assert store.regressions(open_only=True) == []
        assert store.take_baseline_resets() == []  # consumed once


def test_cli_lists_regressions_as_text_and_json(tmp_path: Path, capsys):
    path = tmp_path / "store"
    with Store.open(path) as store:
        detection = Detection(store, make_detector=ScriptedDetector)
        for i in range(4):
            store.add_window(window(i))
            detection.observe(window(i))
    assert cli_main(["regressions", "--store", str(path)]) == 0
    out = capsys.readouterr().out
    assert "server" in out and "critical" in out and "GC pause 41 ms/s vs 0.8 ms/s baseline (x51)" in out
    assert cli_main(["regressions", "--store", str(path), "--json"]) == 0
    [line] = capsys.readouterr().out.splitlines()
    assert json.loads(line)["causes"][0]["label"] == "gc"


def test_cli_refuses_unknown_target_and_missing_store_in_one_line(tmp_path: Path, capsys):
    path = tmp_path / "store"
    with Store.open(path):
        pass
    assert cli_main(["baseline", "reset", "nosuch", "--store", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no target 'nosuch' in the store" in err
    assert cli_main(["regressions", "--store", str(tmp_path / "absent")]) == 2
    assert "no store at" in capsys.readouterr().err


def test_healthy_baselines_are_saved_every_n_windows_and_flushed_at_shutdown(store):
    detection = Detection(store, make_detector=lambda: ScriptedDetector(open_at=99), save_every=3)
    for i in range(2):
        detection.observe(window(i))
    assert store.detector_state("server") is None
    detection.observe(window(2))
    assert store.detector_state("server")[1]["learned"] == 3
    detection.observe(window(3))
    assert store.detector_state("server")[1]["learned"] == 3
    detection.flush()
    assert store.detector_state("server")[1]["learned"] == 4


def test_agent_restart_mid_run_with_the_real_detector_changes_nothing(tmp_path: Path):
    """Real windows (tests/analysis/fixtures), the real detector: stopping the agent while a regression is open
    and starting it again on the same store gives the verdicts an uninterrupted run gives, with no new warm-up."""
    from analysis.detector import LatencyDetector
    from tests.analysis.test_detector_replay import load

    windows, _ = load()
    straight = Detection(Store.open(tmp_path / "a"), make_detector=lambda: LatencyDetector(warmup_windows=6))
    expected = [(v.state, v.regression and v.regression.id) for v in map(straight.observe, windows)]
    cut = next(i for i, (state, _) in enumerate(expected) if state == "regression") + 2

    path = tmp_path / "b"
    got = []
    for part in (windows[:cut], windows[cut:]):
        with Store.open(path) as store:
            detection = Detection(store, make_detector=lambda: LatencyDetector(warmup_windows=6))
            got += [(v.state, v.regression and v.regression.id) for v in map(detection.observe, part)]
            detection.flush()
    assert got == expected
    assert got[cut][0] == "regression" and "warmup" not in [s for s, _ in got[cut:]]


def test_forgetting_a_per_process_target_ends_its_episode_and_drops_its_baseline(store):
    rec = Recorder()
    detection = Detection(store, make_detector=lambda: ScriptedDetector(close_at=99), listeners=[rec],
                          save_every=1)
    registry = _registry(detection)
    for i in range(4):
        detection.observe(window(i, target="py#42"))
        detection.observe(window(i, target="server"))
    assert store.detector_state("py#42") is not None and store.regressions(target="py#42", open_only=True)
    detection.forget("py#42")
    text = generate_latest(registry).decode()
    assert "py#42" not in text and 'infersight_regression_active{target="server"} 1.0' in text
    assert ("closed", "py#42-1015") in rec.events, "an episode of a process gone for good must end"
    assert store.regression("py#42-1015").closed_at == 1020.0 and store.detector_state("py#42") is None
    assert set(detection._tracked) == {"server"} and set(detection.snapshot().opened) == {("server", "gc")}


def test_forgetting_a_plain_target_saves_its_baseline_for_its_return(store):
    made: list[ScriptedDetector] = []
    rec = Recorder()
    detection = Detection(store, make_detector=lambda: made.append(ScriptedDetector(close_at=99)) or made[-1],
                          listeners=[rec], save_every=100)
    for i in range(4):
        detection.observe(window(i))
    detection.forget("server")
    assert detection.snapshot().findings == {} and detection._tracked == {}
    assert store.detector_state("server")[1]["learned"] == 4, "unsaved learning was lost"
    assert store.regressions(open_only=True) and ("closed", "server-1015") not in rec.events
    detection.observe(window(4))  # a restarted server resumes, as after an agent restart
    assert made[-1].log == ["restored"] and made[-1].learned == 5


def silent(i: int, target: str = "server") -> Window:
    """A window of a process that does not answer its latency endpoint (starting up, or stuck)."""
    return Window(target=target, pid=43, start=1000.0 + 5 * i, end=1005.0 + 5 * i,
                  errors={"latency": "latency endpoint http://127.0.0.1:8000/metrics unreachable: refused"})


def test_a_server_that_dies_is_an_incident_closed_when_it_answers_again_on_the_same_baseline(store):
    made: list[ScriptedDetector] = []
    rec = Recorder()
    detection = Detection(store, make_detector=lambda: made.append(ScriptedDetector(close_at=99)) or made[-1],
                          listeners=[rec])
    for i in range(4):
        detection.observe(window(i))
    assert rec.events[-1] == ("updated", "server-1015")

    down = detection.target_down("server", 42, 1021.0, "killed by SIGKILL (signal 9) from pid 77 (bash)")
    assert down is not None and detection.target_down("server", 42, 1022.0, "again") is None, "one episode per outage"
    # The latency episode under way ends where the process did; the outage is its own incident, told after.
    assert rec.events[-2:] == [("closed", "server-1015"), ("opened", down.id)]
    assert store.regression("server-1015").closed_at == 1021.0
    assert (down.severity, down.top_cause, down.closed_at) == ("critical", "down", None)
    assert down.causes[0].evidence == "pid 42 killed by SIGKILL (signal 9) from pid 77 (bash)"
    detection.forget("server")  # the loop drops the process's detector from memory; the finding stays
    finding = detection.snapshot().findings["server"]
    assert finding.state == "down" and finding.regression == down and finding.armed
    text = generate_latest(_registry(detection)).decode()
    assert 'infersight_regression_active{target="server"} 1.0' in text
    assert 'infersight_regressions_total{cause="down",target="server"} 1.0' in text
    assert 'infersight_detector_armed{target="server"} 1.0' in text

    # A new process that does not serve yet: still down, and its silence teaches the detector nothing.
    detection.observe(silent(5))
    assert detection.snapshot().findings["server"].state == "down" and len(made) == 1
    detection.observe(window(6))
    assert rec.events[-1] == ("closed", down.id)
    assert store.regression(down.id).closed_at == window(6).start
    assert detection.snapshot().findings["server"].state == "healthy"
    # The baseline came back from the store: no second warm-up.
    assert made[-1].log == ["restored"] and made[-1].learned == 5


def test_an_agent_restarted_during_an_outage_still_reports_it(tmp_path: Path):
    path = tmp_path / "store"
    with Store.open(path) as store:
        detection = Detection(store, make_detector=ScriptedDetector)
        detection.observe(window(0))
        detection.target_down("server", 42, 1010.0, "exited with status 1")
    with Store.open(path) as store:
        detection = Detection(store, make_detector=ScriptedDetector)
        finding = detection.snapshot().findings["server"]
        assert finding.state == "down" and finding.regression.causes[0].evidence == "pid 42 exited with status 1"
        detection.observe(window(3))
        assert store.regressions(open_only=True) == []


def test_a_baseline_reset_during_an_outage_leaves_the_outage_open(tmp_path: Path):
    path = tmp_path / "store"
    with Store.open(path) as store:
        detection = Detection(store, make_detector=ScriptedDetector)
        detection.observe(window(0))
        detection.target_down("server", 42, 1010.0, "exited with status 1")
        store.request_baseline_reset("server")
        detection.observe(silent(3))
        assert [r.top_cause for r in store.regressions(open_only=True)] == ["down"]
        assert detection.snapshot().findings["server"].state == "down"


def closed(i: int, pid: int = 42, target: str = "server") -> Window:
    """A window whose latency port has no listening socket at all (the server closed it)."""
    return Window(target=target, pid=pid, start=1000.0 + 5 * i, end=1005.0 + 5 * i, unanswered=["latency"],
                  unreachable=["latency"], closed=["latency"],
                  errors={"latency": "latency endpoint http://127.0.0.1:8000/metrics unreachable: [Errno 111] "
                                     "Connection refused; nothing listens on port 8000"})


def test_a_server_that_closes_its_port_is_down_after_closed_windows_and_back_when_it_answers(store):
    rec = Recorder()
    made: list[ScriptedDetector] = []
    detection = Detection(store, make_detector=lambda: made.append(ScriptedDetector(open_at=99)) or made[-1],
                          listeners=[rec], closed_windows=2)
    for i in range(3):
        detection.observe(window(i))
    detection.observe(closed(3))
    assert not detection.is_down("server"), "one closed window is not yet an outage"
    detection.observe(closed(4))
    assert detection.is_down("server")
    [down] = store.regressions(open_only=True)
    assert down.top_cause == "down" and down.opened_at == closed(4).end
    assert down.causes[0].evidence.startswith("pid 42 is alive but serves no one: nothing listens on its latency "
                                              "port for 2 windows (latency endpoint")
    learned = made[0].learned
    detection.observe(closed(5))
    assert made[0].learned == learned, "an outage's windows teach the detector nothing"
    detection.observe(window(6))
    assert not detection.is_down("server") and rec.events[-1] == ("closed", down.id)


def test_a_process_that_never_answered_is_starting_not_down(store):
    detection = Detection(store, make_detector=ScriptedDetector, closed_windows=2)
    detection.observe(window(0))
    for i in range(1, 6):
        detection.observe(closed(i, pid=43))  # a new process, still loading its model: its port not open yet
    assert not detection.is_down("server") and store.regressions(open_only=True) == []
    with pytest.raises(ValueError, match="closed_windows"):
        Detection(store, make_detector=ScriptedDetector, closed_windows=0)
