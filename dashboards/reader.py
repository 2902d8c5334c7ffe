"""What the page may ask of the store: reads only. The agent hands create_app a handle whose connections cannot
write (agent.store.Store.read_only()); this Protocol says which reads the blueprints use."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from analysis.flamegraph.stored import FoldedRead
from analysis.regression import Regression
from analysis.window import Window


class StoreReader(Protocol):
    def targets(self) -> list[Any]: ...

    def windows(self, target: str | None = None, since: float | None = None, until: float | None = None,
                limit: int | None = None, *, with_profiles: bool = True) -> list[Window]: ...

    def latest(self, target: str) -> Window | None: ...

    def first_start(self, target: str) -> float | None: ...

    def read_profiles(self, target: str, since: float | None = None, until: float | None = None,
                      kind: Any = "active", *, max_stacks: int | None = None, max_span: float | None = None,
                      deadline: float | None = None, clock: Callable[[], float] = ...) -> FoldedRead: ...

    def aggregate(self, target: str, since: float, until: float, bucket_seconds: float,
                  fields: Mapping[str, str]) -> list[Any]: ...

    def rollup_progress(self, target: str) -> tuple[float, str] | None: ...

    def rollup_minutes(self, target: str, since: float, until: float) -> list[dict]: ...

    def regressions(self, target: str | None = None, *, open_only: bool = False, since: float | None = None,
                    limit: int = 100) -> list[Regression]: ...

    def regression(self, regression_id: str) -> Regression | None: ...
