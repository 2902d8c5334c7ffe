"""Apply a sandbox spec (made by unit_sandbox.py from infersight.service) to this process, then exec a command.

Runs under Debian's /usr/bin/python3, whose python3-seccomp binding (libseccomp's own, the library systemd
uses) builds the filter. Order as systemd's: cgroups, rlimits, nice, umask, mounts, seccomp, then setpriv
drops the capability bounding set and sets no_new_privs as it execs the command.
Usage: python3 unit_exec.py SPEC.json -- COMMAND...
"""

import ctypes
import errno
import json
import os
import resource
import subprocess
import sys

import seccomp

CLONE_NEWNS = 0x00020000
NAMESPACE_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
                   | 0x00000080)  # mnt cgroup uts ipc user pid net time
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000
LIBC = ctypes.CDLL(None, use_errno=True)
INACCESSIBLE_DIR, INACCESSIBLE_FILE = "/run/unit-exec-inaccessible/dir", "/run/unit-exec-inaccessible/file"


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as info:
        return [line.split()[4] for line in info]


def apply_mounts(spec: dict) -> None:
    """ProtectSystem=strict, ProtectHome=read-only, PrivateTmp, Read*Paths, InaccessiblePaths, in a mount ns."""
    if LIBC.unshare(CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    _mount("--make-rslave", "/")
    # systemd binds an inaccessible node of the same type (mode 000) over each InaccessiblePaths= entry.
    os.makedirs(INACCESSIBLE_DIR, mode=0, exist_ok=True)
    os.close(os.open(INACCESSIBLE_FILE, os.O_CREAT, 0))
    if spec.get("read_only_root"):
        seen = set()
        for point in _mount_points():
            # API file systems stay writable under strict: the unit protects them with its own settings.
            if point in seen or point.split("/")[1] in ("proc", "sys", "dev"):
                continue
            seen.add(point)
            subprocess.run(["mount", "-o", "remount,bind,ro", point], check=False, capture_output=True)
    if spec.get("private_tmp"):
        for path in ("/tmp", "/var/tmp"):
            _mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", path)
    for path in spec.get("read_write", []):
        _mount("--bind", path, path)
        _mount("-o", "remount,bind,rw", path)
    for path in spec.get("read_only", []):
        if os.path.exists(path):
            _mount("--rbind", path, path)
            # Recursive, as systemd's: /sys's own submounts (tracefs, debugfs, cgroup, bpf) turn read-only too.
            for point in _mount_points():
                if point == path or point.startswith(path.rstrip("/") + "/"):
                    subprocess.run(["mount", "-o", "remount,bind,ro", point], check=False, capture_output=True)
    for path in spec.get("inaccessible", []):
        if os.path.exists(path):
            _mount("--bind", INACCESSIBLE_DIR if os.path.isdir(path) else INACCESSIBLE_FILE, path)


def build_filter(spec: dict) -> seccomp.SyscallFilter:
    """SystemCallFilter= as an allow list, with RestrictNamespaces=, MemoryDenyWriteExecute= and
    RestrictAddressFamilies= folded into the allowed calls' argument checks, as systemd does."""
    f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(spec["errno"]))
    allowed = set(spec["allow"])
    special = {"clone", "clone3", "unshare", "setns", "mmap", "mprotect", "pkey_mprotect", "shmat", "socket"}
    for name in sorted(allowed - special):
        try:
            f.add_rule(seccomp.ALLOW, name)
        except (RuntimeError, ValueError):
            continue  # another architecture's call (e.g. arm_fadvise64_64): systemd skips these too
    ns = spec.get("restrict_namespaces", False)
    for name in ("clone", "unshare"):
        if name in allowed:
            if ns:
                f.add_rule(seccomp.ALLOW, name, seccomp.Arg(0, seccomp.MASKED_EQ, NAMESPACE_FLAGS, 0))
            else:
                f.add_rule(seccomp.ALLOW, name)
    if "clone3" in allowed:
        # Its flags are in memory a filter cannot read: systemd answers ENOSYS so libc falls back to clone.
        f.add_rule(seccomp.ERRNO(errno.ENOSYS) if ns else seccomp.ALLOW, "clone3")
    if "setns" in allowed and not ns:
        f.add_rule(seccomp.ALLOW, "setns")
    mdwe = spec.get("memory_deny_write_execute", False)
    for name, arg, bad in (("mmap", 2, PROT_WRITE | PROT_EXEC), ("mprotect", 2, PROT_EXEC),
                           ("pkey_mprotect", 2, PROT_EXEC), ("shmat", 2, SHM_EXEC)):
        if name not in allowed:
            continue
        if not mdwe:
            f.add_rule(seccomp.ALLOW, name)
        elif bad == PROT_WRITE | PROT_EXEC:
            for ok in (0, PROT_WRITE, PROT_EXEC):
                f.add_rule(seccomp.ALLOW, name, seccomp.Arg(arg, seccomp.MASKED_EQ, bad, ok))
        else:
            f.add_rule(seccomp.ALLOW, name, seccomp.Arg(arg, seccomp.MASKED_EQ, bad, 0))
    if "socket" in allowed:
        families = spec.get("address_families")
        if families is None:
            f.add_rule(seccomp.ALLOW, "socket")
        else:
            for family in families:
                f.add_rule(seccomp.ALLOW, "socket", seccomp.Arg(0, seccomp.EQ, family))
    return f


def main() -> None:
    spec_path, sep, *command = sys.argv[1:]
    if sep != "--" or not command:
        sys.exit(__doc__)
    with open(spec_path) as fh:
        spec = json.load(fh)
    for procs in spec.get("cgroup_procs", []):
        with open(procs, "w") as fh:
            fh.write(str(os.getpid()))
    for name, value in spec.get("rlimits", {}).items():
        which = getattr(resource, f"RLIMIT_{name}")
        limit = resource.RLIM_INFINITY if value is None else value
        try:
            resource.setrlimit(which, (limit, limit))
        except ValueError:
            # Raising a hard limit takes CAP_SYS_RESOURCE, which a test host's root may lack (systemd has it).
            hard = resource.getrlimit(which)[1]
            resource.setrlimit(which, (hard if limit == resource.RLIM_INFINITY else min(limit, hard), hard))
    if "nice" in spec:
        os.setpriority(os.PRIO_PROCESS, 0, spec["nice"])
    if "umask" in spec:
        os.umask(spec["umask"])
    if spec.get("mounts"):
        apply_mounts(spec["mounts"])
    if "seccomp" in spec:
        build_filter(spec["seccomp"]).load()
    caps = ",".join(["-all", *(f"+{c}" for c in spec["capabilities"])])
    setpriv = ["setpriv", f"--bounding-set={caps}", "--inh-caps=-all", "--ambient-caps=-all"]
    if spec.get("no_new_privs"):
        setpriv.append("--no-new-privs")
    os.execvp("setpriv", [*setpriv, "--", *command])


if __name__ == "__main__":
    main()
