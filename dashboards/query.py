"""Query-string arguments the JSON endpoints share, each refused with a 400 that names it."""

from __future__ import annotations

import math

from flask import abort, request


def unix_seconds_arg(name: str) -> float | None:
    """The argument NAME as unix seconds; None when it is absent or empty.

    'nan' and 'inf' parse as floats but bound no range, so they are refused like 'abc'.
    """
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        abort(400, description=f"{name} must be a finite number of unix seconds, got {raw!r}")
    return value
