"""The suite's fault scenarios with `[server] args = ["--engine-process"]`, and the engine killed mid-run: each file
parses, its server arguments reach the server's command line, the server starts in vLLM's shape, each phase's fault
switches in the engine process, and the kill command ends one engine and sees the next. (Not recorded yet: scoring
them needs family targets in the agent.)"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from agent.evaluation import processes
from analysis.scenario import FAULTS, load_scenario
from workload.client import debug

pytestmark = pytest.mark.workload
HERE = Path(__file__).resolve().parent
SUITE = HERE.parents[1]
FILES = sorted(HERE.glob("*.toml"))
TITLE = b"infersight::EngineCore"


def engine_children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()
            if Path(f"/proc/{c}/cmdline").read_bytes().startswith(TITLE)]


def test_every_suite_fault_has_its_engine_process_variant() -> None:
    scenarios = {p.stem: load_scenario(p) for p in FILES}
    assert set(scenarios) == {*FAULTS, "engine_restart"}
    for fault in FAULTS:
        suite = load_scenario(SUITE / f"{fault}.toml")
        variant = scenarios[fault]
        assert variant.phases == suite.phases and variant.rate == suite.rate, fault
        assert (suite.server_args, variant.server_args) == ((), ("--engine-process",))
    assert not {p.name for p in FILES} - {"engine_restart.toml"} - {p.name for p in SUITE.glob("*.toml")}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_server_starts_with_the_scenario_arguments(path: Path, tmp_path: Path) -> None:
    scenario = load_scenario(path)
    children = processes.Children()
    try:
        server = processes.start_server(children, cwd=tmp_path, args=scenario.server_args)
        cmdline = Path(f"/proc/{server.pid}/cmdline").read_bytes().split(b"\0")
        assert b"--engine-process" in cmdline
        engines = engine_children(server.pid)
        assert len(engines) == 1, engines
        for phase in scenario.phases:
            if phase.fault:
                processes.set_fault(server, phase.fault, True)
                state = debug(server.url, server.token)
                assert state["faults"]["engine"][phase.fault] and not state["faults"]["api"][phase.fault]
                processes.set_fault(server, phase.fault, False)
            if phase.run:
                argv = phase.argv(server.pid, server.port, scenario.scenario_dir)
                done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False)
                assert done.returncode == 0, done.stderr
                deadline = time.monotonic() + 60
                while engine_children(server.pid) == engines and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert engine_children(server.pid) not in ([], engines)
    finally:
        children.stop_all()
