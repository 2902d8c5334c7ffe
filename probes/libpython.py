"""Find a process's CPython image (libpython or a static interpreter) and its GC hook points."""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from analysis.errors import AccessDenied, TargetGone, Unsupported

# The C function each CPython line runs once per collection, whatever triggered it. Versions
# before 3.10 have compiler clones (collect.constprop.N); a call enters exactly one of them.
GC_SYMBOLS: dict[tuple[int, int], tuple[str, ...]] = {
    (2, 7): ("collect",),
    **{(3, minor): ("collect", "collect.constprop.0", "collect.constprop.1") for minor in range(6, 10)},
    **{(3, minor): ("gc_collect_main",) for minor in range(10, 14)},
}
USDT_PROVIDER = "python"
USDT_GC_PROBES = ("gc__start", "gc__done")

_LIBPYTHON = re.compile(r"libpython(\d+)\.(\d+)[a-z]*\.so")
_EXE_VERSION = re.compile(r"python(\d+)\.(\d+)")
# Exported by every CPython executable or library, so extension modules can link against it.
_PYTHON_MARKER = "Py_Initialize"

SHT_SYMTAB, SHT_NOTE, SHT_DYNSYM = 2, 7, 11
STT_FUNC = 2
SHN_UNDEF = 0
NT_STAPSDT = 3


@dataclass(frozen=True)
class UsdtProbe:
    provider: str
    name: str
    pc: int                 # link-time address of the probe site
    semaphore: int          # link-time address of its semaphore; 0 when the site has none
    pc_offset: int          # the same two as file offsets: what a uprobe and its ref_ctr take
    semaphore_offset: int


@dataclass(frozen=True)
class ElfSymbols:
    """What the GC probe needs from one ELF file: function names and stapsdt notes."""

    functions: frozenset[str] = frozenset()
    usdt: tuple[UsdtProbe, ...] = ()


@dataclass(frozen=True)
class PythonImage:
    pid: int
    path: str                          # as /proc/PID/maps names it (the target's mount namespace)
    host_path: Path                    # the same file reached from here: /proc/PID/root/<path>
    shared: bool                       # libpython.so, else a statically linked executable
    version: tuple[int, int] | None
    gc_symbols: tuple[str, ...] = ()   # uprobe points present in the file, in GC_SYMBOLS order
    usdt_probes: tuple[UsdtProbe, ...] = field(default=())  # python:gc__* sites present

    @property
    def has_gc_usdt(self) -> bool:
        names = {p.name for p in self.usdt_probes}
        return all(name in names for name in USDT_GC_PROBES)


def find_python_image(pid: int, proc_root: Path = Path("/proc")) -> PythonImage:
    """The file holding the CPython runtime in `pid`: its libpython, else its executable.

    Raises TargetGone, AccessDenied, or Unsupported (not Python, or no GC hook point) with why.
    """
    proc = proc_root / str(pid)
    try:
        maps = (proc / "maps").read_text()
        exe = os.readlink(proc / "exe")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise TargetGone(f"process {pid} is gone ({exc})") from exc
    except PermissionError as exc:
        raise AccessDenied(f"cannot read /proc/{pid}/maps: {exc}") from exc

    mapped = _mapped_files(maps)
    for path in mapped:
        if match := _LIBPYTHON.search(os.path.basename(path)):
            return _image(pid, proc, path, shared=True, version=(int(match[1]), int(match[2])))
    if exe.endswith(" (deleted)"):
        raise Unsupported(f"pid {pid}: its executable {exe!r} was replaced on disk; cannot place uprobes")
    host = proc / "root" / exe.lstrip("/")
    symbols = read_elf_symbols(host)
    if _PYTHON_MARKER not in symbols.functions:
        raise Unsupported(f"pid {pid} ({exe}) is not a Python interpreter: no libpython mapped and "
                          f"no {_PYTHON_MARKER} in the executable")
    match = _EXE_VERSION.search(os.path.basename(exe))
    version = (int(match[1]), int(match[2])) if match else None
    return _image(pid, proc, exe, shared=False, version=version, symbols=symbols)


def _mapped_files(maps: str) -> list[str]:
    paths = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/") and parts[5] not in paths:
            paths.append(parts[5])
    return paths


def _image(pid: int, proc: Path, path: str, shared: bool, version: tuple[int, int] | None,
           symbols: ElfSymbols | None = None) -> PythonImage:
    if path.endswith(" (deleted)"):
        raise Unsupported(f"pid {pid}: {path!r} was replaced on disk; cannot place uprobes")
    host = proc / "root" / path.lstrip("/")
    symbols = symbols or read_elf_symbols(host)
    candidates = GC_SYMBOLS.get(version) if version else None
    if candidates is None:
        # Unknown version: any known name will do; they are specific to gcmodule.c.
        candidates = tuple(dict.fromkeys(name for names in GC_SYMBOLS.values() for name in names))
    present = tuple(name for name in candidates if name in symbols.functions)
    usdt = tuple(p for p in symbols.usdt if p.provider == USDT_PROVIDER and p.name in USDT_GC_PROBES)
    image = PythonImage(pid=pid, path=path, host_path=host, shared=shared, version=version,
                        gc_symbols=present, usdt_probes=usdt)
    if not image.has_gc_usdt and not present:
        shown = ".".join(map(str, version)) if version else "unknown version"
        raise Unsupported(f"pid {pid}: {path} (CPython {shown}) has neither USDT python:gc__start/gc__done "
                          f"nor a GC symbol ({', '.join(candidates)}); it was probably stripped")
    return image


def read_elf_symbols(path: Path) -> ElfSymbols:
    """Function names from .symtab and .dynsym, and .note.stapsdt probes, of a 64-bit ELF."""
    try:
        with open(path, "rb") as f:
            return _parse_elf(f)
    except FileNotFoundError as exc:
        raise TargetGone(f"{path} is gone ({exc})") from exc
    except PermissionError as exc:
        raise AccessDenied(f"cannot read {path}: {exc}") from exc


def _parse_elf(f) -> ElfSymbols:
    ident = f.read(64)
    if ident[:4] != b"\x7fELF":
        raise Unsupported(f"{f.name} is not an ELF file")
    if ident[4] != 2 or ident[5] != 1:
        raise Unsupported(f"{f.name}: only 64-bit little-endian ELF is supported")
    shoff, = struct.unpack_from("<Q", ident, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", ident, 0x3A)
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]

    def read(index: int) -> bytes:
        _, _, _, _, offset, size, *_ = sections[index]
        f.seek(offset)
        return f.read(size)

    def file_offset(vaddr: int) -> int:
        for sh in sections:
            if sh[3] and sh[3] <= vaddr < sh[3] + sh[5]:
                return vaddr - sh[3] + sh[4]
        return 0

    functions: set[str] = set()
    usdt: list[UsdtProbe] = []
    for sh in sections:
        sh_type, sh_link, sh_entsize = sh[1], sh[6], sh[9]
        if sh_type in (SHT_SYMTAB, SHT_DYNSYM) and sh_entsize:
            strings = read(sh_link)
            f.seek(sh[4])
            data = f.read(sh[5])
            for name_off, info, _, shndx, _, _ in struct.iter_unpack("<IBBHQQ", data[: len(data) // 24 * 24]):
                # Undefined (imported) functions are named in .dynsym too: only definitions count.
                if info & 0xF == STT_FUNC and name_off and shndx != SHN_UNDEF:
                    functions.add(strings[name_off:strings.index(b"\0", name_off)].decode(errors="replace"))
        elif sh_type == SHT_NOTE:
            f.seek(sh[4])
            usdt.extend(_stapsdt(f.read(sh[5]), file_offset))
    return ElfSymbols(functions=frozenset(functions), usdt=tuple(usdt))


def _stapsdt(notes: bytes, file_offset: Callable[[int], int]) -> list[UsdtProbe]:
    # Prelinked files would need pc adjusted by .stapsdt.base's move; prelink is long gone.
    probes = []
    pos = 0
    while pos + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from("<III", notes, pos)
        name_at = pos + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        pos = desc_at + (descsz + 3) // 4 * 4
        if kind != NT_STAPSDT or notes[name_at:name_at + namesz].rstrip(b"\0") != b"stapsdt":
            continue
        pc, _base, semaphore = struct.unpack_from("<QQQ", notes, desc_at)
        provider, name, *_ = notes[desc_at + 24: desc_at + descsz].split(b"\0")
        probes.append(UsdtProbe(provider.decode(), name.decode(), pc, semaphore, file_offset(pc),
                                file_offset(semaphore) if semaphore else 0))
    return probes
