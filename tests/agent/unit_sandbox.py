"""What agent/service/infersight.service enforces, read from the unit and applied without systemd (for tests).

This host does not boot systemd, so its tests cannot start the unit. They read the unit file and apply the
same limits with the same kernel mechanisms: the capability bounding set and no_new_privs (setpriv), the
seccomp allow list with systemd's own group definitions (`systemd-analyze syscall-filter`, built by
libseccomp as systemd does), RestrictNamespaces= / MemoryDenyWriteExecute= / RestrictAddressFamilies= as
argument checks in that filter, MemoryMax= / TasksMax= / DevicePolicy= as cgroup v1 limits, UMask=, Nice=,
LimitNOFILE=/LimitMEMLOCK=, and ProtectSystem=strict, ProtectHome=read-only, PrivateTmp=, ReadOnlyPaths=,
ReadWritePaths=, InaccessiblePaths= in a mount namespace. Not applied: IPAddressDeny= (cgroup BPF on the
unit's own cgroup), ProtectClock=/ProtectHostname=/ProtectKernelModules= (their system calls are outside
the allow list anyway), LockPersonality=, RestrictSUIDSGID=, RestrictRealtime=.
"""

from __future__ import annotations

import contextlib
import errno
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "agent" / "service" / "infersight.service"
EXEC = Path(__file__).with_name("unit_exec.py")
# Debian's Python: the one python3-seccomp is built for.
SYSTEM_PYTHON = "/usr/bin/python3"
DEVICES_CLOSED = ("c 1:3 rwm", "c 1:5 rwm", "c 1:7 rwm", "c 1:8 rwm", "c 1:9 rwm", "c 5:0 rwm", "c 5:2 rwm",
                  "c 136:* rw")  # null zero full random urandom tty ptmx pts: DevicePolicy=closed's list
ADDRESS_FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16, "AF_PACKET": 17}
SIZE_SUFFIX = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_unit(path: Path = UNIT) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> every value in order (systemd allows a key more than once; configparser does not)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        if current is None or "=" not in line:
            raise ValueError(f"{path}: cannot read {raw!r}")
        key, value = line.split("=", 1)
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def parse_size(value: str) -> int:
    value = value.strip()
    if value[-1].upper() in SIZE_SUFFIX:
        return int(float(value[:-1]) * SIZE_SUFFIX[value[-1].upper()])
    return int(value)


def syscall_groups() -> dict[str, list[str]]:
    """systemd's own group definitions, from the installed systemd."""
    out = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True, text=True, check=True).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        item = line.strip()
        if not item or item.startswith("#"):
            continue
        if not line.startswith(" "):
            current = groups.setdefault(item, [])
        elif current is not None:
            current.append(item)
    return groups


def expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    calls: set[str] = set()
    for name in names:
        calls |= expand(groups[name], groups) if name.startswith("@") else {name.split(":")[0]}
    return calls


def allowed_syscalls(service: dict[str, list[str]], groups: dict[str, list[str]]) -> set[str]:
    """SystemCallFilter= lines merged as systemd merges them: the first is an allow list, `~` lines remove.

    @default is always allowed (systemd's implicit execve, exit, time and sleep calls are in it).
    """
    lines = service.get("SystemCallFilter", [])
    if not lines or lines[0].startswith("~"):
        raise ValueError("the unit's SystemCallFilter= must start with an allow list")
    allowed = expand(["@default"], groups)
    for line in lines:
        if line.startswith("~"):
            allowed -= expand(line[1:].split(), groups)
        else:
            allowed |= expand(line.split(), groups)
    return allowed


def capabilities(service: dict[str, list[str]]) -> list[str]:
    """The bounding set as setpriv names it (cap_sys_admin -> sys_admin)."""
    (value,) = service["CapabilityBoundingSet"]
    return [c.lower().removeprefix("cap_") for c in value.split()]


def _yes(service: dict[str, list[str]], key: str) -> bool:
    return service.get(key, ["no"])[-1].lower() in ("yes", "true", "1", "on")


def _paths(service: dict[str, list[str]], key: str) -> list[str]:
    return [p.lstrip("-") for line in service.get(key, []) for p in line.split()]


@dataclass
class Sandbox:
    """A spec for unit_exec.py, plus the cgroups it joins (created here, removed by close())."""

    capabilities: list[str]
    memory_max: int | None = None
    tasks_max: int | None = None
    state_dir: Path | None = None
    extra_read_write: list[str] = field(default_factory=list)
    service: dict[str, list[str]] = field(default_factory=dict)
    cgroups: list[Path] = field(default_factory=list)

    def spec(self) -> dict:
        svc = self.service
        groups = syscall_groups()
        spec: dict = {"capabilities": self.capabilities, "no_new_privs": _yes(svc, "NoNewPrivileges"),
                      "cgroup_procs": [str(c / "cgroup.procs") for c in self.cgroups]}
        if "UMask" in svc:
            spec["umask"] = int(svc["UMask"][-1], 8)
        if "Nice" in svc:
            spec["nice"] = int(svc["Nice"][-1])
        rlimits = {}
        for key, name in (("LimitNOFILE", "NOFILE"), ("LimitMEMLOCK", "MEMLOCK")):
            if key in svc:
                rlimits[name] = None if svc[key][-1] == "infinity" else parse_size(svc[key][-1])
        spec["rlimits"] = rlimits
        if "SystemCallFilter" in svc:
            families = svc.get("RestrictAddressFamilies", [None])[-1]
            errno_name = svc.get("SystemCallErrorNumber", ["EPERM"])[-1]
            spec["seccomp"] = {
                "allow": sorted(allowed_syscalls(svc, groups)),
                "errno": getattr(errno, errno_name),
                "restrict_namespaces": _yes(svc, "RestrictNamespaces"),
                "memory_deny_write_execute": _yes(svc, "MemoryDenyWriteExecute"),
                "address_families": None if families is None else [ADDRESS_FAMILIES[f] for f in families.split()],
            }
        read_write = [*_paths(svc, "ReadWritePaths"), *self.extra_read_write]
        if self.state_dir is not None:
            read_write.append(str(self.state_dir))
        spec["mounts"] = {
            "read_only_root": svc.get("ProtectSystem", ["no"])[-1] == "strict",
            "private_tmp": _yes(svc, "PrivateTmp"),
            "read_write": read_write,
            "read_only": _paths(svc, "ReadOnlyPaths"),
            "inaccessible": _paths(svc, "InaccessiblePaths"),
        }
        return spec

    def argv(self, command: list[str], spec_dir: Path) -> list[str]:
        spec_file = spec_dir / f"sandbox-{uuid.uuid4().hex[:8]}.json"
        spec_file.write_text(json.dumps(self.spec()))
        return [SYSTEM_PYTHON, str(EXEC), str(spec_file), "--", *command]

    def close(self) -> None:
        for cgroup in self.cgroups:
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def _own_v1(controller: str) -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if controller in names.split(","):
            return Path(f"/sys/fs/cgroup/{controller}") / path.lstrip("/")
    raise FileNotFoundError(f"no cgroup v1 {controller} controller here")


def _device_rules(service: dict[str, list[str]]) -> list[str]:
    majors: dict[str, str] = {}
    block = False
    for line in Path("/proc/devices").read_text().splitlines():
        if line.startswith("Block"):
            block = True
        parts = line.split()
        if len(parts) == 2 and not block:
            majors[parts[1]] = parts[0]
    rules = list(DEVICES_CLOSED)
    allows = list(service.get("DeviceAllow", []))
    if _yes(service, "ProtectClock"):
        allows.append("char-rtc r")
    for allow in allows:
        name, _, access = allow.partition(" ")
        if name.startswith("char-") and name[5:] in majors:
            rules.append(f"c {majors[name[5:]]}:* {access or 'rwm'}")
    return rules


@contextlib.contextmanager
def unit_sandbox(capabilities_override: list[str] | None = None, state_dir: Path | None = None,
                 extra_read_write: list[str] | None = None) -> Iterator[Sandbox]:
    """The unit's sandbox; `capabilities_override` replaces its bounding set (to show what each is for)."""
    service = parse_unit()["Service"]
    sandbox = Sandbox(capabilities=capabilities(service) if capabilities_override is None else capabilities_override,
                      state_dir=state_dir, extra_read_write=extra_read_write or [], service=service)
    name = f"infersight-unit-{uuid.uuid4().hex[:8]}"
    try:
        if "MemoryMax" in service:
            sandbox.memory_max = parse_size(service["MemoryMax"][-1])
            mem = _own_v1("memory") / name
            mem.mkdir()
            sandbox.cgroups.append(mem)
            (mem / "memory.limit_in_bytes").write_text(str(sandbox.memory_max))
        if "TasksMax" in service:
            sandbox.tasks_max = int(service["TasksMax"][-1])
            pids = _own_v1("pids") / name
            pids.mkdir()
            sandbox.cgroups.append(pids)
            (pids / "pids.max").write_text(str(sandbox.tasks_max))
        if service.get("DevicePolicy", ["auto"])[-1] in ("closed", "strict"):
            devices = _own_v1("devices") / name
            devices.mkdir()
            sandbox.cgroups.append(devices)
            (devices / "devices.deny").write_text("a")
            for rule in _device_rules(service):
                (devices / "devices.allow").write_text(rule)
        yield sandbox
    finally:
        sandbox.close()


def peak(sandbox: Sandbox) -> dict[str, int]:
    """The cgroups' high-water marks: memory (page cache included, as MemoryMax= counts it) and tasks."""
    out = {}
    for cgroup in sandbox.cgroups:
        if (cgroup / "memory.max_usage_in_bytes").exists():
            out["memory_bytes"] = int((cgroup / "memory.max_usage_in_bytes").read_text())
            out["memory_failcnt"] = int((cgroup / "memory.failcnt").read_text())
        if (cgroup / "pids.peak").exists():
            out["tasks"] = int((cgroup / "pids.peak").read_text())
    return out


def missing_tools() -> str | None:
    """Why the sandbox cannot be built here, or None."""
    if shutil.which("systemd-analyze") is None:
        return "systemd-analyze is missing (Debian package systemd; make setup installs it)"
    probe = subprocess.run([SYSTEM_PYTHON, "-c", "import seccomp"], capture_output=True, text=True)
    if probe.returncode != 0:
        return "python3-seccomp is missing for /usr/bin/python3 (make setup installs it)"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is missing"
    return None


if __name__ == "__main__":
    # python tests/agent/unit_sandbox.py COMMAND...: run a command under the unit's sandbox, by hand.
    with unit_sandbox() as box:
        spec_dir = Path("/run")
        rc = subprocess.run(box.argv(sys.argv[1:], spec_dir)).returncode
        print(json.dumps(peak(box)), file=sys.stderr)
        sys.exit(rc)
