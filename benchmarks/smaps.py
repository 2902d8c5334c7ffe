"""Where a process's resident memory is, by mapping: /proc/PID/smaps grouped into what a reader can act on."""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass

# glibc's per-thread malloc arenas: each is a heap mapped at a 64 MiB boundary (HEAP_MAX_SIZE on 64-bit), the part
# in use read-write and the rest reserved with no access.
ARENA_HEAP_BYTES = 64 * 2**20
_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) [0-9a-f]+ \S+ \d+ ?(.*)$")


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    path: str
    rss: int
    anonymous: int
    shmem: int  # Shmem_PmdMapped is rare; the shared-memory pages counted in RssShmem show up in Rss of shared maps
    private_dirty: int
    swap: int

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def file_rss(self) -> int:
        """Resident pages of the mapped file that this process did not write (its RssFile share)."""
        return self.rss - self.anonymous if self.path.startswith("/") and not self.path.startswith("/SYSV") else 0


def parse(text: str) -> list[Mapping]:
    out: list[Mapping] = []
    head: tuple[int, int, str, str] | None = None
    fields: dict[str, int] = {}

    def flush() -> None:
        if head is not None:
            out.append(Mapping(head[0], head[1], head[2], head[3], fields.get("Rss", 0), fields.get("Anonymous", 0),
                               fields.get("Shmem_PmdMapped", 0), fields.get("Private_Dirty", 0),
                               fields.get("Swap", 0)))

    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            flush()
            head = (int(m.group(1), 16), int(m.group(2), 16), m.group(3), m.group(4).strip())
            fields = {}
            continue
        key, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[key] = int(parts[0]) * 1024
    flush()
    return out


def arena_starts(maps: list[Mapping]) -> set[int]:
    """Start addresses of glibc's non-main malloc arenas: an anonymous read-write mapping at a 64 MiB boundary whose
    reserved (---p) remainder, if any, ends the 64 MiB."""
    by_start = {m.start: m for m in maps}
    found = set()
    for m in maps:
        if m.path or m.perms != "rw-p" or m.start % ARENA_HEAP_BYTES:
            continue
        rest = by_start.get(m.end)
        end = rest.end if rest is not None and rest.perms == "---p" and not rest.path else m.end
        if end - m.start == ARENA_HEAP_BYTES:
            found.add(m.start)
    return found


COMPILER = ("libLLVM", "libclang", "libbcc")


def category(m: Mapping, arenas: set[int]) -> str:
    """A coarse owner for a mapping: the library family for file-backed ones, the allocator for anonymous ones."""
    p = m.path
    if p.startswith("/"):
        base = os.path.basename(p)
        if p.endswith(" (deleted)"):
            return "deleted file"
        if any(lib in base for lib in COMPILER):
            return "BCC compiler (libbcc, LLVM, clang)"
        if "openblas" in base.lower():
            return "OpenBLAS (numpy's, scipy's)"
        for pkg in ("scipy", "sklearn", "numpy"):
            if f"/{pkg}/" in p or f"/{pkg}." in p or f"{pkg}_" in base or f"/{pkg}.libs/" in p:
                return f"{pkg} extension modules"
        if "python3" in base or "libpython" in base:
            return "python interpreter"
        if p.endswith(".so") or ".so." in base or "/lib" in p:
            return "other shared libraries"
        return "other files"
    if p == "[heap]":
        return "[heap] (main arena, brk)"
    if p == "[stack]":
        return "[stack] (main thread)"
    if p.startswith("anon_inode:"):
        return p
    if p.startswith("["):
        return p
    if m.start in arenas:
        return "glibc thread arenas (anonymous)"
    if m.perms == "---p":
        return "guard / reserved"
    return "other anonymous (mmap: pymalloc arenas, big arrays, thread stacks)"


@dataclass(frozen=True)
class Row:
    what: str
    mappings: int
    rss: int
    anonymous: int
    file: int


def attribute(maps: list[Mapping]) -> list[Row]:
    """Rss per category, largest first."""
    arenas = arena_starts(maps)
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for m in maps:
        a = acc[category(m, arenas)]
        a[0] += 1
        a[1] += m.rss
        a[2] += m.anonymous
        a[3] += m.file_rss
    rows = [Row(k, v[0], v[1], v[2], v[3]) for k, v in acc.items()]
    return sorted(rows, key=lambda r: -r.rss)


def top(maps: list[Mapping], n: int = 15) -> list[Mapping]:
    return sorted(maps, key=lambda m: -m.rss)[:n]


def by_file(maps: list[Mapping]) -> list[tuple[str, int, int]]:
    """(path, Rss, Anonymous) summed over every mapping of each file, largest Rss first."""
    acc: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for m in maps:
        if m.path.startswith("/"):
            acc[m.path][0] += m.rss
            acc[m.path][1] += m.anonymous
    return sorted(((p, v[0], v[1]) for p, v in acc.items()), key=lambda t: -t[1])


def table(maps: list[Mapping]) -> str:
    mib = 2**20
    lines = ["| what | mappings | Rss MiB | anonymous MiB | file MiB |", "|---|---|---|---|---|"]
    rows = attribute(maps)
    for r in rows:
        lines.append(f"| {r.what} | {r.mappings} | {r.rss / mib:.1f} | {r.anonymous / mib:.1f} | {r.file / mib:.1f} |")
    total = sum(r.rss for r in rows)
    lines.append(f"| **total** | {sum(r.mappings for r in rows)} | **{total / mib:.1f}** | "
                 f"{sum(r.anonymous for r in rows) / mib:.1f} | {sum(r.file for r in rows) / mib:.1f} |")
    return "\n".join(lines)
