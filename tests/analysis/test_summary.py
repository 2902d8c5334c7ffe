"""The one window summary: figures the window has, None (never 0) for the ones it lacks, GPU as a percentage."""

from analysis.summary import summary_line, window_summary
from analysis.window import GcReading, GpuReading, ProcessReading, Window


def test_missing_readings_are_none_and_left_out_of_the_line():
    w = Window(target="server", pid=7, start=100.0, end=105.0, gc=GcReading(collections=0),
               process=ProcessReading(cpu_seconds=2.5, rss_bytes=64 * 2**20, threads=3),
               errors={"syscalls": "unsupported: all 16 target slots of syscalls are in use (max_targets)"})
    s = window_summary(w)
    assert s["syscalls"] is None and s["offcpu_seconds"] is None and s["python_samples"] is None
    assert s["gc_collections"] == 0  # measured: a real zero stays a zero
    assert s["cpu_percent"] == 50.0 and s["rss_mb"] == 64.0
    line = summary_line(s)
    assert "syscalls" not in line.split("errors:")[0] and "offcpu" not in line
    assert "gc 0" in line and "cpu 50.0 %" in line
    assert line.endswith("errors: syscalls: unsupported: all 16 target slots of syscalls are in use (max_targets)")


def test_gpu_fraction_is_shown_as_a_percentage_or_the_reason():
    base = {"target": "s", "pid": 1, "start": 0.0, "end": 5.0}
    busy = window_summary(Window(**base, gpu=GpuReading(available=True, utilization=0.37)))
    assert busy["gpu_percent"] == 37.0 and busy["gpu_note"] is None
    assert "gpu 37.0 %" in summary_line(busy)
    none = window_summary(Window(**base, gpu=GpuReading(available=False, reason="no NVIDIA GPU: driver missing")))
    assert none["gpu_percent"] is None and none["gpu_note"] == "no NVIDIA GPU: driver missing"
