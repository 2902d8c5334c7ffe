"""No import goes from a lower layer to a higher one (docs/architecture.md), checked over every module's AST."""

import ast
import configparser
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = {"agent", "analysis", "benchmarks", "dashboards", "probes", "workload"}
# Package -> the packages of ours it may import (its own is always allowed).
ALLOWED = {
    "analysis": set(),
    "probes": {"analysis"},
    "workload": set(),
    "dashboards": {"analysis"},
    # The benchmarks measure the agent from outside: they start it as a process and never import it.
    "benchmarks": {"workload"},
    "agent": {"analysis", "probes", "dashboards", "benchmarks", "workload"},
}
# Of the workload, the agent takes only two leaves that import nothing of ours: the completions stream's wire
# format (its load test is a client too), and the secret-file helper (the demo writes the token file the workload
# reads; the alert secrets are read with the same checks).
WORKLOAD_FOR_AGENT = {"workload.sse", "workload.secretfile"}
# Of the agent, only the `infersight bench` subcommand reaches the benchmarks.
BENCH_COMMAND = "agent/bench_cmd.py"
# Collectors take only the records from analysis/, never its models or flame graph code.
# The records, and redaction: a collector hides credentials in what it reports (URLs, command lines) at the source.
RECORDS = {"analysis.window", "analysis.health", "analysis.errors", "analysis.redact"}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, including those inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_reaches_up(package):
    wrong = []
    for path in modules(package):
        for line, name in imports_of(path):
            top = name.split(".")[0]
            if top in OURS and top != package and top not in ALLOWED[package]:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_only_the_bench_command_imports_the_benchmarks():
    wrong = []
    for path in modules("agent"):
        for line, name in imports_of(path):
            if name.split(".")[0] == "benchmarks" and path.relative_to(REPO).as_posix() != BENCH_COMMAND:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)
    assert any(n.startswith("benchmarks") for _, n in imports_of(REPO / BENCH_COMMAND))


def test_the_agent_takes_only_the_leaves_it_shares_with_the_workload():
    wrong, used = [], set()
    for path in modules("agent"):
        for line, name in imports_of(path):
            if name.split(".")[0] == "workload":
                used.add(name)
                if name not in WORKLOAD_FOR_AGENT:
                    wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)
    assert used == WORKLOAD_FOR_AGENT
    # The leaves stay leaves: they import nothing of ours, so the workload is still a separate program.
    for leaf in WORKLOAD_FOR_AGENT:
        path = REPO / (leaf.replace(".", "/") + ".py")
        assert not [n for _, n in imports_of(path) if n.split(".")[0] in OURS], leaf


def test_every_installed_package_has_a_layer():
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    installed = {name.split(".")[0] for name in setup["options.packages.find"]["include"].split()}
    assert installed == OURS == set(ALLOWED)


@pytest.mark.parametrize("folder", ["probes", "agent/sources"])
def test_collectors_take_only_the_records_from_analysis(folder):
    wrong = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for line, name in imports_of(path):
            if name.split(".")[0] == "analysis" and name not in RECORDS:
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from agent.state import AgentState\n    import dashboards.view\n")
    assert [n for _, n in imports_of(bad)] == ["agent.state", "dashboards.view"]
