"""GPU utilisation, memory and power from NVML (nvidia-ml-py); "no GPU" is a reading, not an error."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

from analysis.errors import ReadingError
from analysis.health import Health
from analysis.window import GpuReading


def import_nvml() -> ModuleType:
    return importlib.import_module("pynvml")


class GpuSource:
    """NVML figures for the devices a target uses (all devices when it holds none or pid is None).

    utilization is a fraction (0..1) averaged over those devices, as NVML reports it for its own
    last sample period (1/6 s to 1 s), not over the whole window; memory and power are summed.
    """

    name = "gpu"

    def __init__(self, pid: int | None = None, loader: Callable[[], ModuleType] = import_nvml) -> None:
        self.pid = pid
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._unavailable: str | None = None
        self._errors = 0
        self._last_error: str | None = None
        self._open(loader)

    def _open(self, loader: Callable[[], ModuleType]) -> None:
        try:
            nvml = loader()
        except ImportError as exc:
            self._unavailable = f"no NVIDIA GPU: nvidia-ml-py is not installed ({exc})"
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            # LibraryNotFound (no driver installed), DriverNotLoaded, NoPermission ... all mean no GPU to read.
            self._unavailable = f"no NVIDIA GPU: NVML failed to start: {exc}"
            return
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as exc:
            nvml.nvmlShutdown()
            self._unavailable = f"no NVIDIA GPU: NVML could not list devices: {exc}"
            return
        if not self._handles:
            nvml.nvmlShutdown()
            self._unavailable = "no NVIDIA GPU: NVML sees 0 devices"
            return
        self._nvml = nvml

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def read(self) -> GpuReading:
        if self._nvml is None:
            return GpuReading(available=False, reason=self._unavailable)
        nvml = self._nvml
        try:
            handles, process_bytes = self._target_devices()
            utils = [nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0 for h in handles]
            memory = process_bytes if process_bytes is not None else sum(
                nvml.nvmlDeviceGetMemoryInfo(h).used for h in handles)
            power = self._power_watts(handles)
        except nvml.NVMLError as exc:
            self._errors += 1
            self._last_error = f"NVML read failed: {exc}"
            raise ReadingError(self._last_error) from exc
        self._last_error = None
        return GpuReading(available=True, utilization=sum(utils) / len(utils), memory_used_bytes=int(memory),
                          power_watts=power)

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except self._nvml.NVMLError as exc:
                self._errors += 1
                self._last_error = f"NVML shutdown failed: {exc}"
            self._nvml = None
            self._unavailable = "closed"

    def health(self) -> Health:
        if self._nvml is None:
            return Health(name=self.name, state="unsupported", reason=self._unavailable, error_count=self._errors)
        return Health(name=self.name, state="failed" if self._last_error else "running", reason=self._last_error,
                            error_count=self._errors, detail={"devices": len(self._handles)})

    def _target_devices(self) -> tuple[list[Any], int | None]:
        """Devices where the target has compute contexts and its bytes there; all devices otherwise."""
        if self.pid is None:
            return self._handles, None
        nvml = self._nvml
        mine, used = [], 0
        for h in self._handles:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
            hits = [p for p in procs if p.pid == self.pid]
            if hits:
                mine.append(h)
                # usedGpuMemory is None when the driver hides it (e.g. inside some containers).
                used += sum(p.usedGpuMemory or 0 for p in hits)
        return (mine, used) if mine else (self._handles, None)

    def _power_watts(self, handles: list[Any]) -> float | None:
        nvml = self._nvml
        total = 0.0
        for h in handles:
            try:
                total += nvml.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts
            except nvml.NVMLError_NotSupported:
                return None
        return total
