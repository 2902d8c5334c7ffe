"""A minimal protocol buffers writer (varints, length-delimited fields): enough for profile.proto."""

from __future__ import annotations

from collections.abc import Iterable


def varint(value: int) -> bytes:
    """Base-128 varint; negative int64 values take ten bytes as two's complement, as protobuf does."""
    if 0 <= value < 0x80:
        return bytes((value,))
    if value < 0:
        value += 1 << 64
    if value >= 1 << 64:
        raise ValueError(f"varint out of the 64-bit range: {value!r}")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def field_varint(number: int, value: int) -> bytes:
    """Wire type 0; zero is the default and is left out, like protobuf's encoders do."""
    if value == 0:
        return b""
    return varint(number << 3) + varint(value)


def field_bytes(number: int, payload: bytes) -> bytes:
    """Wire type 2: strings, sub-messages, packed repeated scalars."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def field_string(number: int, text: str) -> bytes:
    return field_bytes(number, text.encode("utf-8"))


def field_packed(number: int, values: Iterable[int]) -> bytes:
    payload = b"".join(varint(v) for v in values)
    return field_bytes(number, payload) if payload else b""
