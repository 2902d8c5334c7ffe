"""The Source protocol: what every user-space collector of one target answers."""

from __future__ import annotations

from typing import Any, Protocol

from analysis.health import Health


class Source(Protocol):
    # The Window field it fills, which is also its config key and metric label.
    name: str

    def read(self) -> Any: ...

    def close(self) -> None: ...

    def health(self) -> Health: ...
