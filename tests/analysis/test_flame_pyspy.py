"""Real py-spy output from a real target with a function named <script>…</script>, through every export."""

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from analysis.flamegraph.diff import diff, render_diff_svg
from analysis.flamegraph.folded import format_folded, parse_folded
from analysis.flamegraph.pprof import to_pprof
from analysis.flamegraph.speedscope import to_speedscope
from analysis.flamegraph.svg import Style, render_svg

EVIL = "<script>alert(1)</script>"

TARGET = f"""
import time
def spin(n):
    x = 0
    for i in range(n):
        x += i
    return x
def evil():
    end = time.monotonic() + 0.02
    while time.monotonic() < end:
        spin(1000)
# The name comes from the target's code object, as any name py-spy reports does.
evil.__code__ = evil.__code__.replace(co_name={EVIL!r}, co_qualname={EVIL!r})
def main():
    end = time.monotonic() + 4
    while time.monotonic() < end:
        evil()
main()
"""


@pytest.fixture
def pyspy_folded(require_root, tmp_path) -> tuple[str, int]:
    """py-spy's raw (folded) output for 2 s of the target, and the sample count py-spy reports."""
    pyspy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if pyspy is None:
        pytest.fail("py-spy is missing from the venv; it is an install requirement (py-spy==0.4.3)")
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    out = tmp_path / "raw.txt"
    proc = subprocess.run([pyspy, "record", "-f", "raw", "-r", "100", "-d", "2", "-o", str(out), "--",
                           sys.executable, "-S", str(script)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    reported = re.search(r"Samples: (\d+)", proc.stdout + proc.stderr)
    assert reported, proc.stdout + proc.stderr
    return out.read_text(), int(reported.group(1))


@pytest.mark.root
def test_real_pyspy_profile_survives_every_export(pyspy_folded, tmp_path):
    text, reported = pyspy_folded
    prof = parse_folded(text)
    assert prof.total() == reported > 50
    evil_frames = [f for stack in prof.stacks for f in stack if f.startswith(EVIL)]
    assert evil_frames, format_folded(prof)[:2000]

    assert parse_folded(format_folded(prof)).stacks == prof.stacks

    svg = render_svg(prof, title="py-spy target", style=Style(min_width=0))
    root = ET.fromstring(svg.encode("utf-8"))
    assert svg.count("<script") == 1
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith(EVIL + " (target.py:") for t in titles)

    doc = json.loads(json.dumps(to_speedscope(prof, name="py-spy target")))
    assert sum(doc["profiles"][0]["weights"]) == reported
    assert any(f["name"].startswith(EVIL) for f in doc["shared"]["frames"])

    path = tmp_path / "pyspy.pb.gz"
    path.write_bytes(to_pprof(prof, period=10_000_000))
    home = tmp_path / "gohome"
    home.mkdir()
    top = subprocess.run(["go", "tool", "pprof", "-top", "-nodefraction=0", "-sample_index=samples", str(path)],
                         capture_output=True, text=True, timeout=120, check=True,
                         env={"HOME": str(home), "GOCACHE": str(home / "cache"), "PATH": "/usr/bin:/bin"})
    assert f"of {reported} total" in top.stdout

    half = parse_folded("".join(line + "\n" for line in text.splitlines() if "spin" not in line))
    dsvg = render_diff_svg(diff(half, prof))
    ET.fromstring(dsvg.encode("utf-8"))
    assert dsvg.count("<script") == 1
