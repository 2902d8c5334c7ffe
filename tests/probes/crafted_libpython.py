"""Hostile copies of this machine's real libpython, and real processes that map them (tests of probes/libpython.py)."""

from __future__ import annotations

import errno
import os
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

# Maps the file argv[1] names, then with argv[2] puts that (a FIFO) over argv[1]'s path in a mount namespace of
# its own: /proc/PID/maps still names the path, which now leads to the FIFO. Then waits for stdin to close.
MAPPER_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror("open"); return 1; }
    if (mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) { perror("mmap"); return 1; }
    close(fd);
    if (argc > 2 && (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL)
                     || mount(argv[2], argv[1], NULL, MS_BIND, NULL))) {
        perror("mount");
        return 1;
    }
    puts("ready");
    fflush(stdout);
    while (getchar() != EOF)
        ;
    return 0;
}
"""

SECTION_HEADER = 64
SHT_SYMTAB = 2


def build_mapper(cc: Callable[[str, str], Path]) -> Path:
    """MAPPER_C compiled with the suite's `cc` fixture."""
    return cc(MAPPER_C, "mapper")


def real_libpython() -> Path:
    """The libpython this very interpreter maps (the venv's pyenv CPython 3.11 is built shared)."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if "/libpython3" in path and ".so" in path:
                return Path(path)
    raise AssertionError("this interpreter maps no libpython: the tests need a shared CPython build")


def section_table(data: bytes) -> tuple[int, int]:
    """(offset, number of entries) of an ELF64 file's section table."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shnum, = struct.unpack_from("<H", data, 0x3C)
    return shoff, shnum


def symtab_header(data: bytes) -> int:
    """The file offset of the .symtab section's header."""
    shoff, shnum = section_table(data)
    for i in range(shnum):
        at = shoff + i * SECTION_HEADER
        if struct.unpack_from("<I", data, at + 4)[0] == SHT_SYMTAB:
            return at
    raise AssertionError("no .symtab in the real libpython: was it stripped?")


def craft(directory: Path, kind: str) -> Path:
    """`directory`/libpython3.11.so: a copy of the real libpython made hostile in one way.

    truncated: cut in the middle of its section table. huge: its .symtab claims 2**62 bytes.
    fifo: an intact copy (the FIFO is put over its path by the mapper, see MAPPER_C).
    """
    data = bytearray(real_libpython().read_bytes())
    if kind == "truncated":
        shoff, _ = section_table(data)
        data = data[: shoff + 10 * SECTION_HEADER + 17]
    elif kind == "huge":
        struct.pack_into("<Q", data, symtab_header(data) + 0x20, 2**62)
    elif kind != "fifo":
        raise ValueError(f"unknown kind {kind!r}")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "libpython3.11.so"
    path.write_bytes(data)
    return path


class Mapper:
    """A real process mapping a crafted libpython (`kind` as in craft()), waiting until stopped."""

    def __init__(self, binary: Path, directory: Path, kind: str) -> None:
        self.kind = kind
        self.path = craft(directory, kind)
        argv = [str(binary), str(self.path)]
        if kind == "fifo":
            self.fifo = directory / "fifo"
            os.mkfifo(self.fifo)
            argv.append(str(self.fifo))
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise AssertionError(f"the {kind} mapper did not start (exit status {self.proc.returncode})")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()


def release_fifo_readers(fifo: Path) -> None:
    """Open `fifo` for writing, which lets a reader blocked opening it (the code before this fix) go on."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # ENXIO: no reader is waiting, nothing to release
            raise
