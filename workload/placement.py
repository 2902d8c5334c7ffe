"""Fault switches of `serve --engine-process`: each one on in the API process or in the engine process."""

import logging
from collections.abc import Callable

from workload.engine_client import EngineClient, EngineError
from workload.faults import FAULT_NAMES, FaultSet, UnknownFault

PLACES = ("api", "engine")
DEFAULT_PLACE = "engine"
log = logging.getLogger("workload.placement")


class PlacedFaults:
    """The API process's own FaultSet beside the engine's, reached over the engine's ZeroMQ channel."""

    def __init__(self, api: FaultSet, engine: EngineClient, on_change: Callable[[str, bool], None]) -> None:
        self.api = api
        self.engine = engine
        self.on_change = on_change

    def set(self, name: str, active: bool, place: str = DEFAULT_PLACE) -> None:
        if name not in FAULT_NAMES:
            raise UnknownFault(f"unknown fault {name!r}; choose one of {list(FAULT_NAMES)}")
        if place not in PLACES:
            raise ValueError(f"'in' must be one of {', '.join(PLACES)}, got {place!r}")
        if place == "api":
            if name not in self.api.faults:
                raise ValueError(f"fault {name!r} acts on the engine's KV cache: it has no API-process form "
                                 "(switch it in the engine)")
            self.api.set(name, active)
        else:
            try:
                self.engine.set_fault(name, active)
            except EngineError as exc:
                raise RuntimeError(str(exc)) from None
        self.on_change(name, self.active()[name])

    def placed(self) -> dict[str, dict[str, bool]]:
        return {"api": {name: self.api.active().get(name, False) for name in FAULT_NAMES},
                "engine": {name: self.engine.engine_faults.get(name, False) for name in FAULT_NAMES}}

    def active(self) -> dict[str, bool]:
        """On in either process (the `workload_fault_active` gauge and the answer of /admin/faults)."""
        placed = self.placed()
        return {name: placed["api"][name] or placed["engine"][name] for name in FAULT_NAMES}

    def all_off(self) -> None:
        self.api.all_off()
        for name, on in list(self.engine.engine_faults.items()):
            if on:
                try:
                    self.engine.set_fault(name, False)
                except EngineError as exc:
                    # The engine is gone or going: it switches its own faults off as it stops.
                    log.warning("fault %s: not switched off in the engine: %s", name, exc)
