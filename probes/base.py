"""What every probe shares: the Probe protocol, its health record, and BCC loading."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from probes.errors import NotRoot, ProbeUnavailable, TracepointMissing

TRACEFS_ROOTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))


@dataclass
class ProbeHealth:
    name: str
    state: str = "stopped"  # stopped | running | failed | unsupported
    reason: str | None = None
    targets: int = 0
    lost_events: int = 0
    failed_stacks: int = 0
    # Targets this probe cannot trace (e.g. not a Python process for gcpause): pid -> reason.
    unsupported: dict[int, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "reason": self.reason, "targets": self.targets,
                "lost_events": self.lost_events, "failed_stacks": self.failed_stacks,
                "unsupported": {str(pid): why for pid, why in self.unsupported.items()}}


class Probe(Protocol):
    name: str

    def start(self, targets: Iterable[int]) -> None: ...

    def set_targets(self, targets: Iterable[int]) -> None: ...

    def read(self) -> dict[int, Any]: ...

    def stop(self) -> None: ...

    def health(self) -> ProbeHealth: ...


def tracefs_root(candidates: Iterable[Path] = TRACEFS_ROOTS) -> Path | None:
    for root in candidates:
        if (root / "events").is_dir():
            return root
    return None


def require_tracepoints(names: Iterable[str], root: Path | None = None) -> None:
    """Raise TracepointMissing naming the first `category:event` absent from tracefs."""
    root = root or tracefs_root()
    if root is None:
        raise TracepointMissing("tracefs is not mounted (mount -t tracefs nodev /sys/kernel/tracing)")
    for name in names:
        category, event = name.split(":", 1)
        if not (root / "events" / category / event).is_dir():
            raise TracepointMissing(f"tracepoint {name} does not exist in {root}/events")


def import_bcc() -> Any:
    try:
        import bcc  # noqa: PLC0415 - imported lazily: LLVM costs ~76 MB and seconds
    except ImportError as exc:
        raise ProbeUnavailable(f"BCC is not importable ({exc}); run 'make setup' (installs python3-bpfcc)") from exc
    return bcc


def load_bpf(text: str, cflags: Iterable[str] = ()) -> Any:
    """Compile and load BCC C text; translate BCC's failures into ProbeUnavailable with the reason."""
    if os.geteuid() != 0:
        raise NotRoot("loading BPF programs needs root")
    bcc = import_bcc()
    try:
        bpf = bcc.BPF(text=text.encode(), cflags=list(cflags))
    except Exception as exc:  # BCC raises bare Exception for compile and load failures
        raise ProbeUnavailable(f"BPF program failed to load: {exc}") from exc
    release_compiler_memory()
    return bpf


def release_compiler_memory() -> None:
    """Hand LLVM's freed heap back to the OS: ~150 MB -> ~110 MB RSS after compiling (KERNEL_NOTES.md)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to trim, RSS stays higher
