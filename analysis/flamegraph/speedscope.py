"""speedscope's JSON file format, one "sampled" profile (https://www.speedscope.app/file-format-schema.json)."""

from __future__ import annotations

from typing import Any

from .profile import Profile

SCHEMA_URL = "https://www.speedscope.app/file-format-schema.json"

# speedscope's ValueUnit enum; anything else (samples) is "none", which it shows as plain counts.
_UNITS = {"bytes", "microseconds", "milliseconds", "nanoseconds", "none", "seconds"}


def speedscope_unit(unit: str) -> str:
    return unit if unit in _UNITS else "none"


def to_speedscope(profile: Profile, name: str, exporter: str = "infersight") -> dict[str, Any]:
    """A speedscope document (serialise with json.dumps); stacks are frame indices, root first."""
    index: dict[str, int] = {}
    frames: list[dict[str, str]] = []
    samples: list[list[int]] = []
    weights: list[int] = []
    for stack, count in profile.sorted_items():
        ids = []
        for frame in stack:
            i = index.get(frame)
            if i is None:
                i = index[frame] = len(frames)
                frames.append({"name": frame})
            ids.append(i)
        samples.append(ids)
        weights.append(count)
    return {
        "$schema": SCHEMA_URL,
        "name": name,
        "exporter": exporter,
        "activeProfileIndex": 0,
        "shared": {"frames": frames},
        "profiles": [{
            "type": "sampled",
            "name": name,
            "unit": speedscope_unit(profile.unit),
            "startValue": 0,
            "endValue": sum(weights),
            "samples": samples,
            "weights": weights,
        }],
    }
