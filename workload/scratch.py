"""Scratch directories a server process owns, and the sweep of those a SIGKILLed owner left behind.

A process killed by SIGKILL (the OOM killer, `kill -9`) runs no cleanup: the engine's socket directory and gunicorn's
metrics directory stayed in /tmp, one per kill. Each directory's name carries its owner's pid; making a new one
first removes those whose owner no longer exists. Only directories of this prefix, owned by this user, whose pid is
dead: a live owner (or a reused pid, which looks live) keeps its directory, and no other user's is touched.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    return True


def sweep(prefix: str, directory: str | None = None) -> list[Path]:
    """Removes `{prefix}{pid}-*` directories under `directory` (the temp dir) owned by this user whose pid is dead;
    returns them."""
    root = Path(directory or tempfile.gettempdir())
    pattern = re.compile(re.escape(prefix) + r"(\d+)-[^/]*")
    removed = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match is None:
            continue
        try:
            st = entry.lstat()
        except OSError:
            continue
        if not entry.is_dir() or entry.is_symlink() or st.st_uid != os.geteuid() or _alive(int(match[1])):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def make(prefix: str, directory: str | None = None) -> str:
    """A new private directory named for this process (mode 0700), after sweeping its dead owners' ones."""
    sweep(prefix, directory)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=directory)
