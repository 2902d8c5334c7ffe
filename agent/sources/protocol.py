"""The Source protocol: what every user-space collector of one target answers."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from analysis.health import Health


class Source(Protocol):
    # The Window field it fills, which is also its config key and metric label.
    name: str

    def read(self) -> Any: ...

    def close(self) -> None: ...

    def health(self) -> Health: ...


@runtime_checkable
class Begins(Protocol):
    """A source whose read() waits on work it starts in begin(): the registry begins every such source of every
    target before reading any, so their waits overlap instead of adding up (the latency scrape)."""

    def begin(self) -> None: ...
