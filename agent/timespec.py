"""Parse the times users type: 'now', relative ('-10m', '-2h'), unix seconds, or ISO 8601."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime

_RELATIVE = re.compile(r"^-(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_time(text: str, now: float | None = None) -> float:
    now = time.time() if now is None else now
    text = text.strip()
    if text == "now":
        return now
    if m := _RELATIVE.match(text):
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a time: {text!r} (use 'now', '-10m', unix seconds or ISO 8601)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
