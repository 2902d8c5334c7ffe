"""benchmarks/smaps.py: /proc/PID/smaps grouped by owner (docs/BENCHMARKS.md, "Steady RSS by mapping")."""

from benchmarks import smaps

SMAPS = """\
55f343e6b000-55f348ef4000 rw-p 00000000 00:00 0                          [heap]
Rss:               81656 kB
Anonymous:         81656 kB
7f09cc000000-7f09cc202000 rw-p 00000000 00:00 0
Rss:                2052 kB
Anonymous:          2052 kB
7f09cc202000-7f09d0000000 ---p 00000000 00:00 0
Rss:                   0 kB
Anonymous:             0 kB
7f09d0100000-7f09d0200000 rw-p 00000000 00:00 0
Rss:                1024 kB
Anonymous:          1024 kB
7f09e0000000-7f09e0100000 r-xp 00000000 fe:01 7 /venv/lib/python3.11/site-packages/scipy/linalg/_flapack.cpython-311-x86_64-linux-gnu.so
Rss:                 900 kB
Anonymous:           100 kB
7f09e1000000-7f09e1800000 r--p 00000000 fe:01 8 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Rss:                7612 kB
Anonymous:          7612 kB
"""


def test_parse_and_group() -> None:
    maps = smaps.parse(SMAPS)
    assert [m.rss // 1024 for m in maps] == [81656, 2052, 0, 1024, 900, 7612]
    assert maps[4].file_rss == 800 * 1024 and maps[0].file_rss == 0
    # A 64 MiB-aligned read-write mapping whose reserved rest ends the 64 MiB is a glibc thread arena; an unaligned one
    # is not.
    assert smaps.arena_starts(maps) == {0x7F09CC000000}
    rows = {r.what: r for r in smaps.attribute(maps)}
    assert rows["[heap] (main arena, brk)"].rss == 81656 * 1024
    assert rows["glibc thread arenas (anonymous)"].rss == 2052 * 1024
    assert rows["scipy extension modules"].file == 800 * 1024
    assert rows["BCC compiler (libbcc, LLVM, clang)"].anonymous == 7612 * 1024
    assert rows["other anonymous (mmap: pymalloc arenas, big arrays, thread stacks)"].rss == 1024 * 1024
    assert "**total**" in smaps.table(maps)
