"""No import goes from a lower layer to a higher one (docs/architecture.md), checked over every module's AST."""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OURS = {"agent", "analysis", "dashboards", "probes", "workload"}
# Package -> the packages of ours it may import (its own is always allowed).
ALLOWED = {
    "analysis": set(),
    "probes": {"analysis"},
    "workload": set(),
    "dashboards": {"analysis"},
    "agent": {"analysis", "probes", "dashboards"},
}
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
