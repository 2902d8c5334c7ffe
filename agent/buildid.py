"""The GNU build id of an ELF executable, from its PT_NOTE segments: a few hundred bytes read, never the whole file."""

from __future__ import annotations

import os
import struct

PT_NOTE = 4
NT_GNU_BUILD_ID = 3
_PHDR = struct.Struct("<IIQQQQQQ")
_NOTE = struct.Struct("<III")
# A build id is 20 bytes (sha1) and its note sits in the first program headers; a crafted file is read no further.
MAX_PHDRS = 256
MAX_NOTE_BYTES = 64 << 10


class NoBuildId(ValueError):
    """Why the file has no build id that can be read, in words."""


def read_build_id(fd: int) -> str:
    """The hex build id of the 64-bit little-endian ELF file open on `fd`; NoBuildId saying why not."""
    header = os.pread(fd, 64, 0)
    if len(header) < 64 or header[:4] != b"\x7fELF":
        raise NoBuildId("not an ELF file")
    if header[4] != 2 or header[5] != 1:
        raise NoBuildId("not a 64-bit little-endian ELF file")
    phoff, = struct.unpack_from("<Q", header, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", header, 0x36)
    if phentsize != _PHDR.size or not 0 < phnum <= MAX_PHDRS:
        raise NoBuildId(f"unusable program header table ({phnum} entries of {phentsize} bytes)")
    table = os.pread(fd, phnum * _PHDR.size, phoff)
    if len(table) != phnum * _PHDR.size:
        raise NoBuildId("program header table runs past the end of the file")
    budget = MAX_NOTE_BYTES
    for p_type, _, offset, _, _, filesz, _, _ in _PHDR.iter_unpack(table):
        if p_type != PT_NOTE:
            continue
        size = min(filesz, budget)
        budget -= size
        found = _gnu_build_id(os.pread(fd, size, offset))
        if found is not None:
            return found
    raise NoBuildId("no GNU build-id note")


def _gnu_build_id(notes: bytes) -> str | None:
    at = 0
    while at + _NOTE.size <= len(notes):
        namesz, descsz, kind = _NOTE.unpack_from(notes, at)
        name_at = at + _NOTE.size
        desc_at = name_at + (namesz + 3) // 4 * 4
        end = desc_at + (descsz + 3) // 4 * 4
        if end > len(notes):
            return None
        if kind == NT_GNU_BUILD_ID and notes[name_at:name_at + namesz] == b"GNU\0" and 0 < descsz <= 64:
            return notes[desc_at:desc_at + descsz].hex()
        at = end
    return None
