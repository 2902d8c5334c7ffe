"""probes/btf.py: member offsets from BTF, on a blob built here (every kind the reader steps over) and, where the host
has them, against bpftool's reading of the running kernel's BTF."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from probes import btf
from probes.btf import Btf, BtfError


class Builder:
    """A little-endian BTF blob, types added in id order (1, 2, ...)."""

    def __init__(self) -> None:
        self.strings = b"\0"
        self.types = b""
        self.count = 0

    def s(self, name: str) -> int:
        if not name:
            return 0
        off = len(self.strings)
        self.strings += name.encode() + b"\0"
        return off

    def add(self, kind: int, name: str, vlen: int, size_or_type: int, extra: bytes = b"", kind_flag: int = 0) -> int:
        info = (kind_flag << 31) | (kind << 24) | vlen
        self.types += struct.pack("<III", self.s(name), info, size_or_type) + extra
        self.count += 1
        return self.count

    def struct(self, name: str, size: int, members: list[tuple[str, int, int]], kind: int = btf.KIND_STRUCT,
               kind_flag: int = 0) -> int:
        extra = b"".join(struct.pack("<III", self.s(n), t, off) for n, t, off in members)
        return self.add(kind, name, len(members), size, extra, kind_flag)

    def blob(self) -> bytes:
        hdr = struct.pack("<HBBIIIII", btf.BTF_MAGIC, 1, 0, 24, 0, len(self.types), len(self.types),
                          len(self.strings))
        return hdr + self.types + self.strings


def _kernel_like() -> bytes:
    """sock -> __sk_common -> skc_net (a typedef of an anonymous struct holding `net`), net -> ns -> inum, with the
    ns member reached through an anonymous union, plus kinds the reader must step over."""
    b = Builder()
    u32 = b.add(btf.KIND_INT, "unsigned int", 0, 4, struct.pack("<I", 32))                         # 1
    b.add(btf.KIND_ENUM, "e", 2, 4, struct.pack("<Ii", b.s("A"), 0) + struct.pack("<Ii", b.s("B"), 1))  # 2
    b.add(btf.KIND_FUNC_PROTO, "", 1, 0, struct.pack("<II", 0, u32))                               # 3
    b.add(btf.KIND_ARRAY, "", 0, 0, struct.pack("<III", u32, u32, 4))                               # 4
    ns_common = b.struct("ns_common", 32, [("stashed", u32, 0), ("inum", u32, 192)])                # 5
    inner = b.struct("", 40, [("pad", u32, 0), ("ns", ns_common, 64)], kind=btf.KIND_UNION)         # 6
    net = b.struct("net", 4224, [("passive", u32, 0), ("", inner, 1088)])                           # 7
    ptr = b.add(btf.KIND_PTR, "", 0, net)                                                           # 8
    anon = b.struct("", 8, [("net", ptr, 0)])                                                       # 9
    possible = b.add(btf.KIND_TYPEDEF, "possible_net_t", 0, anon)                                  # 10
    const = b.add(btf.KIND_CONST, "", 0, possible)                                                  # 11
    sock_common = b.struct("sock_common", 136, [("skc_family", u32, 128), ("skc_net", const, 384)])  # 12
    b.struct("sock", 800, [("__sk_common", sock_common, 0), ("flag", u32, (1 << 24) | 4096)], kind_flag=1)  # 13
    b.add(btf.KIND_DECL_TAG, "tag", 0, 13, struct.pack("<i", -1))                                   # 14
    return b.blob()


def test_offsets_follow_typedefs_qualifiers_and_anonymous_members():
    types = Btf(_kernel_like())
    assert types.offset("sock", "__sk_common.skc_net.net")[0] == 48
    assert types.offset("net", "ns.inum") == (136 + 8 + 24, types.types[1])


def test_netns_offsets_from_a_file(tmp_path: Path):
    path = tmp_path / "vmlinux"
    path.write_bytes(_kernel_like())
    assert btf.netns_offsets(path) == btf.NetnsOffsets(sk_net=48, net_inum=168)


def test_missing_members_bitfields_and_bad_blobs_raise(tmp_path: Path):
    types = Btf(_kernel_like())
    with pytest.raises(BtfError, match="no member"):
        types.offset("net", "ns.nope")
    with pytest.raises(BtfError, match="no struct"):
        types.offset("nope", "x")
    with pytest.raises(BtfError, match="bitfield"):
        types.offset("sock", "flag")
    with pytest.raises(BtfError, match="magic"):
        Btf(b"\0" * 32)
    with pytest.raises(BtfError, match="cannot read"):
        btf.netns_offsets(tmp_path / "absent")
    blob = bytearray(_kernel_like())
    struct.pack_into("<I", blob, 24 + 4, 30 << 24)  # the first type's kind: one no BTF has
    with pytest.raises(BtfError, match="unknown BTF kind"):
        Btf(bytes(blob))


@pytest.mark.skipif(not btf.VMLINUX.exists() or shutil.which("bpftool") is None,
                    reason="needs the running kernel's BTF and bpftool")
def test_the_running_kernels_offsets_match_bpftool():
    raw = subprocess.run(["bpftool", "btf", "dump", "file", str(btf.VMLINUX), "format", "raw"], capture_output=True,
                         text=True, check=True).stdout

    def member_bits(struct_name: str, member: str) -> int:
        block = re.search(rf"^\[\d+\] STRUCT '{struct_name}' size=\d+ vlen=\d+\n((?:\t.*\n)+)", raw, re.M)
        assert block, struct_name
        found = re.search(rf"^\t'{member}' type_id=\d+ bits_offset=(\d+)$", block.group(1), re.M)
        assert found, (struct_name, member)
        return int(found.group(1))

    got = btf.netns_offsets()
    assert got.sk_net == (member_bits("sock", "__sk_common") + member_bits("sock_common", "skc_net")) // 8
    assert got.net_inum == (member_bits("net", "ns") + member_bits("ns_common", "inum")) // 8
