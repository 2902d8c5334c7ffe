"""`infersight doctor`: check every host requirement, one line each, naming the fix for each failure."""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.sources.gpu import NO_GPU, GpuSource, gpu_device_nodes
from agent.sources.pressure import NO_PSI
from probes import delivery, offcpu, runqlat, syscalls, tcpretrans

PASS, FAIL, WARN, INFO = "ok", "FAIL", "warn", "info"

# Taken from the probes themselves, so a hook a probe gains is checked here too.
PROBE_TRACEPOINTS: tuple[str, ...] = tuple(dict.fromkeys(
    syscalls.TRACEPOINTS + offcpu.TRACEPOINTS + runqlat.TRACEPOINTS + tcpretrans.TRACEPOINTS
    + delivery.TRACEPOINTS))

# Counts one syscall of one process exactly: proves compile, load, attach and map reads all work.
_TRIVIAL_BPF = r"""
BPF_ARRAY(counts, u64, 1);
RAW_TRACEPOINT_PROBE(sys_enter) {
    if ((bpf_get_current_pid_tgid() >> 32) != TARGET_TGID) return 0;
    if (ctx->args[1] != SYSCALL_NR) return 0;
    int zero = 0;
    u64 *n = counts.lookup(&zero);
    if (n) __sync_fetch_and_add(n, 1);
    return 0;
}
"""
_GETPPID_NR = 110  # x86-64
_TRIVIAL_CALLS = 1000


@dataclass
class CheckResult:
    name: str
    status: str
    detail: str
    fix: str | None = None
    required: bool = True

    @property
    def failed(self) -> bool:
        return self.required and self.status == FAIL


@dataclass
class Host:
    """Every OS input doctor reads, injectable so tests can point it at fake trees."""

    tracefs: Path = Path("/sys/kernel/tracing")
    btf: Path = Path("/sys/kernel/btf/vmlinux")
    modules: Path = Path("/lib/modules")
    proc: Path = Path("/proc")
    kernel_release: str = field(default_factory=platform.release)
    euid: Callable[[], int] = os.geteuid
    import_module: Callable[[str], Any] = importlib.import_module
    pyspy: str | None = field(default_factory=lambda: _find_pyspy())
    python: str = sys.executable
    dev: Path = Path("/dev")
    cgroup: Path = Path("/sys/fs/cgroup")


def _find_pyspy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def check_root(host: Host) -> CheckResult:
    if host.euid() == 0:
        return CheckResult("root", PASS, "running as root")
    return CheckResult("root", FAIL, f"running as uid {host.euid()}",
                       "BPF and ptrace need root: run 'sudo infersight doctor'")


def check_kernel(host: Host) -> CheckResult:
    return CheckResult("kernel", INFO, host.kernel_release, required=False)


def check_tracefs(host: Host) -> CheckResult:
    if (host.tracefs / "events").is_dir():
        return CheckResult("tracefs", PASS, f"mounted at {host.tracefs}")
    return CheckResult("tracefs", FAIL, f"{host.tracefs}/events not found",
                       f"mount -t tracefs nodev {host.tracefs} (make setup does this)")


def check_btf(host: Host) -> CheckResult:
    if host.btf.exists():
        return CheckResult("btf", PASS, f"{host.btf} present")
    return CheckResult("btf", FAIL, f"{host.btf} missing",
                       "use a kernel built with CONFIG_DEBUG_INFO_BTF=y")


def check_tracepoint(host: Host, name: str) -> CheckResult:
    category, event = name.split(":", 1)
    path = host.tracefs / "events" / category / event
    if path.is_dir():
        return CheckResult(f"tracepoint {name}", PASS, "present")
    return CheckResult(f"tracepoint {name}", FAIL, f"{path} not found",
                       "mount tracefs, or use a kernel with this tracepoint (CONFIG_FTRACE)")


def check_uprobes(host: Host) -> CheckResult:
    if (host.tracefs / "uprobe_events").exists():
        return CheckResult("uprobes", PASS, "uprobe_events present")
    return CheckResult("uprobes", FAIL, f"{host.tracefs}/uprobe_events missing",
                       "GC pause probe needs CONFIG_UPROBE_EVENTS=y")


def check_kprobes(host: Host) -> CheckResult:
    present = (host.tracefs / "kprobe_events").exists()
    detail = "available" if present else "not available (infersight does not need them)"
    return CheckResult("kprobes", INFO, detail, required=False)


def check_headers(host: Host) -> CheckResult:
    build = host.modules / host.kernel_release / "build"
    if not build.exists():
        return CheckResult("kernel headers", FAIL, f"{build} missing",
                           "run 'make setup' (installs linux-headers and links the nearest tree)")
    target = build.resolve()
    release = host.kernel_release
    if release in target.name or release in str(target):
        return CheckResult("kernel headers", PASS, f"matching: {target}")
    return CheckResult("kernel headers", WARN,
                       f"mismatched: {build} -> {target}; safe, probes use tracepoints and uprobes only",
                       required=False)


def check_bcc(host: Host) -> CheckResult:
    try:
        bcc = host.import_module("bcc")
    except ImportError as exc:
        return CheckResult("bcc", FAIL, f"not importable: {exc}",
                           "run 'make setup' (installs python3-bpfcc and links it into .venv)")
    version = getattr(bcc, "__version__", "unknown")
    return CheckResult("bcc", PASS, f"version {version}")


def check_bpf_loads(host: Host) -> CheckResult:
    """Load a real program that counts this process's getppid calls, make a known number, read it back."""
    name = "bpf program"
    if host.euid() != 0:
        return CheckResult(name, FAIL, "skipped: not root", "run as root")
    try:
        bcc = host.import_module("bcc")
    except ImportError:
        return CheckResult(name, FAIL, "skipped: bcc not importable", "run 'make setup'")
    try:
        bpf = bcc.BPF(text=_TRIVIAL_BPF, cflags=[f"-DTARGET_TGID={os.getpid()}", f"-DSYSCALL_NR={_GETPPID_NR}"])
    except Exception as exc:  # BCC raises bare Exception on compile/load failure
        return CheckResult(name, FAIL, f"failed to load: {str(exc).splitlines()[0] if str(exc) else exc!r}",
                           "check kernel headers (make setup) and that BPF is enabled")
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for _ in range(_TRIVIAL_CALLS):
            libc.syscall(_GETPPID_NR)
        counted = bpf["counts"][0].value
    finally:
        bpf.cleanup()
    if counted == _TRIVIAL_CALLS:
        return CheckResult(name, PASS, f"loaded; counted {counted}/{_TRIVIAL_CALLS} getppid calls")
    return CheckResult(name, FAIL, f"loaded but counted {counted} of {_TRIVIAL_CALLS} calls",
                       "BPF raw tracepoints misbehave on this kernel; report it")


def check_probes(host: Host, factories: dict[str, Callable[[], Any]] | None = None) -> list[CheckResult]:
    """Load each of infersight's probes with no target and unload it: the specific reason when one cannot."""
    from analysis.errors import ProbeError

    if factories is None:
        from agent.collectors import PROBE_FACTORIES
        from probes.exits import ExitsProbe

        factories = {**PROBE_FACTORIES, "exits": ExitsProbe}
    if host.euid() != 0:
        return [CheckResult(f"probe {name}", FAIL, "skipped: not root", "run as root") for name in factories]
    results = []
    for name, factory in factories.items():
        try:
            probe = factory()
            probe.start([])
        except (ProbeError, ImportError, OSError) as exc:
            results.append(CheckResult(f"probe {name}", FAIL, f"cannot load: {exc}",
                                       "see the reason; 'make setup' fixes missing headers, BCC and tracefs"))
            continue
        probe.stop()
        results.append(CheckResult(f"probe {name}", PASS, "loads and unloads"))
    return results


def _ptrace_scope(host: Host) -> int | None:
    try:
        return int((host.proc / "sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return None


def check_pyspy(host: Host) -> CheckResult:
    name = "py-spy"
    if not host.pyspy:
        return CheckResult(name, FAIL, "not found", "run 'make setup' (pip installs py-spy)")
    scope = _ptrace_scope(host)
    scope_note = f"ptrace_scope={scope}" if scope is not None else "no yama"
    if host.euid() != 0:
        return CheckResult(name, FAIL, f"found; cannot attach as non-root ({scope_note})", "run as root")
    child = subprocess.Popen([host.python, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        time.sleep(0.5)
        out = subprocess.run([host.pyspy, "dump", "--pid", str(child.pid)],
                             capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return CheckResult(name, FAIL, "py-spy dump timed out on a child process", "check ptrace permissions")
    finally:
        child.kill()
        child.wait()
    if out.returncode == 0 and "<module>" in out.stdout:
        return CheckResult(name, PASS, f"attached to a child process ({scope_note})")
    reason = (out.stderr.strip().splitlines() or ["no output"])[-1]
    fix = "set kernel.yama.ptrace_scope=1 or lower" if scope and scope >= 2 else "check ptrace permissions"
    return CheckResult(name, FAIL, f"could not attach: {reason} ({scope_note})", fix)


def check_torch(host: Host) -> CheckResult:
    try:
        torch = host.import_module("torch")
    except ImportError as exc:
        return CheckResult("torch", FAIL, f"not importable: {exc}",
                           "run 'make setup' (pip install torch==2.13.0)")
    cuda = torch.cuda.is_available()
    where = f"CUDA usable ({torch.cuda.get_device_name(0)})" if cuda else "CUDA not available, CPU only"
    return CheckResult("torch", PASS, f"version {torch.__version__}; {where}")


def check_gpu(host: Host) -> CheckResult:
    """Never a failure: a CPU-only host is a fact about the host (info); a GPU NVML cannot read is a warning."""
    source = GpuSource(loader=lambda: host.import_module("pynvml"), device_nodes=lambda: gpu_device_nodes(host.dev))
    try:
        health = source.health()
    finally:
        source.close()
    if health.state == "running":
        return CheckResult("gpu", PASS, f"{health.detail['devices']} NVIDIA device(s) readable through NVML",
                           required=False)
    if health.state == "absent":
        return CheckResult("gpu", INFO, health.reason or NO_GPU, required=False)
    return CheckResult("gpu", WARN, health.reason or "NVML cannot read the GPU",
                       "install the NVIDIA driver matching the kernel and nvidia-ml-py (pip), then restart the agent",
                       required=False)


def check_psi(host: Host) -> CheckResult:
    """Never a failure: without PSI the pressure figures are null with the reason (agent/sources/pressure.py)."""
    try:
        (host.proc / "pressure" / "cpu").read_text()
    except FileNotFoundError:
        return CheckResult("psi", WARN, NO_PSI + "; pressure figures will be null",
                           "boot a kernel built with CONFIG_PSI=y, without psi=0 (or with psi=1)", required=False)
    except OSError as exc:
        return CheckResult("psi", WARN, f"/proc/pressure unreadable ({exc}): PSI is switched off; pressure figures "
                                        "will be null", "boot with psi=1", required=False)
    unified = [m for m in (host.cgroup, host.cgroup / "unified") if (m / "cgroup.controllers").exists()]
    where = (f"host-wide and per cgroup (cgroup v2 at {unified[0]})" if unified
             else "host-wide only (no cgroup v2 mount: no per-target pressure)")
    return CheckResult("psi", PASS, f"pressure stall information {where}", required=False)


def run_checks(host: Host | None = None) -> list[CheckResult]:
    host = host or Host()
    results = [check_root(host), check_kernel(host), check_tracefs(host), check_btf(host)]
    results += [check_tracepoint(host, tp) for tp in PROBE_TRACEPOINTS]
    results += [check_uprobes(host), check_kprobes(host), check_headers(host), check_bcc(host),
                check_bpf_loads(host)]
    # Loading the probes only makes sense once a trivial program does.
    if not results[-1].failed:
        results += check_probes(host)
    results += [check_pyspy(host), check_torch(host), check_gpu(host), check_psi(host)]
    return results


def format_text(results: list[CheckResult]) -> str:
    width = max(len(r.name) for r in results)
    lines = []
    for r in results:
        line = f"{r.status:<4}  {r.name:<{width}}  {r.detail}"
        if r.fix and r.status in (FAIL, WARN):
            line += f"  -> fix: {r.fix}"
        lines.append(line)
    failed = [r.name for r in results if r.failed]
    lines.append(f"doctor: {len(failed)} required check(s) failed: {', '.join(failed)}" if failed
                 else "doctor: all required checks passed")
    return "\n".join(lines)


def format_json(results: list[CheckResult]) -> str:
    return json.dumps({"ok": not any(r.failed for r in results),
                       "checks": [asdict(r) for r in results]}, indent=2)


def main(as_json: bool = False, host: Host | None = None) -> int:
    results = run_checks(host)
    print(format_json(results) if as_json else format_text(results))
    return 1 if any(r.failed for r in results) else 0
