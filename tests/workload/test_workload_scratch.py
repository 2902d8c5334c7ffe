"""A SIGKILLed server leaves its scratch directory behind; the next one made sweeps it (workload.scratch), and never a
live owner's, a symlink, or another user's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from workload import scratch

PREFIX = "workload-engine-"


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_owners_directory_is_swept_and_the_new_one_is_named_for_this_process(tmp_path: Path) -> None:
    dead = tmp_path / f"{PREFIX}{_dead_pid()}-abc"
    (dead / "sub").mkdir(parents=True)
    (dead / "sub" / "ipc").write_text("x")
    live = tmp_path / f"{PREFIX}{os.getpid()}-old"
    live.mkdir()
    other_prefix = tmp_path / f"workload-metrics-{_dead_pid()}-x"
    other_prefix.mkdir()
    made = Path(scratch.make(PREFIX, str(tmp_path)))
    assert not dead.exists()
    assert live.exists() and other_prefix.exists()
    assert made.name.startswith(f"{PREFIX}{os.getpid()}-") and made.is_dir()
    assert made.stat().st_mode & 0o777 == 0o700


def test_a_symlink_or_a_file_or_another_users_directory_is_never_removed(tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / f"{PREFIX}{_dead_pid()}-link"
    link.symlink_to(target)
    plain = tmp_path / f"{PREFIX}{_dead_pid()}-file"
    plain.write_text("x")
    foreign = tmp_path / f"{PREFIX}{_dead_pid()}-nobody"
    foreign.mkdir()
    if os.geteuid() == 0:
        os.chown(foreign, 65534, 65534)
    removed = scratch.sweep(PREFIX, str(tmp_path))
    assert (target / "keep").exists() and link.is_symlink() and plain.exists()
    assert foreign.exists() == (os.geteuid() == 0)  # as root it belongs to nobody; as a user it is that user's
    assert link not in removed and plain not in removed


def test_an_unreadable_or_missing_temp_dir_sweeps_nothing(tmp_path: Path) -> None:
    assert scratch.sweep(PREFIX, str(tmp_path / "missing")) == []
