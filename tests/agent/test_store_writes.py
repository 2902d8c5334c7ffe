"""Every write of the store goes through Store.transaction(): no other code in the tree begins one."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_store_transaction_begins_a_write() -> None:
    found = subprocess.run(["git", "grep", "-n", "BEGIN" + " IMMEDIATE", "--", "*.py"], cwd=ROOT, capture_output=True,
                           text=True, check=False).stdout.splitlines()
    assert found and all(line.startswith("agent/store/db.py:") for line in found), found
