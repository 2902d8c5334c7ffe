"""Recorded scenario runs: a gzip'd JSON-lines file, a header with the schedule, then one labelled Window per line."""

from __future__ import annotations

import gzip
import json
import os
import platform
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from agent.evaluation.clients import ClientFigures
from analysis.scenario import Scenario
from analysis.window import Window

FORMAT = "infersight-eval-recording/1"


class RecordingError(ValueError):
    """A file that is not a readable recording; the message names the file and line."""


@dataclass
class LabelledWindow:
    window: Window
    label: str
    phase: int | None
    # The pid of the process the scenario ran as the fault's culprit (a neighbour hog), beside the window like the
    # label, never in it; None where the phase has none or the recording predates it. A tuple of pids where the
    # fault started several processes of one job (the cpuhog's spinners): naming any of them names the culprit.
    culprit: int | tuple[int, ...] | None = None
    # The change this window revealed in what the server runs (a restart with other arguments), as the agent stores
    # it (agent.store.changes.StoredChange.to_dict(): id, at, seen_at, diff, both identities); beside the window, as
    # the daemon keeps changes beside windows.
    change: dict[str, Any] | None = None
    # What the load generator's clients measured over the window (agent.evaluation.clients), beside it like the
    # label; None where the recording predates it.
    clients: ClientFigures | None = None


@dataclass
class Recording:
    scenario: Scenario
    interval_seconds: float
    started_at: float
    windows: list[LabelledWindow]
    header: dict[str, Any]


def host_facts() -> dict[str, Any]:
    """What a reader needs to judge the noise: how busy the host was at the start (each window carries its own
    load average). Measured, never asserted: a fixed "shared host" note once labelled a quiet host's run."""
    load1, load5, load15 = os.getloadavg()
    return {"loadavg": [round(load1, 2), round(load5, 2), round(load15, 2)], "cpus": os.cpu_count(),
            "kernel": platform.release(), "python": platform.python_version()}


class RecordingWriter:
    """Writes FILE.part as it goes and renames it to FILE on close(complete=True), so a cut run never passes as whole."""

    def __init__(self, path: Path, scenario: Scenario, interval: float, started_at: float,
                 extra: dict[str, Any] | None = None) -> None:
        self.path = path
        self.part = path.with_name(path.name + ".part")
        self._file: IO[str] | None = gzip.open(self.part, "wt", encoding="utf-8")
        self._line({"format": FORMAT, "scenario": scenario.to_dict(), "interval_seconds": interval,
                    "started_at": started_at, "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "host": host_facts(), **(extra or {})})

    def add(self, item: LabelledWindow) -> None:
        # The host's 1-minute load average when the window closed: which stretches other work disturbed.
        # Beside the window, never in it: the detector sees only what the agent collects.
        self._line({"label": item.label, "phase": item.phase, "host_load1": round(os.getloadavg()[0], 2),
                    "window": item.window.to_dict(), **({"culprit": item.culprit} if item.culprit is not None else {}),
                    **({"change": item.change} if item.change is not None else {}),
                    **({"clients": item.clients.to_dict()} if item.clients is not None else {})})

    def _line(self, obj: dict[str, Any]) -> None:
        assert self._file is not None
        self._file.write(json.dumps(obj, separators=(",", ":"), sort_keys=True) + "\n")
        self._file.flush()

    def close(self, complete: bool) -> Path:
        if self._file is not None:
            self._file.close()
            self._file = None
        if complete:
            self.part.replace(self.path)
            return self.path
        return self.part


def read_recording(path: Path) -> Recording:
    lines = iter(_lines(path))
    try:
        header = json.loads(next(lines))
    except StopIteration:
        raise RecordingError(f"{path}: empty file") from None
    except json.JSONDecodeError as exc:
        raise RecordingError(f"{path}:1: not JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise RecordingError(f"{path}:1: not an infersight recording (format {FORMAT!r} expected)")
    try:
        scenario = Scenario.from_dict(header["scenario"])
        interval = float(header["interval_seconds"])
    except (KeyError, TypeError, ValueError) as exc:
        raise RecordingError(f"{path}:1: header lacks {exc}") from None
    windows = []
    for n, line in enumerate(lines, start=2):
        try:
            row = json.loads(line)
            culprit = _culprit(row.get("culprit"))
            change = row.get("change")
            if change is not None and not (isinstance(change, dict) and isinstance(change.get("id"), str)
                                           and isinstance(change.get("diff"), list)):
                raise ValueError(f"change must be a stored change (id, at, diff), got {str(change)[:80]!r}")
            clients = ClientFigures.from_dict(row["clients"]) if row.get("clients") is not None else None
            windows.append(LabelledWindow(Window.from_dict(row["window"]), row["label"], row["phase"], culprit,
                                          change, clients))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordingError(f"{path}:{n}: not a labelled window ({exc})") from None
    return Recording(scenario=scenario, interval_seconds=interval, started_at=float(header.get("started_at", 0.0)),
                     windows=windows, header=header)


def _lines(path: Path) -> Iterator[str]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield line
    except FileNotFoundError:
        raise RecordingError(f"{path}: no such file") from None
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise RecordingError(f"{path}: not a readable gzip file ({exc})") from None


def _pid(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _culprit(value: Any) -> int | tuple[int, ...] | None:
    """A recording line's `culprit`: absent, one pid, or a non-empty list of pids (read as a tuple)."""
    if value is None or _pid(value):
        return value
    if isinstance(value, list) and value and all(_pid(v) for v in value):
        return tuple(value)
    raise ValueError(f"culprit must be a pid or a list of pids, got {value!r}")
