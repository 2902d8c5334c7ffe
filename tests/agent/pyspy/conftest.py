"""Fixtures of the py-spy tests: the target process (support.TARGET) and samplers closed at the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from agent.sources.pyspy import PySpySampler
from tests.agent.pyspy.support import TARGET


@pytest.fixture
def target(tmp_path: Path):
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def sampler_factory():
    made: list[PySpySampler] = []

    def make(pid: int, **kw) -> PySpySampler:
        s = PySpySampler(pid, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()
