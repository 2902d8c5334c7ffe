"""GpuSource: the real NVML on this host (a GPU or a clear "no GPU"), and its arithmetic."""

from __future__ import annotations

import glob
from types import SimpleNamespace

import pynvml
import pytest

from agent.sources.gpu import GpuSource, gpu_device_nodes
from analysis.errors import ReadingError


def test_real_nvml_gives_figures_or_a_no_gpu_reading() -> None:
    src = GpuSource()
    try:
        reading = src.read()
        health = src.health()
        if glob.glob("/dev/nvidia[0-9]*"):
            assert reading.available, reading.reason
        if reading.available:
            assert 0.0 <= reading.utilization <= 1.0
            assert reading.memory_used_bytes >= 0
            assert health.state == "running" and health.detail["devices"] >= 1
        else:
            # This host (CI included) has nvidia-ml-py but no driver and no GPU: a fact about the host, in a
            # neutral state, with NVML's own words; no error.
            assert reading.reason.startswith("no GPU on this host (no /dev/nvidia*; ")
            assert "NVML" in reading.reason
            assert reading.utilization is None and reading.memory_used_bytes is None
            assert health.state == "absent" and health.error_count == 0
    finally:
        src.close()


def test_real_nvml_init_failure_is_reported_in_nvmls_words() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        expected = str(exc)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML starts on this host: the no-driver path cannot happen here")
    assert expected in GpuSource().read().reason


def test_missing_binding_is_a_no_gpu_reading() -> None:
    def loader():
        raise ImportError("No module named 'pynvml'")

    src = GpuSource(loader=loader, device_nodes=list)
    reading = src.read()
    assert not reading.available
    assert "nvidia-ml-py is not installed" in reading.reason
    assert src.health().state == "absent"


def test_a_gpu_nvml_cannot_read_is_a_failure_not_an_absent_gpu() -> None:
    """The same NVML failure with a device node present: the host has a GPU and its driver is broken."""
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML starts on this host: the no-driver path cannot happen here")
    src = GpuSource(device_nodes=lambda: ["/dev/nvidia0"])
    health = src.health()
    assert health.state == "failed"
    assert health.reason.startswith("cannot read the GPU (/dev/nvidia0): NVML failed to start: ")
    assert not src.read().available


def test_device_nodes_are_the_drivers_numbered_nodes(tmp_path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (tmp_path / name).touch()
    assert gpu_device_nodes(tmp_path) == [str(tmp_path / "nvidia0"), str(tmp_path / "nvidia1")]
    assert gpu_device_nodes(tmp_path / "nothing") == []


class ScriptedNvml:
    """Stands in for a driver this host lacks, to check sums, averages and pid filtering.

    The only non-real NVML in the suite; it raises pynvml's own error classes.
    """

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported

    def __init__(self, devices: list[dict], fail_reads: bool = False) -> None:
        self.devices = devices
        self.fail_reads = fail_reads
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict:
        return self.devices[i]

    def nvmlDeviceGetUtilizationRates(self, h: dict) -> SimpleNamespace:
        if self.fail_reads:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return SimpleNamespace(gpu=h["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h: dict) -> SimpleNamespace:
        return SimpleNamespace(used=h["used"], total=h["used"] * 4, free=0)

    def nvmlDeviceGetPowerUsage(self, h: dict) -> int:
        if h["mw"] is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return h["mw"]

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in h["procs"]]


DEVICES = [{"util": 80, "used": 10 * 2**30, "mw": 300_000, "procs": [(42, 6 * 2**30)]},
           {"util": 20, "used": 2 * 2**30, "mw": 100_000, "procs": [(7, 2**30)]}]


def test_all_devices_are_averaged_and_summed() -> None:
    src = GpuSource(loader=lambda: ScriptedNvml(DEVICES))
    r = src.read()
    assert r.available and r.utilization == pytest.approx(0.5)
    assert r.memory_used_bytes == 12 * 2**30 and r.power_watts == pytest.approx(400.0)


def test_a_target_pid_selects_its_devices_and_its_memory() -> None:
    r = GpuSource(pid=42, loader=lambda: ScriptedNvml(DEVICES)).read()
    assert r.utilization == pytest.approx(0.8)
    assert r.memory_used_bytes == 6 * 2**30 and r.power_watts == pytest.approx(300.0)


def test_unsupported_power_is_none_not_an_error() -> None:
    devices = [dict(DEVICES[0], mw=None)]
    src = GpuSource(loader=lambda: ScriptedNvml(devices))
    assert src.read().power_watts is None
    assert src.health().error_count == 0


def test_lost_gpu_is_a_counted_reading_error() -> None:
    nvml = ScriptedNvml(DEVICES, fail_reads=True)
    src = GpuSource(loader=lambda: nvml)
    with pytest.raises(ReadingError, match="NVML read failed"):
        src.read()
    assert src.health().error_count == 1 and src.health().state == "failed"
    src.close()
    assert nvml.shutdowns == 1


def test_zero_devices_is_no_gpu() -> None:
    nvml = ScriptedNvml([])
    reading = GpuSource(loader=lambda: nvml).read()
    assert not reading.available and "0 devices" in reading.reason
    assert nvml.shutdowns == 1
