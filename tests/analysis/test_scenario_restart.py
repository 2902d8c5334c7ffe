"""The `restart` phase key (docs/evaluation.md): the server restarted with other arguments or environment; every
mistake is one error naming its key, and what parses survives a recording's round trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.scenario import Restart, Scenario, ScenarioError, load_scenario, parse_scenario

CHANGES = Path(__file__).resolve().parents[1] / "scenarios" / "changes"

HEAD = 'name = "x"\n[load]\nrate = 2\n[[phase]]\nseconds = 60\nlabel = "normal"\n[[phase]]\nseconds = 60\n'


def test_the_brief_example_parses_and_round_trips() -> None:
    s = parse_scenario(HEAD + 'label = "change"\n'
                       'restart = { args = ["--max-batch", "1"], env = { OMP_NUM_THREADS = "1" } }\n')
    assert s.phases[1].restart == Restart(args=("--max-batch", "1"), env=(("OMP_NUM_THREADS", "1"),))
    assert s.phases[0].restart is None and s.restarts
    assert Scenario.from_dict(s.to_dict()) == s


def test_an_empty_restart_keeps_the_arguments_and_no_restart_means_no_fixed_port() -> None:
    s = parse_scenario(HEAD + 'label = "normal"\nrestart = {}\n')
    assert s.phases[1].restart == Restart(args=None, env=()) and s.restarts
    assert Scenario.from_dict(s.to_dict()) == s
    assert not parse_scenario(HEAD + 'label = "normal"\n').restarts


@pytest.mark.parametrize(("restart", "says"), [
    ('restart = { argv = ["--no-cache"] }', "phase[1].restart.argv: unknown key (known: args, env)"),
    ('restart = "--no-cache"', "phase[1].restart: must be a table"),
    ('restart = { args = "--no-cache" }', "phase[1].restart.args: must be a list of non-empty strings"),
    ('restart = { args = ["--no-cache", ""] }', "phase[1].restart.args: must be a list of non-empty strings"),
    ('restart = { args = [1] }', "phase[1].restart.args: must be a list of non-empty strings"),
    ('restart = { args = ["--port", "80"] }', "phase[1].restart.args: '--port' is set by the scenario runner"),
    ('restart = { args = ["--admin-token=x"] }', "is set by the scenario runner itself"),
    ('restart = { env = ["OMP_NUM_THREADS=1"] }', "phase[1].restart.env: must be a table"),
    ('restart = { env = { "OMP NUM" = "1" } }', "phase[1].restart.env: 'OMP NUM' is not a variable name"),
    ('restart = { env = { OMP_NUM_THREADS = 1 } }', "phase[1].restart.env.OMP_NUM_THREADS: must be a string"),
    ('restart = { env = { WORKLOAD_ADMIN_TOKEN = "t" } }', "WORKLOAD_ADMIN_TOKEN is set by the scenario runner"),
    ('restart = {}\nfault = "gc"', "phase[1].restart: a phase that restarts the server cannot also set a fault"),
    ('restart = {}\nrun = ["true"]', "cannot also set a fault or run a command"),
])
def test_every_restart_mistake_is_one_error_naming_its_key(restart: str, says: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(HEAD + f'label = "normal"\n{restart}\n')
    assert says in str(err.value) and "\n" not in str(err.value)


def test_the_committed_change_suite_parses_and_restarts_after_its_first_phase() -> None:
    scenarios = {p.stem: load_scenario(p) for p in sorted(CHANGES.glob("*.toml"))}
    assert set(scenarios) == {"deploys"}
    phases = scenarios["deploys"].phases
    # The detector arms after 24 windows (2 min at 5 s): the first phase leaves armed healthy windows before any
    # restart, and each restart's phase the 12 windows the before/after report needs.
    assert scenarios["deploys"].interval_seconds == 5 and phases[0].seconds >= 150 and phases[0].restart is None
    assert all(p.seconds >= 90 for p in phases[1:])
    assert [p.label for p in phases] == ["normal", "normal", "normal", "change", "normal", "change"]
    assert [p.restart for p in phases[1:]] == [Restart(), Restart(env=(("OMP_NUM_THREADS", "2"),)),
                                               Restart(args=("--batch-window-ms", "300")), Restart(args=()),
                                               Restart(args=("--no-cache",))]
