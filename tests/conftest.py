"""Suite-wide fixtures: privilege checks that skip with a reason instead of failing obscurely."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _is_root() -> bool:
    return os.geteuid() == 0


@pytest.fixture
def require_root() -> None:
    if not _is_root():
        pytest.skip("needs root: BPF, ptrace and network namespaces are root-only (CI runs as root)")


@pytest.fixture
def require_bpf(require_root) -> None:
    try:
        import bcc  # noqa: F401
    except ImportError as exc:  # make setup links BCC into the venv; missing means setup was skipped
        pytest.fail(f"BCC is not importable in this venv ({exc}); run 'make setup'")


@pytest.fixture
def cc(tmp_path):
    """Compile a small C program; returns a function (source, name) -> path of the binary."""
    if shutil.which("gcc") is None:
        pytest.fail("gcc is missing; 'make setup' installs it")

    def build(source: str, name: str = "prog") -> Path:
        src = tmp_path / f"{name}.c"
        src.write_text(source)
        out = tmp_path / name
        subprocess.run(["gcc", "-O2", "-pthread", "-o", str(out), str(src)], check=True)
        return out

    return build


@pytest.fixture
def python_exe() -> str:
    return sys.executable


SCENARIOS = REPO / "tests" / "scenarios"


def pytest_collection_modifyitems(config, items):
    """Every test under tests/scenarios replays recorded suites (or checks their commands live): marked `replay`,
    so `make check` can leave those minutes out while `make test` runs them."""
    for item in items:
        if SCENARIOS in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.replay)
