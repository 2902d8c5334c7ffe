"""Find a process's CPython image (libpython or a static interpreter) and its GC hook points."""

from __future__ import annotations

import bisect
import errno
import os
import re
import stat
import struct
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

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
_ALL_GC_SYMBOLS = tuple(dict.fromkeys(name for names in GC_SYMBOLS.values() for name in names))

# The file is the target's to craft: how much of it the parser will look at. A CPython image here is
# 6.5 MB (Debian's static python3.11) to 31 MB (libpython3.13 with debug info); its symbol and string
# tables together are about 1 MiB and its notes under 1 KiB. The parser reads only the header, the
# section table (at most 65,535 entries of 64 bytes: 4 MiB), the symbol tables with their string
# tables and the notes, through one descriptor, never the whole file.
MAX_IMAGE_BYTES = 512 * 2**20
MAX_TABLE_BYTES = 16 * 2**20    # symbol and string tables, all of them together
MAX_NOTE_BYTES = 2**20          # SHT_NOTE sections, all of them together

SHT_SYMTAB, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 2, 7, 8, 11
STT_FUNC = 2
SHN_UNDEF = 0
NT_STAPSDT = 3
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_NOTE = struct.Struct("<III")
_STAPSDT = struct.Struct("<QQQ")
# O_NONBLOCK: opening a FIFO for reading would wait for a writer. O_NOCTTY: a terminal must not
# become the daemon's. O_NOFOLLOW is added for a path the target names (below).
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


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
    """What the GC probe needs from one ELF file: where the functions it asked for are, and stapsdt notes."""

    functions: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))  # name -> file offset
    usdt: tuple[UsdtProbe, ...] = ()


@dataclass(frozen=True)
class PythonImage:
    pid: int
    path: str                          # as /proc/PID/maps names it (the target's mount namespace)
    # The same file reached from here, which the uprobes are placed through: /proc/PID/map_files/<range>
    # (exactly the mapped file, whatever the path names now) where the agent may open it, else
    # /proc/PID/root/<path> (/proc/PID/exe for a static interpreter).
    host_path: Path
    shared: bool                       # libpython.so, else a statically linked executable
    version: tuple[int, int] | None
    gc_symbols: tuple[str, ...] = ()   # uprobe points present in the file, in GC_SYMBOLS order
    gc_offsets: tuple[int, ...] = ()   # the file offset of each of gc_symbols
    usdt_probes: tuple[UsdtProbe, ...] = field(default=())  # python:gc__* sites present

    @property
    def has_gc_usdt(self) -> bool:
        names = {p.name for p in self.usdt_probes}
        return all(name in names for name in USDT_GC_PROBES)


def find_python_image(pid: int, proc_root: Path = Path("/proc")) -> PythonImage:
    """The file holding the CPython runtime in `pid`: its libpython, else its executable.

    Raises TargetGone, AccessDenied, or Unsupported (not Python, no GC hook point, or a file that
    is not a well-formed ELF image) with why.
    """
    proc = proc_root / str(pid)
    try:
        maps = (proc / "maps").read_text()
        exe = os.readlink(proc / "exe")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise TargetGone(f"process {pid} is gone ({exc})") from exc
    except PermissionError as exc:
        raise AccessDenied(f"cannot read /proc/{pid}/maps: {exc}") from exc

    for span, path in _mapped_files(maps).items():
        if match := _LIBPYTHON.search(os.path.basename(path)):
            version = (int(match[1]), int(match[2]))
            if path.endswith(" (deleted)"):
                raise Unsupported(f"pid {pid}: {path!r} was replaced on disk; cannot place uprobes")
            host, fd = _open_mapped(proc, span, path)
            return _image(pid, path, host, fd, shared=True, version=version)
    if exe.endswith(" (deleted)"):
        raise Unsupported(f"pid {pid}: its executable {exe!r} was replaced on disk; cannot place uprobes")
    # The kernel's link to the executable it runs: no path the target could swap in between.
    host = proc / "exe"
    fd = _open_image(host, follow=True)
    match = _EXE_VERSION.search(os.path.basename(exe))
    version = (int(match[1]), int(match[2])) if match else None
    return _image(pid, exe, host, fd, shared=False, version=version)


def _mapped_files(maps: str) -> dict[str, str]:
    """The first mapping of each file, as map_files names it ("start-end", no leading zeros) -> path."""
    spans: dict[str, str] = {}
    seen: set[str] = set()
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith("/") and parts[5] not in seen:
            seen.add(parts[5])
            start, _, end = parts[0].partition("-")
            spans[f"{int(start, 16):x}-{int(end, 16):x}"] = parts[5]
    return spans


def _open_mapped(proc: Path, span: str, path: str) -> tuple[Path, int]:
    """The mapped file, opened: through /proc/PID/map_files (exactly the file the process maps, even if
    the path now names another), else through the path in the process's root, symlinks refused."""
    exact = proc / "map_files" / span
    try:
        return exact, _open_image(exact, follow=True)
    except (AccessDenied, TargetGone):
        # Opening map_files needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE; a fixture tree has none.
        host = proc / "root" / path.lstrip("/")
        return host, _open_image(host, follow=False)


def _image(pid: int, path: str, host: Path, fd: int, shared: bool, version: tuple[int, int] | None) -> PythonImage:
    candidates = GC_SYMBOLS.get(version) if version else None
    if candidates is None:
        # Unknown version: any known name will do; they are specific to gcmodule.c.
        candidates = _ALL_GC_SYMBOLS
    try:
        symbols = _parse_elf(fd, f"pid {pid}: {path}", (*candidates, _PYTHON_MARKER))
    finally:
        os.close(fd)
    if not shared and _PYTHON_MARKER not in symbols.functions:
        raise Unsupported(f"pid {pid} ({path}) is not a Python interpreter: no libpython mapped and "
                          f"no {_PYTHON_MARKER} in the executable")
    present = tuple(name for name in candidates if name in symbols.functions)
    usdt = tuple(p for p in symbols.usdt if p.provider == USDT_PROVIDER and p.name in USDT_GC_PROBES)
    image = PythonImage(pid=pid, path=path, host_path=host, shared=shared, version=version,
                        gc_symbols=present, gc_offsets=tuple(symbols.functions[name] for name in present),
                        usdt_probes=usdt)
    if not image.has_gc_usdt and not present:
        shown = ".".join(map(str, version)) if version else "unknown version"
        raise Unsupported(f"pid {pid}: {path} (CPython {shown}) has neither USDT python:gc__start/gc__done "
                          f"nor a GC symbol ({', '.join(candidates)}); it was probably stripped")
    return image


def read_elf_symbols(path: Path, functions: Collection[str] = (_PYTHON_MARKER, *_ALL_GC_SYMBOLS)) -> ElfSymbols:
    """Where `functions` are defined (from .symtab and .dynsym) and the .note.stapsdt probes of a 64-bit ELF.

    A path the caller trusts (a symbolic link at it is followed). Raises TargetGone, AccessDenied, or
    Unsupported naming the file and what is wrong with it.
    """
    fd = _open_image(path, follow=True)
    try:
        return _parse_elf(fd, str(path), functions)
    finally:
        os.close(fd)


def _open_image(path: Path, follow: bool) -> int:
    """A descriptor on a regular file of at most MAX_IMAGE_BYTES; never blocks, never follows a last
    symbolic link unless `follow`."""
    try:
        fd = os.open(path, _OPEN_FLAGS | (0 if follow else os.O_NOFOLLOW))
    except FileNotFoundError as exc:
        raise TargetGone(f"{path} is gone ({exc})") from exc
    except PermissionError as exc:
        raise AccessDenied(f"cannot read {path}: {exc}") from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise Unsupported(f"{path} is a symbolic link; the file the process mapped was replaced") from exc
        raise Unsupported(f"cannot open {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsupported(f"{path} is not a regular file ({_file_kind(st.st_mode)}); not a CPython image")
        if st.st_size > MAX_IMAGE_BYTES:
            raise Unsupported(f"{path} is {st.st_size} bytes, more than the {MAX_IMAGE_BYTES} a CPython "
                              "image is read up to")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISFIFO: "a FIFO", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
             stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a directory"}
    return next((kind for test, kind in kinds.items() if test(mode)), f"mode {mode:o}")


class _Malformed(ValueError):
    """What is wrong with the file, in words; turned into Unsupported naming the file."""


class _Reader:
    """Reads ranges of one open file, each checked against the file's size and a byte budget."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.size = os.fstat(fd).st_size
        self._left = {"table": MAX_TABLE_BYTES, "note": MAX_NOTE_BYTES}

    def read(self, offset: int, size: int, what: str, budget: str | None = None) -> bytes:
        if offset > self.size or size > self.size - offset:
            raise _Malformed(f"{what} ({size} bytes at offset {offset:#x}) runs past the end of the file "
                             f"({self.size} bytes)")
        if budget is not None:
            if size > self._left[budget]:
                limit = MAX_TABLE_BYTES if budget == "table" else MAX_NOTE_BYTES
                raise _Malformed(f"{what} of {size} bytes takes its {budget}s past the {limit} bytes read")
            self._left[budget] -= size
        data = os.pread(self._fd, size, offset)
        if len(data) != size:
            raise _Malformed(f"{what}: the file shrank while it was read")
        return data


@dataclass(frozen=True)
class _Section:
    index: int
    type: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int

    def holds(self, vaddr: int) -> bool:
        return self.type != SHT_NOBITS and self.addr != 0 and self.addr <= vaddr < self.addr + self.size


def _parse_elf(fd: int, name: str, wanted: Collection[str]) -> ElfSymbols:
    try:
        return _parse(_Reader(fd), {n.encode() for n in wanted})
    except _Malformed as exc:
        raise Unsupported(f"{name} is not a usable ELF file: {exc}") from exc
    except OSError as exc:
        raise Unsupported(f"cannot read {name}: {exc.strerror or exc}") from exc


def _parse(reader: _Reader, wanted: set[bytes]) -> ElfSymbols:
    if reader.size < 64:
        raise _Malformed(f"{reader.size} bytes, too short for an ELF header")
    header = reader.read(0, 64, "ELF header")
    if header[:4] != b"\x7fELF":
        raise _Malformed("no ELF magic number")
    if header[4] != 2 or header[5] != 1:
        raise _Malformed("only 64-bit little-endian ELF is supported")
    shoff, = struct.unpack_from("<Q", header, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
    if shnum == 0:
        raise _Malformed("no section table")
    if shentsize != _SHDR.size:
        raise _Malformed(f"section headers of {shentsize} bytes, not {_SHDR.size}")
    table = reader.read(shoff, shnum * _SHDR.size, f"section table of {shnum} entries")
    sections = [_Section(i, s[1], s[3], s[4], s[5], s[6], s[9])
                for i, s in enumerate(_SHDR.iter_unpack(table))]

    # Allocated sections by address, to place a probe's address in the file (NOBITS ones have no bytes there).
    placed = sorted((sh for sh in sections if sh.type != SHT_NOBITS and sh.addr), key=lambda sh: sh.addr)
    starts = [sh.addr for sh in placed]

    def file_offset(vaddr: int) -> int | None:
        at = bisect.bisect_right(starts, vaddr) - 1
        if at < 0 or not placed[at].holds(vaddr):
            return None
        offset = vaddr - placed[at].addr + placed[at].offset
        return offset if offset < reader.size else None

    functions: dict[str, int] = {}
    usdt: list[UsdtProbe] = []
    for sh in sections:
        if sh.type in (SHT_SYMTAB, SHT_DYNSYM):
            functions.update(_functions(reader, sh, sections, wanted))
        elif sh.type == SHT_NOTE:
            notes = reader.read(sh.offset, sh.size, f"notes (section {sh.index})", budget="note")
            usdt.extend(_stapsdt(notes, sh.index, file_offset))
    return ElfSymbols(functions=MappingProxyType(functions), usdt=tuple(usdt))


def _functions(reader: _Reader, sh: _Section, sections: list[_Section], wanted: set[bytes]) -> dict[str, int]:
    """The `wanted` functions this symbol table defines, by file offset."""
    if sh.entsize != _SYM.size:
        raise _Malformed(f"symbol table (section {sh.index}) has {sh.entsize}-byte entries, not {_SYM.size}")
    if sh.link >= len(sections):
        raise _Malformed(f"symbol table (section {sh.index}) names string table {sh.link} of {len(sections)}")
    strtab = sections[sh.link]
    strings = reader.read(strtab.offset, strtab.size, f"string table (section {strtab.index})", budget="table")
    data = reader.read(sh.offset, sh.size, f"symbol table (section {sh.index})", budget="table")
    data = memoryview(data)[: len(data) - len(data) % _SYM.size]
    longest = max(map(len, wanted), default=0)
    found: dict[str, int] = {}
    for name_off, info, _, shndx, value, _ in _SYM.iter_unpack(data):
        # Undefined (imported) functions are named in .dynsym too: only definitions count.
        if info & 0xF != STT_FUNC or not name_off or shndx == SHN_UNDEF:
            continue
        # Only as far as the longest wanted name: a table without NULs must not cost a scan per symbol.
        name, nul, _ = strings[name_off:name_off + longest + 1].partition(b"\0")
        if not nul or name not in wanted:
            continue
        # A function is where its own section puts it; one outside the file cannot take a uprobe.
        home = sections[shndx] if shndx < len(sections) else None
        if home is not None and home.holds(value) and (offset := value - home.addr + home.offset) < reader.size:
            found[name.decode()] = offset
    return found


def _stapsdt(notes: bytes, index: int, file_offset: Callable[[int], int | None]) -> list[UsdtProbe]:
    # Prelinked files would need pc adjusted by .stapsdt.base's move; prelink is long gone.
    probes = []
    pos = 0
    while pos + _NOTE.size <= len(notes):
        namesz, descsz, kind = _NOTE.unpack_from(notes, pos)
        name_at = pos + _NOTE.size
        desc_at = name_at + (namesz + 3) // 4 * 4
        pos = desc_at + (descsz + 3) // 4 * 4
        if desc_at + descsz > len(notes):
            raise _Malformed(f"a note in section {index} runs past the section's end")
        if kind != NT_STAPSDT or notes[name_at:name_at + namesz].rstrip(b"\0") != b"stapsdt":
            continue
        desc = notes[desc_at:desc_at + descsz]
        strings = desc[_STAPSDT.size:].split(b"\0")
        if len(desc) < _STAPSDT.size or len(strings) < 2:
            raise _Malformed(f"a stapsdt note in section {index} is {descsz} bytes, too short for a probe")
        pc, _base, semaphore = _STAPSDT.unpack_from(desc)
        pc_offset = file_offset(pc)
        semaphore_offset = file_offset(semaphore) if semaphore else 0
        # A site or semaphore outside the file's contents cannot take a uprobe: as if the note were absent.
        if pc_offset is None or semaphore_offset is None:
            continue
        probes.append(UsdtProbe(strings[0].decode(errors="replace"), strings[1].decode(errors="replace"),
                                pc, semaphore, pc_offset, semaphore_offset))
    return probes
