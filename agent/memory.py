"""Give back the file pages the agent touched only while starting up (issue 33, docs/BENCHMARKS.md "Memory").

Starting an agent maps and reads far more library code than its steady loop runs: module initialisation of the
~1,000 scipy and scikit-learn modules the detector's first fit imports, BCC's compiler, numpy's. Those pages are
clean copies of files on disk. Once the detector has made its first fit, `page_out_startup_files` asks the kernel to
reclaim them (`MADV_PAGEOUT`): a page no other process maps leaves this process and the page cache; one that the
steady loop needs again is read back from disk once, on its next use (measured: ~4 MiB come back over the next
refits; docs/BENCHMARKS.md). Nothing is lost: the kernel only reclaims clean file pages here, and mappings holding
pages the process wrote (relocated or written data) are not advised at all, so with swap on nothing is swapped."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("infersight.memory")

MADV_PAGEOUT = 21  # Linux >= 5.4; older kernels answer EINVAL and nothing changes
# glibc's mallopt parameters, and their defaults on 64-bit.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
DEFAULT_THRESHOLD = 128 * 1024


def pin_malloc_thresholds(threshold: int = DEFAULT_THRESHOLD) -> bool:
    """Keep glibc's mmap and trim thresholds at their defaults for the agent's life; False where libc is not glibc.

    glibc raises both by itself each time a large block it had mmap'd is freed (the mmap threshold to that block's
    size, up to 32 MiB, and the trim threshold to twice that). After the BPF compile and the first windows freed a
    few such blocks, every thread's malloc arena kept up to twice that size of freed memory resident at its top,
    never trimmed: in a default agent the main heap held ~80 MiB and seven thread arenas exactly 2 MiB each
    (docs/BENCHMARKS.md, "Memory"). Setting the thresholds (even to their defaults) turns the adjustment off: blocks
    over 128 KiB are mmap'd and unmapped when freed, and a heap top over 128 KiB free is given back."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(M_MMAP_THRESHOLD, threshold)) and bool(mallopt(M_TRIM_THRESHOLD, threshold))


def trim_heap() -> None:
    """Give back the free pages inside every malloc arena (malloc_trim(0)), not only at the heaps' tops."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@dataclass(frozen=True)
class FileMapping:
    start: int
    end: int
    path: str
    rss_bytes: int


def clean_file_mappings(smaps_lines: Iterable[str]) -> list[FileMapping]:
    """Read-only or executable private mappings of regular files with resident pages and no anonymous (written)
    page, from the lines of /proc/PID/smaps (read line by line: the text of ~1,500 mappings is ~1 MB)."""
    found: list[FileMapping] = []
    current: dict | None = None

    def close() -> None:
        if current is not None and current["rss"] > 0 and current["anon"] == 0:
            found.append(FileMapping(current["start"], current["end"], current["path"], current["rss"]))

    for line in smaps_lines:
        head = line.rstrip("\n").split(maxsplit=5)
        if not head:
            continue
        if "-" in head[0] and not head[0].endswith(":"):  # "lo-hi perms offset dev inode path"
            close()
            current = None
            path = head[5] if len(head) > 5 else ""
            perms = head[1]
            if (path.startswith("/") and not path.startswith(("/dev/", "/memfd:", "/SYSV")) and perms[1] == "-"
                    and perms[3] == "p"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                current = {"start": lo, "end": hi, "path": path, "rss": 0, "anon": 0}
        elif current is not None and head[0] in ("Rss:", "Anonymous:") and len(head) >= 2:
            current["rss" if head[0] == "Rss:" else "anon"] = int(head[1]) * 1024
    close()
    return found


def rss_file_bytes(status: Path = Path("/proc/self/status")) -> int | None:
    try:
        for line in status.read_text().splitlines():
            if line.startswith("RssFile:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def page_out_startup_files(smaps: Path = Path("/proc/self/smaps"), status: Path = Path("/proc/self/status")) -> int:
    """MADV_PAGEOUT on this process's clean file mappings; returns the bytes of RssFile that left (0 when the kernel
    or libc cannot, or nothing left)."""
    before = rss_file_bytes(status)
    try:
        with smaps.open() as lines:
            mappings = clean_file_mappings(lines)
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    refused = 0
    for m in mappings:
        if libc.madvise(m.start, m.end - m.start, MADV_PAGEOUT) != 0:
            refused += 1  # EINVAL: a kernel without MADV_PAGEOUT, or a locked mapping; ENOMEM: unmapped meanwhile
    after = rss_file_bytes(status)
    freed = max(0, before - after) if before is not None and after is not None else 0
    log.info("paged out %.1f MiB of start-up file pages (%d mappings advised, %d refused)", freed / 2**20,
             len(mappings) - refused, refused)
    return freed
