"""pprof export: profile.proto (github.com/google/pprof/proto/profile.proto), gzipped, written by hand."""

from __future__ import annotations

import gzip
import re

from .profile import Profile
from .protobuf import field_bytes, field_packed, field_string, field_varint, varint

# py-spy names frames "function (file.py:line)"; pprof has fields for the file and the line.
_PY_FRAME = re.compile(r"^(?P<func>.+) \((?P<file>[^()]+?)(?::(?P<line>\d+))?\)$")


class _Strings:
    """profile.proto's string_table: index 0 must be the empty string."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {"": 0}

    def __call__(self, text: str) -> int:
        i = self.index.get(text)
        if i is None:
            i = self.index[text] = len(self.index)
        return i


def _value_type(strings: _Strings, kind: tuple[str, str]) -> bytes:
    return field_varint(1, strings(kind[0])) + field_varint(2, strings(kind[1]))


def _check_kind(name: str, kind: tuple[str, str]) -> None:
    if len(kind) != 2 or not all(isinstance(k, str) and k for k in kind):
        raise ValueError(f"{name} must be a (type, unit) pair of non-empty strings, got {kind!r}")


def to_pprof(profile: Profile, sample_type: tuple[str, str] = ("samples", "count"),
             period: int | None = None, period_type: tuple[str, str] = ("cpu", "nanoseconds")) -> bytes:
    """Gzipped profile.proto bytes.

    With `period` (e.g. 10_000_000 ns for 100 Hz sampling) a second value, count * period, is added
    under `period_type`: the [samples/count, cpu/nanoseconds] pair Go's CPU profiles carry and
    Parca and Pyroscope expect from a /debug/pprof/profile endpoint.
    """
    _check_kind("sample_type", sample_type)
    _check_kind("period_type", period_type)
    if period is not None and (isinstance(period, bool) or not isinstance(period, int) or period <= 0):
        raise ValueError(f"period must be a positive int, got {period!r}")
    strings = _Strings()
    body: list[bytes] = [field_bytes(1, _value_type(strings, sample_type))]
    if period is not None:
        body.append(field_bytes(1, _value_type(strings, period_type)))

    # Frame -> its location id, already varint-encoded: a sample's stack is then one bytes join.
    location_of: dict[str, bytes] = {}
    functions: list[bytes] = []
    locations: list[bytes] = []
    samples: list[bytes] = []
    for stack, count in profile.sorted_items():
        for frame in stack:
            if frame not in location_of:
                loc = len(location_of) + 1
                location_of[frame] = varint(loc)
                match = _PY_FRAME.match(frame)
                functions.append(_function(strings, loc, frame, match))
                line = int(match.group("line")) if match and match.group("line") else 0
                line_msg = field_varint(1, loc) + field_varint(2, line)
                locations.append(field_varint(1, loc) + field_bytes(4, line_msg))
        ids = b"".join(map(location_of.__getitem__, reversed(stack)))  # pprof lists the leaf first
        values = [count] if period is None else [count, count * period]
        samples.append(field_bytes(1, ids) + field_packed(2, values))

    body += [field_bytes(2, s) for s in samples]
    body += [field_bytes(4, loc) for loc in locations]
    body += [field_bytes(5, fn) for fn in functions]
    if profile.start is not None:
        body.append(field_varint(9, int(profile.start * 1e9)))
        if profile.end is not None and profile.end > profile.start:
            body.append(field_varint(10, int((profile.end - profile.start) * 1e9)))
    if period is not None:
        body.append(field_bytes(11, _value_type(strings, period_type)))
        body.append(field_varint(12, period))
    # The string table goes last: every index above has been handed out by now.
    body += [field_string(6, text) for text in strings.index]
    return gzip.compress(b"".join(body), mtime=0)


def _function(strings: _Strings, fid: int, frame: str, match: re.Match[str] | None) -> bytes:
    filename = strings(match.group("file")) if match else 0
    # The full frame text stays the name: it is what folded, SVG and speedscope show too.
    name = strings(frame)
    return field_varint(1, fid) + field_varint(2, name) + field_varint(3, name) + field_varint(4, filename)
