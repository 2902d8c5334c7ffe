"""The health record every user-space source reports, and the Source protocol."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol


@dataclass
class SourceHealth:
    name: str
    state: str = "ok"  # ok | error | unsupported
    reason: str | None = None
    errors: int = 0
    # Source-specific counters (restarts, gap seconds, scrapes ...), shown as-is on the status page.
    detail: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Source(Protocol):
    name: str

    def read(self) -> Any: ...

    def close(self) -> None: ...

    def health(self) -> SourceHealth: ...
