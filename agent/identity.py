"""What a target runs (its identity): executable and build id, command line, Python, loaded distributions, model files,
allowlisted environment variables; read from /proc cheaply enough for every window (docs/changes.md).

How each part is read, and what it cannot see:
- executable: /proc/PID/exe (the kernel's link, valid after the file was deleted or replaced on disk); its GNU
  build id from the ELF notes, else its size and mtime.
- command line: the target's, redacted as everywhere (analysis.redact.redact_cmdline).
- Python version: the libpythonX.Y mapped, else the executable's name (pythonX.Y).
- distributions: every file a member maps (/proc/PID/maps: extension modules, bundled .so) or holds open
  (/proc/PID/fd) under a site-packages or dist-packages folder names a top-level package; its distribution is the
  `NAME-VERSION.dist-info` (or .egg-info) folder beside it whose name, or top_level.txt, says so. A pure-Python
  package keeps no file open or mapped once imported: it is not seen.
- model files: mapped or open files whose suffix is a model format (MODEL_SUFFIXES): path, size, mtime.
- environment: /proc/PID/environ (the environment the process was started with; later putenv calls are not seen),
  parsed one variable at a time: the value of a variable whose name does not match the allowlist is dropped as it
  is parsed, never kept, stored or shown.
- torch's threads: torch.get_num_threads() lives in the process's memory and no file says it; null with that
  reason (OMP_NUM_THREADS, in the default allowlist, is what sets it).
"""

from __future__ import annotations

import os
import re
import stat as stat_mod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from agent.buildid import NoBuildId, read_build_id
from agent.config import DEFAULT_ENV_ALLOWLIST
from agent.targets import Target
from analysis.redact import redact_cmdline

PROC = Path("/proc")
MODEL_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt", ".gguf", ".ggml", ".onnx", ".h5", ".msgpack")
_PACKAGE_DIRS = ("/site-packages/", "/dist-packages/")
_LIBPYTHON = re.compile(r"libpython(\d+\.\d+)[a-z]*\.so")
_EXE_PYTHON = re.compile(r"^python(\d+\.\d+)")
_DIST_DIR = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)(-py[^-]*)?\.(dist|egg)-info$")
# What a hostile target can make the agent hold: its paths, names and versions are its own to craft.
MAX_TEXT = 256
MAX_MAPS_BYTES = 8 << 20
MAX_ENVIRON_BYTES = 1 << 20
MAX_FDS = 4096
MAX_MODELS = 64
MAX_DISTS = 512
# A site-packages folder is listed once per change of its mtime; of a huge one only this many entries are indexed,
# and top_level.txt is read for at most this many distributions (the rest are named by their folder name alone).
MAX_DIST_ENTRIES = 20_000
MAX_TOP_LEVEL_READS = 10_000
MAX_SITES = 256
_TOP_LEVEL_BYTES = 4096


def printable(text: str, limit: int = MAX_TEXT) -> str:
    """`text` safe for a terminal and a log line: control characters shown as `?`, cut at `limit`."""
    out = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return out + "…" if len(text) > limit else out


@dataclass(frozen=True)
class ModelFile:
    path: str
    size: int
    mtime: float


@dataclass(frozen=True)
class Identity:
    """One process's (a family's leader and its members') identity. A part that could not be read is None, with
    its reason in `unknown`; diffs skip it, so a failed read is never a change."""

    exe: str | None = None
    build_id: str | None = None
    exe_size: int | None = None
    exe_mtime: float | None = None
    cmdline: str | None = None
    python: str | None = None
    dists: tuple[tuple[str, str], ...] | None = None       # (name, version), sorted
    models: tuple[ModelFile, ...] | None = None
    env: tuple[tuple[str, str], ...] | None = None         # allowlisted variables only, sorted
    torch_threads: int | None = None
    unknown: dict[str, str] = field(default_factory=dict)  # part -> why it is not known

    def to_dict(self) -> dict:
        return {"exe": self.exe, "build_id": self.build_id, "exe_size": self.exe_size, "exe_mtime": self.exe_mtime,
                "cmdline": self.cmdline, "python": self.python,
                "dists": None if self.dists is None else {n: v for n, v in self.dists},
                "models": None if self.models is None else [
                    {"path": m.path, "size": m.size, "mtime": m.mtime} for m in self.models],
                "env": None if self.env is None else dict(self.env),
                "torch_threads": self.torch_threads, "unknown": dict(sorted(self.unknown.items()))}

    @classmethod
    def from_dict(cls, data: dict) -> Identity:
        def pairs(value: dict | None) -> tuple[tuple[str, str], ...] | None:
            return None if value is None else tuple(sorted((str(k), str(v)) for k, v in value.items()))
        models = data.get("models")
        return cls(exe=data.get("exe"), build_id=data.get("build_id"), exe_size=data.get("exe_size"),
                   exe_mtime=data.get("exe_mtime"), cmdline=data.get("cmdline"), python=data.get("python"),
                   dists=pairs(data.get("dists")), env=pairs(data.get("env")),
                   models=None if models is None else tuple(
                       ModelFile(str(m["path"]), int(m["size"]), float(m["mtime"])) for m in models),
                   torch_threads=data.get("torch_threads"), unknown=dict(data.get("unknown") or {}))


@dataclass(frozen=True)
class PartChange:
    """One part of the identity that differs, `before` and `after` as shown: the part's value, or for a part of many
    items (env, models, dists) the changed items as `name=value`."""

    part: str
    before: str
    after: str

    def describe(self) -> str:
        return f"{self.part}: {self.before} → {self.after}"


# Parts in the order a diff lists them: what most often makes a build slower first.
_PARTS = ("build", "cmdline", "env", "models", "dists", "python", "torch_threads")


def diff(before: Identity, after: Identity) -> list[PartChange]:
    """What differs between two identities, part by part in _PARTS order; parts unknown on either side are skipped."""
    out: list[PartChange] = []
    if before.exe is not None and after.exe is not None:
        old, new = _build(before), _build(after)
        if old != new:
            out.append(PartChange("build", old, new))
    for part in ("cmdline", "python", "torch_threads"):
        old_value, new_value = getattr(before, part), getattr(after, part)
        if old_value is not None and new_value is not None and old_value != new_value:
            out.append(PartChange(part, str(old_value), str(new_value)))
    for part, old_items, new_items in (
            ("env", before.env, after.env), ("dists", before.dists, after.dists),
            ("models", _model_items(before.models), _model_items(after.models))):
        if old_items is None or new_items is None or old_items == new_items:
            continue
        old_map, new_map = dict(old_items), dict(new_items)
        # A process imports as it goes (a C extension on its first request): a distribution loaded by only one side is
        # not a change, one loaded by both in another version is.
        keys = sorted(set(old_map) & set(new_map) if part == "dists" else set(old_map) | set(new_map))
        changed = [k for k in keys if old_map.get(k) != new_map.get(k)]
        if not changed:
            continue
        out.append(PartChange(part, ", ".join(f"{k}={old_map.get(k, '(none)')}" for k in changed),
                              ", ".join(f"{k}={new_map.get(k, '(none)')}" for k in changed)))
    return sorted(out, key=lambda c: _PARTS.index(c.part))


def _build(identity: Identity) -> str:
    mark = (f"build id {identity.build_id[:12]}" if identity.build_id
            else f"{identity.exe_size} bytes, mtime {identity.exe_mtime}")
    return f"{identity.exe} ({mark})"


def _model_items(models: tuple[ModelFile, ...] | None) -> tuple[tuple[str, str], ...] | None:
    return None if models is None else tuple((m.path, f"{m.size} bytes, mtime {m.mtime:.0f}") for m in models)


def env_matcher(allowlist: Iterable[str]) -> Callable[[str], bool]:
    """Whether a variable's name is allowlisted: exact names, or a prefix ending in `*` (`VLLM_*`)."""
    exact = {p for p in allowlist if not p.endswith("*")}
    prefixes = tuple(p[:-1] for p in allowlist if p.endswith("*"))
    return lambda name: name in exact or (bool(prefixes) and name.startswith(prefixes))


def check_allowlist(patterns: Iterable[str]) -> None:
    """ValueError quoting the first pattern that is not a variable name (optionally ending in one `*`)."""
    for p in patterns:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", p):
            raise ValueError(f"not an environment variable name or NAME_* prefix, got {p!r}")


class Gone(Exception):
    """The process exited (or changed) while its identity was read; nothing of this read is kept."""


@dataclass
class _SitePackages:
    mtime_ns: int
    by_name: dict[str, tuple[str, str, str]]   # normalised name -> (name, version, folder)
    by_top: dict[str, tuple[str, str]] | None = None  # top-level package -> (name, version), built on first miss
    problems: list[str] = field(default_factory=list)


@dataclass
class _Cached:
    exe_link: str
    static: Identity
    dynamic_reads: int = 0


class IdentityReader:
    """Reads targets' identities; the parts fixed at exec (executable, build id, command line, environment, Python)
    are read again only when the process or its /proc/PID/exe link changed, the parts a process adds as it runs
    (distributions, model files) every `refresh_windows` calls."""

    def __init__(self, env_allowlist: Iterable[str] = DEFAULT_ENV_ALLOWLIST, refresh_windows: int = 12,
                 proc_root: Path = PROC) -> None:
        allow = tuple(env_allowlist)
        check_allowlist(allow)
        if refresh_windows < 1:
            raise ValueError(f"refresh_windows must be at least 1, got {refresh_windows!r}")
        self._allowed = env_matcher(allow)
        self._refresh = refresh_windows
        self._proc = proc_root
        self._static: dict[tuple[int, int], _Cached] = {}
        self._dynamic: dict[tuple[int, int], Identity] = {}
        self._sites: dict[str, _SitePackages] = {}

    def read(self, target: Target) -> Identity:
        """The target's identity now. Gone if its leader exited during the read: nothing half-read is returned."""
        key = target.key
        try:
            link = os.readlink(f"{self._proc}/{target.pid}/exe")
        except (FileNotFoundError, ProcessLookupError):
            raise Gone(f"process {target.pid} exited") from None
        except PermissionError as exc:
            link = f"(unreadable: {exc.strerror})"
        cached = self._static.get(key)
        if cached is None or cached.exe_link != link:
            cached = _Cached(exe_link=link, static=self._read_static(target, link))
            self._static[key] = cached
            self._dynamic.pop(key, None)
        dynamic = self._dynamic.get(key)
        if dynamic is None or cached.dynamic_reads % self._refresh == 0:
            dynamic = self._read_dynamic(target)
            self._dynamic[key] = dynamic
        cached.dynamic_reads += 1
        self._check_alive(target)
        static = cached.static
        return Identity(exe=static.exe, build_id=static.build_id, exe_size=static.exe_size,
                        exe_mtime=static.exe_mtime, cmdline=static.cmdline, python=static.python,
                        env=static.env, dists=dynamic.dists, models=dynamic.models, torch_threads=None,
                        unknown={**static.unknown, **dynamic.unknown,
                                 "torch_threads": "torch.get_num_threads() is in the process's memory, which is "
                                                  "not read; OMP_NUM_THREADS (allowlisted by default) sets it"})

    def forget(self, keep: Iterable[tuple[int, int]]) -> None:
        """Drop what is cached for processes not in `keep` (the targets' members now)."""
        live = set(keep)
        for cache in (self._static, self._dynamic):
            for key in [k for k in cache if k not in live]:
                del cache[key]

    def _check_alive(self, target: Target) -> None:
        # A pid reused during the read would give another process's parts: its start time must still be the target's.
        try:
            stat_text = _read_bytes(f"{self._proc}/{target.pid}/stat", 4096).decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            raise Gone(f"process {target.pid} exited during the read") from None
        rest = stat_text[stat_text.rfind(")") + 1:].split()
        if len(rest) < 20 or int(rest[19]) != target.start_time or rest[0] in ("Z", "X"):
            raise Gone(f"process {target.pid} exited during the read")

    def _read_static(self, target: Target, link: str) -> Identity:
        base = f"{self._proc}/{target.pid}"
        unknown: dict[str, str] = {}
        exe = printable(link)
        if link.endswith(" (deleted)"):
            unknown["exe_file"] = "the executable was deleted or replaced on disk after start; its size, mtime and " \
                                  "build id are those of the file the process runs"
        build_id = exe_size = exe_mtime = None
        try:
            fd = os.open(f"{base}/exe", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError):
            raise Gone(f"process {target.pid} exited") from None
        except OSError as exc:
            unknown["build"] = f"cannot open /proc/{target.pid}/exe: {exc.strerror}"
        else:
            try:
                st = os.fstat(fd)
                exe_size, exe_mtime = st.st_size, round(st.st_mtime, 3)
                build_id = read_build_id(fd) if stat_mod.S_ISREG(st.st_mode) else None
            except NoBuildId as exc:
                unknown["build_id"] = f"{exc}; the executable is known by its size and mtime"
            except OSError as exc:
                unknown["build_id"] = f"cannot read the executable: {exc.strerror}"
            finally:
                os.close(fd)
        python = None
        match = _EXE_PYTHON.match(os.path.basename(link.removesuffix(" (deleted)")))
        if match:
            python = match[1]
        else:
            try:
                libpython = next((m for p in self._mapped(target.pid) if (m := _LIBPYTHON.search(p))), None)
            except OSError:
                libpython = None
            if libpython is not None:
                python = libpython[1]
            else:
                unknown["python"] = "not a Python process: no libpython mapped and the executable is not pythonX.Y"
        env: tuple[tuple[str, str], ...] | None
        try:
            env = self._environ(target.pid)
        except (FileNotFoundError, ProcessLookupError):
            raise Gone(f"process {target.pid} exited") from None
        except OSError as exc:
            env = None
            unknown["env"] = f"cannot read /proc/{target.pid}/environ: {exc.strerror}"
        return Identity(exe=exe, build_id=build_id, exe_size=exe_size, exe_mtime=exe_mtime,
                        cmdline=printable(redact_cmdline(target.cmdline), 4096), python=python, env=env,
                        unknown=unknown)

    def _environ(self, pid: int) -> tuple[tuple[str, str], ...]:
        """The allowlisted variables, parsed from environ in chunks: any other value is dropped as it is read."""
        kept: dict[str, str] = {}
        fd = os.open(f"{self._proc}/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
        try:
            pending, total = b"", 0
            while total < MAX_ENVIRON_BYTES and (chunk := os.read(fd, 16384)):
                total += len(chunk)
                entries = (pending + chunk).split(b"\0")
                pending = entries.pop()
                for entry in entries:
                    self._keep_if_allowed(entry, kept)
                del entries, chunk
            self._keep_if_allowed(pending, kept)
        finally:
            os.close(fd)
        return tuple(sorted(kept.items()))

    def _keep_if_allowed(self, entry: bytes, kept: dict[str, str]) -> None:
        name, sep, value = entry.partition(b"=")
        if sep and self._allowed(name_text := name.decode(errors="replace")):
            kept[printable(name_text, 128)] = printable(value.decode(errors="replace"))

    def _mapped(self, pid: int) -> list[str]:
        """Files the process maps, each once (its maps' path column)."""
        raw = _read_bytes(f"{self._proc}/{pid}/maps", MAX_MAPS_BYTES).decode(errors="replace")
        seen: dict[str, None] = {}
        for line in raw.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].startswith("/"):
                seen[parts[5]] = None
        return list(seen)

    def _open_files(self, pid: int) -> list[str]:
        fd_dir = f"{self._proc}/{pid}/fd"
        out: list[str] = []
        for name in os.listdir(fd_dir)[:MAX_FDS]:
            try:
                path = os.readlink(f"{fd_dir}/{name}")
            except (FileNotFoundError, ProcessLookupError):
                continue  # closed between the listing and the read
            if path.startswith("/"):
                out.append(path)
        return out

    def _read_dynamic(self, target: Target) -> Identity:
        unknown: dict[str, str] = {}
        files: dict[str, str] = {}  # path as the process names it -> how it is held
        roots: dict[str, int] = {}  # the path -> the pid whose root it is reached through
        pids = [m.pid for m in target.members] or [target.pid]
        for pid in pids:
            for how, lister in (("mapped", self._mapped), ("open", self._open_files)):
                try:
                    for path in lister(pid):
                        files.setdefault(path, how)
                        roots.setdefault(path, pid)
                except (FileNotFoundError, ProcessLookupError):
                    if pid == target.pid:
                        raise Gone(f"process {pid} exited") from None
                except OSError as exc:
                    unknown.setdefault("dists", f"cannot list the {how} files of pid {pid}: {exc.strerror}")
        dists, problems = self._distributions(files, roots)
        if problems:
            unknown["dists_partial"] = "; ".join(problems[:3])
        models = self._models(files, roots, unknown)
        return Identity(dists=None if "dists" in unknown else dists, models=models, unknown=unknown)

    def _models(self, files: dict[str, str], roots: dict[str, int], unknown: dict[str, str]) -> tuple[ModelFile, ...]:
        out: list[ModelFile] = []
        for path in sorted(p for p in files if p.removesuffix(" (deleted)").lower().endswith(MODEL_SUFFIXES)):
            if len(out) >= MAX_MODELS:
                unknown["models_partial"] = f"more than {MAX_MODELS} model files; the first {MAX_MODELS} are listed"
                break
            try:
                # Through the process's root (its mount namespace); never following a last link it could swap in.
                st = os.stat(f"{self._proc}/{roots[path]}/root{path}", follow_symlinks=False)
            except OSError as exc:
                unknown.setdefault("models_partial", f"cannot stat {printable(path)}: {exc.strerror}")
                continue
            out.append(ModelFile(printable(path), st.st_size, round(st.st_mtime, 3)))
        return tuple(out)

    def _distributions(self, files: dict[str, str], roots: dict[str, int]) -> tuple[tuple[tuple[str, str], ...],
                                                                                     list[str]]:
        found: dict[str, str] = {}
        problems: list[str] = []
        tops: dict[tuple[str, str], int] = {}
        for path in files:
            for marker in _PACKAGE_DIRS:
                head, sep, rest = path.partition(marker)
                if sep:
                    top = rest.split("/", 1)[0]
                    tops.setdefault((head + marker.rstrip("/"), _top_name(top)), roots[path])
                    break
        unresolved: list[str] = []
        for (site, top), pid in sorted(tops.items()):
            if top.endswith(".dist-info") or top.endswith(".egg-info") or top in ("__pycache__", ""):
                continue
            index = self._site(site, pid, problems)
            if index is None:
                continue
            hit = index.by_name.get(_normalise(top))
            if hit is None:
                hit_pair = self._by_top(index, site, pid).get(top)
                if hit_pair is None:
                    problems.extend(p for p in index.problems if p not in problems)
                    unresolved.append(top)
            else:
                hit_pair = (hit[0], hit[1])
            if hit_pair is not None and len(found) < MAX_DISTS:
                found[printable(hit_pair[0], 128)] = printable(hit_pair[1], 128)
        if unresolved:
            problems.append(f"{len(unresolved)} package(s) with no dist-info naming them: "
                            + ", ".join(printable(t, 64) for t in unresolved[:5]))
        return tuple(sorted(found.items())), problems

    def _site(self, site: str, pid: int, problems: list[str]) -> _SitePackages | None:
        host = f"{self._proc}/{pid}/root{site}"
        try:
            st = os.stat(host)
        except OSError as exc:
            problems.append(f"cannot read {printable(site)}: {exc.strerror}")
            return None
        # By the folder itself, not its path: two containers' /usr/lib/python3/site-packages are different folders.
        key, mtime = f"{st.st_dev}:{st.st_ino}", st.st_mtime_ns
        cached = self._sites.get(key)
        if cached is not None and cached.mtime_ns == mtime:
            return cached
        by_name: dict[str, tuple[str, str, str]] = {}
        index = _SitePackages(mtime_ns=mtime, by_name=by_name)
        with os.scandir(host) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_DIST_ENTRIES:
                    index.problems.append(f"{printable(site)} has more than {MAX_DIST_ENTRIES} entries; "
                                          "only the first are indexed")
                    break
                match = _DIST_DIR.match(entry.name)
                if match:
                    by_name.setdefault(_normalise(match["name"]), (match["name"], match["version"], entry.name))
        if len(self._sites) >= MAX_SITES:
            self._sites.clear()  # containers come and go; their folders are indexed again when next seen
        self._sites[key] = index
        return index

    def _by_top(self, index: _SitePackages, site: str, pid: int) -> dict[str, tuple[str, str]]:
        """Top-level package -> distribution, from the top_level.txt files (built once per site-packages mtime)."""
        if index.by_top is None:
            index.by_top = {}
            for n, (name, version, folder) in enumerate(index.by_name.values()):
                if n >= MAX_TOP_LEVEL_READS:
                    index.problems.append(f"top_level.txt read for the first {MAX_TOP_LEVEL_READS} distributions")
                    break
                try:
                    text = _read_regular(f"{self._proc}/{pid}/root{site}/{folder}/top_level.txt", _TOP_LEVEL_BYTES)
                except OSError:
                    continue  # a distribution without one is known by its folder name only
                for line in text.decode(errors="replace").splitlines():
                    if line.strip():
                        index.by_top.setdefault(line.strip(), (name, version))
        return index.by_top


def _top_name(part: str) -> str:
    """The package a site-packages entry belongs to: `numpy.libs` and `x.cpython-311-x86_64-linux-gnu.so` name theirs."""
    part = part.removesuffix(" (deleted)")
    if part.endswith(".libs"):
        return part[:-5]
    if part.endswith((".so", ".py")):
        return part.split(".", 1)[0]
    return part


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _read_bytes(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks, size = [], 0
        while size < limit and (chunk := os.read(fd, min(1 << 20, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _read_regular(path: str, limit: int) -> bytes:
    """A small file the target controls: a regular file, never through a last symbolic link, never blocking."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, limit)
    finally:
        os.close(fd)


