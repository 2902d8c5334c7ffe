"""Member offsets of kernel structs, read from the running kernel's own BTF (/sys/kernel/btf/vmlinux).

The probes are compiled against whatever headers the host has, which need not match the running kernel (the CI
host links Debian's 6.1 tree for a 6.18 kernel): a struct's layout from those headers is not the kernel's. BTF is
the kernel's own description of its types, so an offset read here is the running kernel's, whatever the headers
say. A program that needs one fact a struct holds (probes/delivery.py: a socket's network namespace) gets the
offsets as #defines and reads with `bpf_probe_read_kernel`, which returns an error instead of faulting on a bad
address (docs/kernel.md, "Rules every probe keeps").

Only what member lookups need is decoded: the header, every type's kind and size (to step over it), and the
members of structs and unions. Format: the kernel's Documentation/bpf/btf.rst.
"""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")

BTF_MAGIC = 0xEB9F
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM = 1, 2, 3, 4, 5, 6
KIND_FWD, KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT = 7, 8, 9, 10, 11
KIND_FUNC, KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_FLOAT = 12, 13, 14, 15, 16
KIND_DECL_TAG, KIND_TYPE_TAG, KIND_ENUM64 = 17, 18, 19
# Bytes that follow a type's 12-byte header: fixed, or per member (vlen).
_EXTRA_FIXED = {KIND_INT: 4, KIND_ARRAY: 12, KIND_VAR: 4, KIND_DECL_TAG: 4}
_EXTRA_PER_MEMBER = {KIND_STRUCT: 12, KIND_UNION: 12, KIND_ENUM: 8, KIND_FUNC_PROTO: 8, KIND_DATASEC: 12,
                     KIND_ENUM64: 12}
# Kinds a member's type is followed through to reach the struct or union it names.
_QUALIFIERS = (KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG)


class BtfError(Exception):
    """No BTF, a format this reader does not know, or a struct or member it does not hold."""


@dataclass(frozen=True)
class Member:
    name: str
    type_id: int
    bit_offset: int
    bitfield_size: int  # 0: not a bitfield


@dataclass(frozen=True)
class BtfType:
    kind: int
    name: str
    size_or_type: int  # size for structs, unions, ints, enums; the referenced type id for ptr/typedef/qualifiers
    members: tuple[Member, ...] = ()


class Btf:
    """The types of one BTF blob (vmlinux: no base types), by id (1-based; 0 is void)."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 24:
            raise BtfError("BTF shorter than its header")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != BTF_MAGIC:
            raise BtfError(f"not little-endian BTF (magic {magic:#x})")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        types_at, strings_at = hdr_len + type_off, hdr_len + str_off
        if types_at + type_len > len(data) or strings_at + str_len > len(data):
            raise BtfError("BTF sections run past its end")
        strings = data[strings_at:strings_at + str_len]

        def name_of(off: int) -> str:
            end = strings.index(b"\0", off)
            return strings[off:end].decode()

        self.types: list[BtfType | None] = [None]  # id 0: void
        self._by_name: dict[tuple[int, str], int] = {}
        pos, end = types_at, types_at + type_len
        while pos < end:
            name_off, info, size_or_type = struct.unpack_from("<III", data, pos)
            pos += 12
            kind, vlen, kind_flag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
            members: tuple[Member, ...] = ()
            if kind in (KIND_STRUCT, KIND_UNION):
                found = []
                for i in range(vlen):
                    m_name, m_type, m_off = struct.unpack_from("<III", data, pos + 12 * i)
                    bits, size = (m_off & 0xFFFFFF, m_off >> 24) if kind_flag else (m_off, 0)
                    found.append(Member(name_of(m_name), m_type, bits, size))
                members = tuple(found)
            if kind in _EXTRA_FIXED:
                pos += _EXTRA_FIXED[kind]
            elif kind in _EXTRA_PER_MEMBER:
                pos += _EXTRA_PER_MEMBER[kind] * vlen
            elif kind not in (KIND_PTR, KIND_FWD, KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT,
                              KIND_FUNC, KIND_FLOAT, KIND_TYPE_TAG):
                raise BtfError(f"unknown BTF kind {kind} at type {len(self.types)}")
            name = name_of(name_off) if kind in (KIND_STRUCT, KIND_UNION, KIND_TYPEDEF) else ""
            self.types.append(BtfType(kind, name, size_or_type, members))
            if name and kind in (KIND_STRUCT, KIND_UNION):
                self._by_name.setdefault((kind, name), len(self.types) - 1)

    def struct_id(self, name: str) -> int:
        for kind in (KIND_STRUCT, KIND_UNION):
            if (kind, name) in self._by_name:
                return self._by_name[(kind, name)]
        raise BtfError(f"no struct or union {name!r} in this kernel's BTF")

    def _resolve(self, type_id: int) -> int:
        """Follow typedefs and qualifiers to the type they name."""
        for _ in range(64):
            t = self.types[type_id]
            if t is None or t.kind not in _QUALIFIERS:
                return type_id
            type_id = t.size_or_type
        raise BtfError(f"type {type_id}: a chain of typedefs too long")

    def _member(self, type_id: int, name: str) -> tuple[int, int]:
        """(bit offset, type id) of member `name` of struct/union `type_id`, looking inside anonymous members."""
        t = self.types[self._resolve(type_id)]
        if t is None or t.kind not in (KIND_STRUCT, KIND_UNION):
            raise BtfError(f"member {name!r} asked of a type that is not a struct or union")
        for m in t.members:
            if m.name == name:
                if m.bitfield_size:
                    raise BtfError(f"member {name!r} is a bitfield")
                return m.bit_offset, m.type_id
        for m in t.members:
            if not m.name:
                inner = self.types[self._resolve(m.type_id)]
                if inner is not None and inner.kind in (KIND_STRUCT, KIND_UNION):
                    try:
                        bits, found = self._member(m.type_id, name)
                    except BtfError:
                        continue
                    return m.bit_offset + bits, found
        raise BtfError(f"no member {name!r} in {t.name or 'an anonymous struct'}")

    def offset(self, struct_name: str, path: str) -> tuple[int, BtfType]:
        """Byte offset of `path` ("a.b.c", members nested by value, no pointers followed) in struct `struct_name`,
        and the type found there (typedefs resolved)."""
        type_id, bits = self.struct_id(struct_name), 0
        for name in path.split("."):
            off, type_id = self._member(type_id, name)
            bits += off
        if bits % 8:
            raise BtfError(f"{struct_name}.{path} is not byte-aligned")
        found = self.types[self._resolve(type_id)]
        if found is None:
            raise BtfError(f"{struct_name}.{path} is void")
        return bits // 8, found


def load(path: Path = VMLINUX) -> Btf:
    try:
        return Btf(path.read_bytes())
    except OSError as exc:
        raise BtfError(f"cannot read {path}: {exc}") from exc


@dataclass(frozen=True)
class NetnsOffsets:
    """How to read a socket's network namespace inode: *(u64 *)(sk + sk_net) is the `struct net *`, and
    *(u32 *)(net + net_inum) its inode (the inode of /proc/PID/ns/net)."""

    sk_net: int
    net_inum: int


@functools.cache
def netns_offsets(path: Path = VMLINUX) -> NetnsOffsets:
    """sock.__sk_common.skc_net.net and net.ns.inum in the running kernel (raises BtfError where it cannot tell)."""
    btf = load(path)
    sk_net, ptr = btf.offset("sock", "__sk_common.skc_net.net")
    if ptr.kind != KIND_PTR:
        raise BtfError("sock.__sk_common.skc_net.net is not a pointer")
    net_inum, inum = btf.offset("net", "ns.inum")
    if inum.kind != KIND_INT or inum.size_or_type != 4:
        raise BtfError("net.ns.inum is not a 4-byte integer")
    return NetnsOffsets(sk_net, net_inum)
