"""Bounds on the web endpoints: small pools for slow requests, one profile per target, client-gone checks."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from flask import current_app, jsonify

# The web server has few threads (agent.daemon.WEB_THREADS); slow endpoints may hold only some of them,
# so /metrics and the page always find a free one. Three gates, so a flood of one kind cannot starve the
# others: pprof pulls (they mostly sleep), reads of stored windows and profiles (lists, exports, flame
# trees, charts), and the summaries every open page polls (overview, targets).
PROFILE_SLOTS = 2
LIST_SLOTS = 2
SUMMARY_SLOTS = 2
# One request reading stored profiles stops after this long (the newest windows first) and says so: 24 h of
# windows with distinct stacks took a minute to merge.
READ_SECONDS = 5.0
# Profiles are read from at most the newest day of the asked range (the off-CPU chart refuses longer ones).
MAX_PROFILE_SPAN_SECONDS = 86400.0


class Busy(Exception):
    """No slot is free right now; the message says what holds it. Answered 429 with Retry-After."""


class Gate:
    """At most `slots` holders at once, and at most one per key; never waits (a full gate refuses)."""

    def __init__(self, slots: int, what: str) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots!r}")
        self._slots = slots
        self._what = what
        self._lock = threading.Lock()
        self._held: dict[str, int] = {}
        self._count = 0

    @contextmanager
    def claim(self, key: str = "", *, exclusive: bool = False) -> Iterator[None]:
        with self._lock:
            if exclusive and self._held.get(key):
                raise Busy(f"a {self._what} of {key!r} is already running; retry when it ends")
            if self._count >= self._slots:
                raise Busy(f"{self._slots} {self._what}s are already running (the limit); retry later")
            self._count += 1
            self._held[key] = self._held.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1
                self._held[key] -= 1
                if not self._held[key]:
                    del self._held[key]

    @property
    def in_use(self) -> int:
        with self._lock:
            return self._count


def wait_while_present(seconds: float, gone: Callable[[], bool], *, sleep: Callable[[float], None] = time.sleep,
                       clock: Callable[[], float] = time.time, step: float = 0.25) -> bool:
    """Sleep `seconds` in small steps; False as soon as `gone()` says the client has disconnected."""
    end = clock() + seconds
    while (left := end - clock()) > 0:
        if gone():
            return False
        sleep(min(step, left))
    return not gone()


def busy(message: str, retry_after: int = 2):
    resp = jsonify(error=message)
    resp.status_code = 429
    resp.headers["Retry-After"] = str(retry_after)
    return resp


def gated(gate: str) -> Callable:
    """The view holds a slot of the app's gate `gate` (a config key) while it runs; a full gate is a 429 at once."""
    def decorate(view: Callable) -> Callable:
        @functools.wraps(view)
        def wrapper(*args, **kwargs):
            try:
                with current_app.config[gate].claim():
                    return view(*args, **kwargs)
            except Busy as exc:
                return busy(str(exc))
        return wrapper
    return decorate


def read_deadline(share: float = 1.0) -> float:
    """The time.monotonic() by which this request's reads of stored profiles stop (READ_SECONDS, or the app's)."""
    return time.monotonic() + share * float(current_app.config.get("READ_SECONDS") or READ_SECONDS)
