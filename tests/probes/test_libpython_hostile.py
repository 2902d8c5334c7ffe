"""probes/libpython.py against files the target crafts: truncated, oversized, a FIFO, a symlink, mutated at random.

Every one ends in Unsupported naming the file and what is wrong, promptly and without reading more than the
parser's bounds; a real process mapping one does not hang or crash the lookup.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.errors import Unsupported
from probes.libpython import MAX_IMAGE_BYTES, MAX_TABLE_BYTES, find_python_image, read_elf_symbols
from tests.probes.crafted_libpython import (
    Mapper,
    build_mapper,
    craft,
    real_libpython,
    release_fifo_readers,
    section_table,
    symtab_header,
)

DEBIAN_PYTHON = Path("/usr/bin/python3.11")
# Long enough for a loaded 2-core CI host; a parse of the real libpython takes about 3 ms.
PROMPT = 30.0


def _in_thread(fn, *args):
    """fn(*args) on a thread, joined with a deadline: the code before this fix blocked forever opening a FIFO."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn(*args)
        except BaseException as exc:  # handed back to the test, which asserts on it
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(PROMPT)
    return thread.is_alive(), out


# -- crafted files, read directly --------------------------------------------------------------------------------


def test_a_truncated_section_table_is_unsupported_with_what_is_wrong(tmp_path) -> None:
    path = craft(tmp_path, "truncated")
    with pytest.raises(Unsupported, match=rf"{path} is not a usable ELF file: section table of \d+ entries "
                                          r"\(\d+ bytes at offset 0x[0-9a-f]+\) runs past the end of the file"):
        read_elf_symbols(path)


def test_a_huge_section_size_is_refused_before_anything_is_read(tmp_path) -> None:
    path = craft(tmp_path, "huge")
    with pytest.raises(Unsupported, match=rf"{path} is not a usable ELF file: symbol table \(section \d+\) "
                                          rf"\({2**62} bytes at offset .*\) runs past the end of the file"):
        read_elf_symbols(path)


def test_a_symbol_table_within_the_file_but_past_the_budget_is_refused(tmp_path) -> None:
    """A .symtab claiming the whole 23 MB file: inside the file, but more than the 16 MiB the parser reads."""
    data = bytearray(real_libpython().read_bytes())
    assert len(data) > MAX_TABLE_BYTES
    header = symtab_header(data)
    struct.pack_into("<QQ", data, header + 0x18, 0, len(data) // 24 * 24)
    path = tmp_path / "libpython3.11.so"
    path.write_bytes(data)
    with pytest.raises(Unsupported, match=rf"symbol table \(section \d+\) of \d+ bytes takes its tables past the "
                                          rf"{MAX_TABLE_BYTES} bytes read"):
        read_elf_symbols(path)


@pytest.mark.parametrize(("content", "why"), [
    (b"", "0 bytes, too short for an ELF header"),
    (b"#!/bin/sh\n" * 10, "no ELF magic number"),
    (b"\x7fELF\x01\x01" + bytes(58), "only 64-bit little-endian ELF"),
    (b"\x7fELF\x02\x01" + bytes(58), "no section table"),
])
def test_small_and_foreign_files_are_unsupported(tmp_path, content, why) -> None:
    path = tmp_path / "libpython3.11.so"
    path.write_bytes(content)
    with pytest.raises(Unsupported, match=rf"{path} is not a usable ELF file: {why}"):
        read_elf_symbols(path)


def test_a_file_larger_than_any_cpython_image_is_not_read(tmp_path) -> None:
    path = tmp_path / "libpython3.11.so"
    with open(path, "wb") as f:
        f.truncate(MAX_IMAGE_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(Unsupported, match=rf"is {MAX_IMAGE_BYTES + 1} bytes, more than the {MAX_IMAGE_BYTES}"):
        read_elf_symbols(path)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_fifo_or_a_device_is_not_a_cpython_image_and_does_not_block(tmp_path, kind) -> None:
    if kind == "fifo":
        path = tmp_path / "libpython3.11.so"
        os.mkfifo(path)
        what = "a FIFO"
    else:
        path, what = Path("/dev/zero"), "a character device"
    hung, out = _in_thread(read_elf_symbols, path)
    if hung:
        release_fifo_readers(path)
        pytest.fail(f"reading {path} blocked for {PROMPT} s")
    assert isinstance(out.get("error"), Unsupported), out
    assert f"{path} is not a regular file ({what})" in str(out["error"])


def _fixture_proc(tmp_path: Path, lib: Path | None = None) -> Path:
    """A /proc/4242 tree whose process maps /lib/libpython3.11.so; `lib` is put at that path in its root."""
    root = tmp_path / "root"
    (root / "lib").mkdir(parents=True)
    if lib is not None:
        os.symlink(lib, root / "lib/libpython3.11.so")
    proc = tmp_path / "proc" / "4242"
    proc.mkdir(parents=True)
    (proc / "maps").write_text("7f0000000000-7f0000100000 r-xp 00000000 fe:01 42 /lib/libpython3.11.so\n")
    (proc / "root").symlink_to(root)
    (proc / "exe").symlink_to("/usr/bin/python3.11")
    return tmp_path / "proc"


def test_a_symlink_where_the_target_mapped_its_libpython_is_not_followed(tmp_path) -> None:
    """Without map_files, the path in the target's root is opened with O_NOFOLLOW: a link put there (to any file
    of the host) is refused, not read as root."""
    proc = _fixture_proc(tmp_path, lib=real_libpython())
    with pytest.raises(Unsupported, match=r"libpython3\.11\.so is a symbolic link; the file the process mapped "
                                          r"was replaced"):
        find_python_image(4242, proc_root=proc)


def test_a_fixture_tree_without_map_files_reads_the_path_in_the_targets_root(tmp_path) -> None:
    proc = _fixture_proc(tmp_path)
    (tmp_path / "root/lib/libpython3.11.so").write_bytes(real_libpython().read_bytes())
    image = find_python_image(4242, proc_root=proc)
    assert image.host_path == proc / "4242/root/lib/libpython3.11.so"
    assert image.gc_symbols == ("gc_collect_main",)


# -- real processes mapping crafted files ------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "why"), [
    ("truncated", r"section table of \d+ entries .* runs past the end of the file"),
    ("huge", rf"symbol table \(section \d+\) \({2**62} bytes at offset"),
])
def test_a_process_mapping_a_crafted_libpython_is_unsupported(require_root, cc, tmp_path, kind, why) -> None:
    mapper = Mapper(build_mapper(cc), tmp_path / kind, kind)
    try:
        with pytest.raises(Unsupported, match=rf"pid {mapper.pid}: {mapper.path} is not a usable ELF file: "
                                              rf"{why}"):
            find_python_image(mapper.pid)
    finally:
        mapper.stop()


def test_a_fifo_over_the_mapped_path_is_bypassed_through_map_files(require_root, cc, tmp_path) -> None:
    """Root reads exactly the file the process maps (/proc/PID/map_files), never the FIFO its path now leads to."""
    mapper = Mapper(build_mapper(cc), tmp_path, "fifo")
    try:
        swapped = Path(f"/proc/{mapper.pid}/root") / str(mapper.path).lstrip("/")
        assert swapped.is_fifo()  # the path the code before this fix opened, and blocked on
        hung, out = _in_thread(find_python_image, mapper.pid)
        if hung:
            release_fifo_readers(mapper.fifo)
            pytest.fail(f"locating pid {mapper.pid}'s libpython blocked for {PROMPT} s")
    finally:
        mapper.stop()
    image = out.get("value")
    assert image is not None, out
    assert image.host_path.parent == Path(f"/proc/{mapper.pid}/map_files")
    assert image.gc_symbols == ("gc_collect_main",) and image.gc_offsets


LOCATE = """
import sys
from probes.libpython import find_python_image
try:
    find_python_image(int(sys.argv[1]))
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_without_map_files_a_fifo_over_the_mapped_path_is_refused_at_once(require_root, cc, tmp_path) -> None:
    """An agent that may not open map_files (no CAP_SYS_ADMIN nor CAP_CHECKPOINT_RESTORE) opens the path: the FIFO
    there is refused, not waited on."""
    mapper = Mapper(build_mapper(cc), tmp_path, "fifo")
    drop = "-sys_admin,-checkpoint_restore"
    try:
        done = subprocess.run(["setpriv", "--inh-caps", drop, "--bounding-set", drop, sys.executable, "-c", LOCATE,
                               str(mapper.pid)], capture_output=True, text=True, timeout=PROMPT,
                              cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired:
        release_fifo_readers(mapper.fifo)
        pytest.fail(f"locating pid {mapper.pid}'s libpython without map_files blocked for {PROMPT} s")
    finally:
        mapper.stop()
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Unsupported ")
    assert f"/proc/{mapper.pid}/root{mapper.path} is not a regular file (a FIFO)" in done.stdout


def test_function_offsets_are_where_bcc_would_put_the_uprobes(require_bpf) -> None:
    """The gc probe attaches at the offsets the parser found (bcc never opens the target's file): they must be the
    offsets bcc's own symbol lookup gives, for every CPython on this machine."""
    import bcc

    images = [*sorted(Path("/root/.pyenv/versions").glob("*/lib/libpython*.so.1.0")), real_libpython()]
    if DEBIAN_PYTHON.exists():
        images.append(DEBIAN_PYTHON)
    checked = 0
    for image in images:
        for name, offset in read_elf_symbols(image).functions.items():
            _, addr = bcc.BPF._check_path_symbol(str(image).encode(), name.encode(), 0, -1)
            assert (image, name, offset) == (image, name, addr)
            checked += 1
    assert checked >= 2


# -- fuzz --------------------------------------------------------------------------------------------------------

# Fixed-width values a crafted field would take: zero, the edges of the file, the edges of the integer types.
EDGES = [0, 1, 23, 24, 63, 64, 0xFFFF, 2**31 - 1, 2**32 - 1, 2**32, 2**63, 2**64 - 1]


class _Mutable:
    """One on-disk copy of a real ELF file, changed per example and restored after it (copying 23 MB per
    example would make the fuzz minutes long)."""

    def __init__(self, source: Path, directory: Path) -> None:
        self.original = source.read_bytes()
        self.path = directory / source.name
        self.path.write_bytes(self.original)
        shoff, shnum = section_table(self.original)
        # Where the parser looks, so mutations land there far more often than at random in 23 MB.
        self.regions = [(0, 64), (shoff, shnum * 64)]
        for i in range(shnum):
            sh_type, = struct.unpack_from("<I", self.original, shoff + i * 64 + 4)
            offset, size = struct.unpack_from("<QQ", self.original, shoff + i * 64 + 0x18)
            if sh_type in (2, 3, 7, 11) and size:  # symbol, string, note tables
                self.regions.append((offset, min(size, 4096)))

    def apply(self, edits: list[tuple[int, bytes]], length: int | None) -> None:
        with open(self.path, "r+b") as f:
            for at, data in edits:
                f.seek(at)
                f.write(data[: len(self.original) - at])
            if length is not None:
                f.truncate(length)

    def restore(self, edits: list[tuple[int, bytes]], length: int | None) -> None:
        with open(self.path, "r+b") as f:
            for at, data in edits:
                f.seek(at)
                f.write(self.original[at:at + len(data)])
            if length is not None:
                f.seek(length)
                f.write(self.original[length:])


def _edits(image: _Mutable) -> st.SearchStrategy:
    def one(region: int) -> st.SearchStrategy:
        start, size = image.regions[region]
        value = st.one_of(
            st.binary(min_size=1, max_size=8),
            st.tuples(st.sampled_from(EDGES + [len(image.original)]), st.sampled_from([2, 4, 8])).map(
                lambda vw: (vw[0] % 2 ** (8 * vw[1])).to_bytes(vw[1], "little")))
        return st.tuples(st.integers(start, start + size - 1), value)

    return st.lists(st.integers(0, len(image.regions) - 1).flatmap(one), max_size=6)


def _lengths(image: _Mutable) -> st.SearchStrategy:
    edges = sorted({e for start, size in image.regions for e in (start, start + size // 2, start + size)})
    return st.one_of(st.none(), st.none(), st.integers(0, len(image.original)),
                     st.sampled_from(edges).flatmap(lambda e: st.integers(max(0, e - 70), e + 70)))


def _fuzz(image: _Mutable) -> None:
    @settings(max_examples=250, derandomize=True, database=None, deadline=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def check(data) -> None:
        edits = data.draw(_edits(image), label="edits")
        length = data.draw(_lengths(image), label="length")
        image.apply(edits, length)
        try:
            symbols = read_elf_symbols(image.path)
        except Unsupported as exc:
            assert str(image.path) in str(exc)  # names the file; the reason is the rest
        else:
            size = os.path.getsize(image.path)
            assert all(0 <= offset < size for offset in symbols.functions.values())
            assert all(p.pc_offset < size and p.semaphore_offset < size for p in symbols.usdt)
        finally:
            image.restore(edits, length)

    check()


def test_fuzz_mutated_and_truncated_real_libpython(tmp_path) -> None:
    """Any exception but Unsupported (struct.error, IndexError, MemoryError, a hang) fails this: before this fix,
    the first truncated copy raised struct.error."""
    _fuzz(_Mutable(real_libpython(), tmp_path))


def test_fuzz_mutated_and_truncated_static_python_with_usdt_notes(tmp_path) -> None:
    """Debian's static python3.11 carries the stapsdt notes the libpython here lacks."""
    if not DEBIAN_PYTHON.exists():
        pytest.skip(f"{DEBIAN_PYTHON} is not installed (Debian's python3.11 package)")
    _fuzz(_Mutable(DEBIAN_PYTHON, tmp_path))


def test_the_fuzz_copies_are_restored_between_examples(tmp_path) -> None:
    """The fuzz edits one copy in place: restoring it must give back the real file, or later examples fuzz junk."""
    image = _Mutable(real_libpython(), tmp_path)
    edits = [(5, b"\xff\xff"), (image.regions[1][0] + 3, b"\x00" * 8)]
    image.apply(edits, 1000)
    assert image.path.stat().st_size == 1000
    image.restore(edits, 1000)
    assert image.path.read_bytes() == image.original
    assert set(read_elf_symbols(image.path).functions) == {"Py_Initialize", "gc_collect_main"}

