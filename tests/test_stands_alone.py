"""The repository stands alone: its code and docs cite its own docs/, never notes kept outside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Names of design notes that live outside the repository (a team folder): citing them leaves a reader stranded.
OUTSIDE = re.compile(r"DESIGN\.md|KERNEL_NOTES|STYLE\.md|shared folder", re.IGNORECASE)


def test_nothing_cites_notes_outside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for name in files:
        path = REPO / name
        if path.suffix in (".gz", ".png", ".svg", ".json", ".js", ".css") or name == "tests/test_stands_alone.py":
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                hits.append(f"{name}:{n}: {line.strip()[:120]}")
    assert hits == [], hits


def test_the_docs_the_readme_lists_exist():
    listed = re.findall(r"`(docs/[\w./-]+\.md)`", (REPO / "README.md").read_text())
    assert "docs/kernel.md" in listed and "docs/architecture.md" in listed
    assert [p for p in listed if not (REPO / p).is_file()] == []
