"""pprof export: decoded back by an independent protobuf reader, and read by Go's `go tool pprof`."""

import gzip
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field

import pytest

from analysis.flamegraph.folded import format_folded, parse_folded
from analysis.flamegraph.pprof import to_pprof
from analysis.flamegraph.profile import Profile
from analysis.flamegraph.protobuf import varint
from tests.analysis.hostile_profiles import random_hostile_profile

FOLDED = (
    "MainThread;serve (server.py:40);forward (model.py:12) 120\n"
    "MainThread;serve (server.py:40);tokenize (tok.py:3) 30\n"
    "MainThread;serve (server.py:40) 7\n"
    "MainThread;<script>alert(1)</script>;x&y\"q' 4\n"
    "swapper;do_idle_[k] 9\n"
)


# --- a small protobuf reader written from the wire format spec, not from our writer -------------

def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(buf: bytes):
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            length, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        else:
            raise AssertionError(f"unexpected wire type {wire} for field {number}")
        yield number, wire, value


def _ints(wire: int, value) -> list[int]:
    if wire == 0:
        return [value]
    out, pos = [], 0
    while pos < len(value):
        v, pos = _read_varint(value, pos)
        out.append(v)
    return out


@dataclass
class Decoded:
    sample_types: list[tuple[str, str]] = field(default_factory=list)
    samples: list[tuple[list[int], list[int]]] = field(default_factory=list)
    functions: dict[int, tuple[str, str]] = field(default_factory=dict)
    locations: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    period: int = 0
    period_type: tuple[str, str] | None = None
    time_nanos: int = 0
    duration_nanos: int = 0

    def stacks(self) -> Profile:
        out = Profile()
        for locs, values in self.samples:
            names = [self.functions[self.locations[loc][0][0]][0] for loc in locs]
            out.add(reversed(names), values[0])
        return out


def decode_pprof(data: bytes) -> Decoded:
    raw = gzip.decompress(data)
    strings: list[str] = []
    later = []
    for number, wire, value in _fields(raw):
        if number == 6:
            strings.append(value.decode("utf-8"))
        else:
            later.append((number, wire, value))
    assert strings[0] == "", "string_table[0] must be empty"
    out = Decoded()

    def value_type(buf: bytes) -> tuple[str, str]:
        f = {n: v for n, _, v in _fields(buf)}
        return strings[f.get(1, 0)], strings[f.get(2, 0)]

    for number, wire, value in later:
        if number == 1:
            out.sample_types.append(value_type(value))
        elif number == 2:
            locs, vals = [], []
            for n, w, v in _fields(value):
                (locs if n == 1 else vals if n == 2 else []).extend(_ints(w, v))
            out.samples.append((locs, vals))
        elif number == 4:
            f = list(_fields(value))
            lid = next(v for n, _, v in f if n == 1)
            lines = []
            for n, _, v in f:
                if n == 4:
                    lf = {ln: lv for ln, _, lv in _fields(v)}
                    lines.append((lf.get(1, 0), lf.get(2, 0)))
            out.locations[lid] = lines
        elif number == 5:
            f = {n: v for n, _, v in _fields(value)}
            out.functions[f[1]] = (strings[f.get(2, 0)], strings[f.get(4, 0)])
        elif number == 9:
            out.time_nanos = value
        elif number == 10:
            out.duration_nanos = value
        elif number == 11:
            out.period_type = value_type(value)
        elif number == 12:
            out.period = value
    return out


# --- tests --------------------------------------------------------------------------------------

def test_varint_matches_the_protobuf_spec_examples():
    assert varint(0) == b"\x00"
    assert varint(1) == b"\x01"
    assert varint(150) == b"\x96\x01"
    assert varint(300) == b"\xac\x02"
    assert varint(-1) == b"\xff" * 9 + b"\x01"
    with pytest.raises(ValueError, match=str(1 << 64)):
        varint(1 << 64)


def test_round_trip_through_our_pprof_gives_the_same_counts():
    prof = parse_folded(FOLDED)
    dec = decode_pprof(to_pprof(prof))
    assert dec.sample_types == [("samples", "count")]
    back = dec.stacks()
    assert back.stacks == prof.stacks
    assert format_folded(back) == format_folded(prof)


def test_period_adds_the_cpu_nanoseconds_value_like_go_cpu_profiles():
    prof = parse_folded(FOLDED)
    prof.start, prof.end = 1_700_000_000.0, 1_700_000_010.0
    dec = decode_pprof(to_pprof(prof, period=10_000_000))
    assert dec.sample_types == [("samples", "count"), ("cpu", "nanoseconds")]
    assert dec.period_type == ("cpu", "nanoseconds") and dec.period == 10_000_000
    assert all(vals[1] == vals[0] * 10_000_000 for _, vals in dec.samples)
    assert dec.time_nanos == 1_700_000_000 * 10**9
    assert dec.duration_nanos == 10 * 10**9


def test_py_spy_frames_carry_file_and_line():
    dec = decode_pprof(to_pprof(parse_folded("main (app.py:10);work (lib/w.py:77) 3\n")))
    by_name = {name: (fid, filename) for fid, (name, filename) in dec.functions.items()}
    fid, filename = by_name["work (lib/w.py:77)"]
    assert filename == "lib/w.py"
    assert [line for lines in dec.locations.values() for f, line in lines if f == fid] == [77]


def test_output_is_deterministic_gzip():
    prof = parse_folded(FOLDED)
    assert to_pprof(prof) == to_pprof(parse_folded(FOLDED))
    data = to_pprof(prof)
    assert data[:2] == b"\x1f\x8b"
    # RFC 1952: bytes 4..7 are MTIME; 0 (no time stamp) is what makes the bytes the same on every run.
    assert data[4:8] == b"\x00\x00\x00\x00"


@pytest.mark.parametrize("kwargs, match", [
    ({"period": 0}, "period must be a positive int, got 0"),
    ({"period": 1.5}, "got 1.5"),
    ({"sample_type": ("samples",)}, r"\('samples',\)"),
    ({"sample_type": ("", "count")}, "''"),
])
def test_bad_arguments_are_refused_with_the_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        to_pprof(Profile({("a",): 1}), **kwargs)


def _go_pprof(tmp_path, *args: str) -> str:
    go = shutil.which("go")
    if go is None:
        pytest.fail("go is missing; 'make setup' installs Debian's golang-go for this test")
    home = tmp_path / "gohome"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home), "GOCACHE": str(home / "cache"), "GOFLAGS": "",
           "PPROF_TMPDIR": str(home)}
    proc = subprocess.run([go, "tool", "pprof", *args], check=False, capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _top_rows(text: str) -> dict[str, tuple[int, int]]:
    """`-top` rows: flat flat% sum% cum cum% name -> {name: (flat, cum)}."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"^\s*(\d+)\s+[\d.]+%\s+[\d.]+%\s+(\d+)\s+[\d.]+%\s+(.+)$", line)
        if m:
            rows[m.group(3)] = (int(m.group(1)), int(m.group(2)))
    return rows


def test_go_tool_pprof_top_reads_our_profile_with_our_counts(tmp_path):
    prof = parse_folded(FOLDED)
    path = tmp_path / "profile.pb.gz"
    path.write_bytes(to_pprof(prof, period=10_000_000))
    out = _go_pprof(tmp_path, "-top", "-nodefraction=0", "-sample_index=samples", str(path))
    assert "Showing nodes accounting for 170, 100% of 170 total" in out
    rows = _top_rows(out)
    assert rows["forward (model.py:12)"] == (120, 120)
    assert rows["tokenize (tok.py:3)"] == (30, 30)
    assert rows["serve (server.py:40)"] == (7, 157)
    assert rows["MainThread"] == (0, 161)
    assert rows["do_idle_[k]"] == (9, 9)
    assert sum(flat for flat, _ in rows.values()) == 170


def test_go_tool_pprof_sees_cpu_time_from_the_period(tmp_path):
    path = tmp_path / "cpu.pb.gz"
    path.write_bytes(to_pprof(parse_folded(FOLDED), period=10_000_000))
    out = _go_pprof(tmp_path, "-top", "-sample_index=cpu", "-unit=ms", str(path))
    assert "of 1700ms total" in out, out


def test_go_tool_pprof_raw_keeps_hostile_names_intact(tmp_path):
    path = tmp_path / "hostile.pb.gz"
    path.write_bytes(to_pprof(parse_folded(FOLDED)))
    out = _go_pprof(tmp_path, "-raw", str(path))
    # pprof shortens C++-looking names for display but -raw also prints the full system name.
    assert "<script>alert(1)</script>" in out
    assert "x&y\"q'" in out



@pytest.mark.parametrize("seed", range(30))
def test_random_hostile_profiles_round_trip_through_pprof(seed):
    prof = random_hostile_profile(seed)
    assert decode_pprof(to_pprof(prof, period=1_000_000)).stacks().stacks == prof.stacks
