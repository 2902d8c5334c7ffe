"""Scenario files: the issue's example parses, every mistake names its key, and the committed suite is complete."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.regression import CAUSE_LABELS
from analysis.scenario import FAULTS, ScenarioError, load_scenario, parse_scenario

SUITE = Path(__file__).resolve().parents[1] / "scenarios"

ISSUE_EXAMPLE = '''
name = "gc churn under steady load"
interval_seconds = 5          # the agent's window for this run (optional)
[load]
rate = 4.0                    # Poisson arrivals per second, the default for every phase
max_tokens = 32               # optional request shape, as `python -m workload load` takes it
[[phase]]
seconds = 240
label = "normal"
[[phase]]
seconds = 90
fault = "gc"                  # one of the workload's fault switches
label = "gc"                  # the expected cause (the table above), or "normal"
[[phase]]
seconds = 120
rate = 6.0                    # a benign load change: the label stays "normal"
label = "normal"
[[phase]]
seconds = 90
run = ["python3", "{scenario_dir}/hog.py", "{seconds}"]   # an outside command, ended with the phase
label = "cpu_contention"
'''


def test_the_issue_example_parses() -> None:
    s = parse_scenario(ISSUE_EXAMPLE, scenario_dir="/suite")
    assert (s.name, s.interval_seconds, s.rate, s.max_tokens) == ("gc churn under steady load", 5.0, 4.0, "32")
    assert [p.label for p in s.phases] == ["normal", "gc", "normal", "cpu_contention"]
    assert s.phases[1].fault == "gc" and s.rate_of(s.phases[2]) == 6.0 and s.rate_of(s.phases[0]) == 4.0
    assert s.seconds == 540
    assert s.bounds() == [(0, 240), (240, 330), (330, 450), (450, 540)]
    assert s.phase_at(239.9) == 0 and s.phase_at(240) == 1 and s.phase_at(539.9) == 3 and s.phase_at(540) is None
    assert s.phases[3].argv(pid=42, port=8000, scenario_dir=s.scenario_dir) == ["python3", "/suite/hog.py", "90"]


def test_placeholders_fill_pid_and_port() -> None:
    s = parse_scenario('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=2.5\nlabel="blocked"\n'
                       'run=["kill", "-STOP", "{pid}", "--port={port}", "{seconds}"]\n')
    assert s.phases[0].argv(7, 9000, ".") == ["kill", "-STOP", "7", "--port=9000", "2.5"]


@pytest.mark.parametrize("text, key", [
    ('name="x"\ncolour=1\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"', "colour"),
    ('name="x"\n[load]\nrate=1\nburst=2\n[[phase]]\nseconds=1\nlabel="normal"', "load.burst"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"\nfualt="gc"', "phase[0].fualt"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="gc"\nfault="gcc"', "phase[0].fault"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"\n[[phase]]\nseconds=1\nlabel="slow"',
     "phase[1].label"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="blocked"\nrun=["x", "{ppid}"]', "phase[0].run"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="blocked"\nrun=[]', "phase[0].run"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nlabel="normal"', "phase[0].seconds"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=0\nlabel="normal"', "phase[0].seconds"),
    ('name="x"\n[load]\nrate="4"\n[[phase]]\nseconds=1\nlabel="normal"', "load.rate"),
    ('name="x"\n[load]\n[[phase]]\nseconds=1\nlabel="normal"', "load.rate"),
    ('name="x"\n[load]\nrate=1\nmax_tokens="9-3"\n[[phase]]\nseconds=1\nlabel="normal"', "load.max_tokens"),
    ('name="x"\ninterval_seconds=0\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"', "interval_seconds"),
    ('name=""\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"', "name"),
    ('name="x"\n[load]\nrate=1', "phase"),
    ('name="x"\n[[phase]]\nseconds=1\nlabel="normal"', "load"),
    ('name = "x', "TOML"),
    ('name="x"\n[server]\nargs="--engine-process"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"',
     "server.args"),
    ('name="x"\n[server]\nargv=[]\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"', "server.argv"),
    ('name="x"\n[server]\nargs=["--port=9"]\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"',
     "server.args: '--port=9' is set by the scenario runner"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="memory"\nculprit=true', "phase[0].culprit"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="memory"\nrun=["x"]\nculprit="yes"',
     "phase[0].culprit"),
    # A fault that starts no process of its own has no culprit to record; one that does, beside a command, is
    # ambiguous.
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="gc"\nfault="gc"\nculprit=true', "phase[0].culprit"),
    ('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="cpu_contention"\nfault="cpuhog"\nrun=["x"]\n'
     'culprit=true', "phase[0].culprit: the phase both runs a command and starts the cpuhog"),
])
def test_every_mistake_names_its_key(text: str, key: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text)
    assert key in str(err.value), str(err.value)


def test_server_args_parse_and_survive_a_round_trip() -> None:
    s = parse_scenario('name="x"\n[server]\nargs=["--engine-process", "--max-batch", "4"]\n[load]\nrate=1\n'
                       '[[phase]]\nseconds=1\nlabel="normal"')
    assert s.server_args == ("--engine-process", "--max-batch", "4")
    assert type(s).from_dict(s.to_dict()) == s
    assert parse_scenario('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"').server_args == ()


def test_a_culprit_phase_names_its_command_and_survives_a_round_trip() -> None:
    s = parse_scenario('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"\n[[phase]]\nseconds=1\n'
                       'label="memory"\nrun=["python3", "a.py"]\nculprit=true')
    assert [p.culprit for p in s.phases] == [False, True]
    assert type(s).from_dict(s.to_dict()) == s


def test_a_cpuhog_phase_may_name_the_fault_s_own_processes_its_culprit() -> None:
    s = parse_scenario('name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="normal"\n[[phase]]\nseconds=1\n'
                       'label="cpu_contention"\nfault="cpuhog"\nculprit=true')
    assert [(p.fault, p.run, p.culprit) for p in s.phases] == [(None, None, False), ("cpuhog", None, True)]
    assert type(s).from_dict(s.to_dict()) == s


def test_the_suite_s_cpuhog_scenario_records_its_spinners_as_the_culprit() -> None:
    from analysis.scenario import load_scenario

    s = load_scenario(Path(__file__).resolve().parents[1] / "scenarios" / "cpuhog.toml")
    assert [(p.fault, p.culprit) for p in s.phases if p.label != "normal"] == [("cpuhog", True)]


def test_a_missing_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "nope.toml")


def test_labels_are_the_cause_labels_plus_normal() -> None:
    for label in (*CAUSE_LABELS, "normal"):
        parse_scenario(f'name="x"\n[load]\nrate=1\n[[phase]]\nseconds=1\nlabel="{label}"')


def test_the_committed_suite_covers_every_switch_and_arms_the_detector_in_its_first_phase() -> None:
    scenarios = [load_scenario(p) for p in sorted(SUITE.glob("*.toml"))]
    assert scenarios
    for s in scenarios:
        assert s.phases[0].label == "normal" and s.phases[0].seconds >= 240, s.name
        for p in s.phases:
            if p.run:
                script = Path(p.argv(1, 1, s.scenario_dir)[1])
                assert script.is_file(), (s.name, script)
    faults = {p.fault for s in scenarios for p in s.phases if p.fault}
    assert faults == set(FAULTS)
    outside = {p.label for s in scenarios for p in s.phases if p.run}
    assert {"cpu_contention", "blocked", "network"} <= outside
    rates = {s.rate_of(p) / s.rate for s in scenarios for p in s.phases if p.label == "normal"}
    assert {1.5, 0.5} <= rates  # the benign +50% and -50% load steps
    normal = sum(p.seconds for s in scenarios for p in s.phases if p.label == "normal")
    assert normal >= 3600, normal


def test_server_children_is_a_boolean_off_by_default(tmp_path):
    from analysis.scenario import ScenarioError, load_scenario

    base = 'name = "x"\n[load]\nrate = 1.0\n[[phase]]\nseconds = 10\nlabel = "normal"\n'
    plain = tmp_path / "plain.toml"
    plain.write_text(base)
    assert load_scenario(plain).server_children is False
    family = tmp_path / "family.toml"
    family.write_text(base + '[server]\nargs = ["--engine-process"]\nchildren = true\n')
    loaded = load_scenario(family)
    assert loaded.server_children is True and type(loaded).from_dict(loaded.to_dict()).server_children is True
    bad = tmp_path / "bad.toml"
    bad.write_text(base + '[server]\nchildren = "yes"\n')
    with pytest.raises(ScenarioError, match="server.children: must be true or false"):
        load_scenario(bad)
