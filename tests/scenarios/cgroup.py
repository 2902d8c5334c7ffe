"""A process moved into a cgroup of its own for a while, and back: what the outside-fault commands that act through
cgroups (`cpuquota.py`, `freeze.py`) share. Works on cgroup v2 and on v1 hierarchies (root)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

MOUNT = "/sys/fs/cgroup"


@dataclass(frozen=True)
class Hierarchy:
    mount: str
    version: str  # "v1" or "v2"

    def own_path(self, pid: int, controller: str) -> str:
        """PID's cgroup in this hierarchy, from /proc/PID/cgroup."""
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if (self.version == "v2" and controllers == "") or controller in controllers.split(","):
                    return path
        raise SystemExit(f"/proc/{pid}/cgroup names no {self.version} {controller} cgroup")

    def move(self, pid: int, cgroup_dir: str) -> None:
        # v2 moves the whole process through cgroup.procs; v1 moves one thread per write to `tasks`.
        if self.version == "v2":
            with open(f"{cgroup_dir}/cgroup.procs", "w") as f:
                f.write(str(pid))
            return
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"{cgroup_dir}/tasks", "w") as f:
                    f.write(tid)
            except ProcessLookupError:
                pass  # the thread ended meanwhile


def find(controller: str, v2_file: str) -> Hierarchy:
    """The hierarchy that offers `controller`: cgroup v2 where its cgroups have `v2_file` (the unified mount, or the
    hybrid one under unified/), else the v1 mount named after the controller."""
    for mount in (MOUNT, f"{MOUNT}/unified"):
        try:
            with open(f"{mount}/cgroup.controllers") as f:
                enabled = f.read().split()
        except OSError:
            continue
        # The freezer is no controller in v2: every cgroup but the root has cgroup.freeze.
        if controller in enabled or v2_file == "cgroup.freeze":
            return Hierarchy(mount, "v2")
    if os.path.isdir(f"{MOUNT}/{controller}"):
        return Hierarchy(f"{MOUNT}/{controller}", "v1")
    raise SystemExit(f"no cgroup hierarchy offers {controller}: neither cgroup v2 {v2_file} nor a v1 {controller} mount")


@contextmanager
def moved_into(pid: int, controller: str, v2_file: str, name: str) -> Iterator[tuple[str, Hierarchy]]:
    """PID in a new cgroup `name` (created, yielded as its directory), moved back to its own and removed at exit."""
    hierarchy = find(controller, v2_file)
    home = f"{hierarchy.mount}{hierarchy.own_path(pid, controller)}".rstrip("/")
    path = f"{hierarchy.mount}/{name}"
    os.makedirs(path, exist_ok=True)
    try:
        yield path, hierarchy
    finally:
        try:
            hierarchy.move(pid, home)
        except (FileNotFoundError, ProcessLookupError):
            pass  # the process is gone
        os.rmdir(path)
