"""GPU utilisation, memory and power from NVML (nvidia-ml-py); "no GPU on this host" is a reading, not an error."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from analysis.errors import ReadingError
from analysis.health import Health
from analysis.window import GpuReading

NO_GPU = "no GPU on this host"


def import_nvml() -> ModuleType:
    return importlib.import_module("pynvml")


def gpu_device_nodes(dev: Path = Path("/dev")) -> list[str]:
    """The NVIDIA driver's device nodes (/dev/nvidia0 ...): a host, or a container given a GPU, has at least one."""
    return sorted(str(p) for p in dev.glob("nvidia[0-9]*"))


class GpuSource:
    """NVML figures for the devices a target uses (all devices when it holds none or pid is None).

    utilization is a fraction (0..1) averaged over those devices, as NVML reports it for its own
    last sample period (1/6 s to 1 s), not over the whole window; memory and power are summed.
    """

    name = "gpu"

    def __init__(self, pid: int | None = None, loader: Callable[[], ModuleType] = import_nvml,
                 device_nodes: Callable[[], list[str]] = gpu_device_nodes) -> None:
        self.pid = pid
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._unavailable: str | None = None
        # True when the host has no GPU at all (health "absent"); False when it has one NVML cannot read (failed).
        self._absent = False
        self._errors = 0
        self._last_error: str | None = None
        self._open(loader, device_nodes)

    def _open(self, loader: Callable[[], ModuleType], device_nodes: Callable[[], list[str]]) -> None:
        try:
            nvml = loader()
        except ImportError as exc:
            self._cannot_read(device_nodes(), f"nvidia-ml-py is not installed ({exc})")
            return
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            # LibraryNotFound (no driver installed), DriverNotLoaded, NoPermission ...: without a device node
            # there is no GPU to read; with one, the driver or its library is broken, and that is an error.
            self._cannot_read(device_nodes(), f"NVML failed to start: {exc}")
            return
        try:
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except nvml.NVMLError as exc:
            nvml.nvmlShutdown()
            self._cannot_read(device_nodes(), f"NVML could not list devices: {exc}")
            return
        if not self._handles:
            nvml.nvmlShutdown()
            self._absent, self._unavailable = True, f"{NO_GPU} (NVML sees 0 devices)"
            return
        self._nvml = nvml

    def _cannot_read(self, nodes: list[str], why: str) -> None:
        if nodes:
            self._unavailable = f"cannot read the GPU ({', '.join(nodes[:4])}): {why}"
        else:
            self._absent, self._unavailable = True, f"{NO_GPU} (no /dev/nvidia*; {why})"

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
            state = "stopped" if self._unavailable == "closed" else "absent" if self._absent else "failed"
            return Health(name=self.name, state=state, reason=self._unavailable, error_count=self._errors)
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
