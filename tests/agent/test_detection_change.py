"""Detection with changes: a regression that follows a change is labelled `change` in everything it hands on (store,
listeners, findings), on every re-ranking; `infersight baseline accept` closes it and learns again."""

from __future__ import annotations

from pathlib import Path

from agent.cli import main as cli_main
from agent.detection import Detection
from agent.store import Store
from analysis.change_cause import ChangeNote
from analysis.regression import Cause, Regression
from tests.agent.test_detection import Recorder, ScriptedDetector, window

CHANGE = ChangeNote(id="server-change-1004.000", at=1004.0, diff=("env: OMP_NUM_THREADS=4 → OMP_NUM_THREADS=1",))


class Neighbour(ScriptedDetector):
    def update(self, w):
        v = super().update(w)
        if v.opened is not None:
            self.open = Regression(**{**self.open.__dict__, "causes": [Cause("cpu_contention", 6.0, "a hog")]})
            return type(v)(v.state, v.score, v.expected, self.open, self.open, v.closed)
        return v


def test_labelled_change_everywhere_and_on_every_window(tmp_path: Path):
    with Store.open(tmp_path / "store") as store:
        rec = Recorder()
        detection = Detection(store, make_detector=lambda: ScriptedDetector(close_at=6), listeners=[rec],
                              last_change=lambda target: CHANGE)
        for i in range(6):
            verdict = detection.observe(window(i))
            if verdict.regression is not None:
                assert verdict.regression.top_cause == "change"
                assert detection.snapshot().findings["server"].regression.top_cause == "change"
        stored = store.regressions()[0]
        assert stored.top_cause == "change" and stored.change_id == CHANGE.id and stored.closed_at is not None
        assert "OMP_NUM_THREADS=1" in stored.causes[0].evidence and stored.causes[1].label == "gc"
        assert [e[0] for e in rec.events] == ["opened", "updated", "updated", "closed"]
        assert detection.snapshot().opened == {("server", "change"): 1}


def test_an_outside_cause_keeps_its_name(tmp_path: Path):
    with Store.open(tmp_path / "store") as store:
        detection = Detection(store, make_detector=Neighbour, last_change=lambda target: CHANGE)
        for i in range(4):
            detection.observe(window(i))
        assert store.regressions()[0].top_cause == "cpu_contention"


def test_baseline_accept_closes_the_regression_and_learns_again(tmp_path: Path, capsys):
    path = tmp_path / "store"
    with Store.open(path) as store:
        made: list[ScriptedDetector] = []
        detection = Detection(store, make_detector=lambda: made.append(ScriptedDetector(close_at=99)) or made[-1],
                              last_change=lambda target: CHANGE)
        for i in range(4):
            store.add_window(window(i))
            detection.observe(window(i))
        assert store.regressions(open_only=True)[0].top_cause == "change"
        assert cli_main(["baseline", "accept", "server", "--store", str(path)]) == 0
        assert "server's current build accepted" in capsys.readouterr().out
        detection.observe(window(4))
        assert made[0].resets == 1 and store.regressions(open_only=True) == []
        assert cli_main(["baseline", "accept", "nosuch", "--store", str(path)]) != 0
        assert "no target 'nosuch'" in capsys.readouterr().err


def test_without_an_identity_rule_a_saved_baseline_is_kept_whatever_runs(tmp_path: Path):
    path = tmp_path / "store"
    with Store.open(path) as store:
        old = Detection(store, make_detector=ScriptedDetector, identity=lambda t: "serve --max-batch 8")
        old.observe(window(0))
        old.flush()
    with Store.open(path) as store:
        made: list[ScriptedDetector] = []
        kept = Detection(store, make_detector=lambda: made.append(ScriptedDetector()) or made[-1], identity=None)
        kept.observe(window(1))
        assert made[0].log == ["restored"] and made[0].learned == 2
