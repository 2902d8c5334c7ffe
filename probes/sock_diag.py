"""The TCP sockets of the agent's own network namespace, from the kernel's socket diagnostics (NETLINK_SOCK_DIAG),
the interface `ss` uses.

Why not /proc/PID/net/tcp: reading it walks every bucket of the kernel's TCP hash tables through seq_file, ~5 ms of
CPU per read on this 24 GiB host (262,144 established buckets) however few sockets there are. A sock_diag dump
returns the same sockets, in binary, for a fraction of that (docs/BENCHMARKS.md, "The TCP tables through
sock_diag"). A netlink socket sees the namespace it was created in, so this serves targets in the agent's own
namespace only; probes/sockets.py reads /proc for the others.

Wire format (linux/netlink.h, linux/inet_diag.h): a request is an nlmsghdr and an inet_diag_req_v2; each reply
is an nlmsghdr and an inet_diag_msg, until NLMSG_DONE.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import NamedTuple

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
# family, protocol, ext, pad, states; then inet_diag_sockid: sport, dport (big-endian), src, dst, if, cookie
INET_DIAG_REQ_V2 = struct.Struct("=BBBxI" + "HH16s16sI8s")
# inet_diag_msg: family, state, timer, retrans; sockid; expires, rqueue, wqueue, uid, inode
INET_DIAG_MSG = struct.Struct("=BBBB" + "2s2s16s16sI8s" + "IIIII")

TCP_TIME_WAIT, TCP_NEW_SYN_RECV = 6, 12
# Every TCP state but the two that hold no socket of a process (inode 0 in /proc/net/tcp): TIME_WAIT and the
# request sockets of half-open connections.
STATES = sum(1 << s for s in range(1, 12) if s != TCP_TIME_WAIT)

TCP_LISTEN = 10
RECV_BYTES = 1 << 16
TIMEOUT_SECONDS = 2.0


class DiagSocket(NamedTuple):
    inode: int
    state: int
    address: bytes  # the local address, packed: 4 bytes for AF_INET, 16 for AF_INET6
    port: int       # the local port
    uid: int


def tcp_sockets(family: int, states: int = STATES) -> list[DiagSocket]:
    """Every TCP socket of `family` (AF_INET or AF_INET6) in this process's network namespace that a process holds
    (inode non-zero), in the states of the bit mask `states` (1 << state; `1 << TCP_LISTEN` walks only the
    listening table).

    Raises OSError where the kernel has no sock_diag for TCP (module inet_diag/tcp_diag absent), a sandbox forbids
    netlink, or the kernel refuses or does not answer."""
    addr_len = 4 if family == socket.AF_INET else 16
    request = INET_DIAG_REQ_V2.pack(family, socket.IPPROTO_TCP, 0, states, 0, 0, b"", b"", 0, b"")
    header = NLMSGHDR.pack(NLMSGHDR.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0)
    found: list[DiagSocket] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(TIMEOUT_SECONDS)
        nl.sendto(header + request, (0, 0))
        while True:
            data = nl.recv(RECV_BYTES)
            if not data:
                raise OSError(errno.EPROTO, "sock_diag: the kernel closed the dump without NLMSG_DONE")
            offset = 0
            while offset + NLMSGHDR.size <= len(data):
                length, kind, _, _, _ = NLMSGHDR.unpack_from(data, offset)
                if length < NLMSGHDR.size:
                    raise OSError(errno.EPROTO, f"sock_diag: a message of {length} bytes")
                if kind == NLMSG_DONE:
                    return found
                if kind == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", data, offset + NLMSGHDR.size)
                    raise OSError(-code, f"sock_diag dump refused: {os.strerror(-code)}")
                if kind == SOCK_DIAG_BY_FAMILY:
                    fields = INET_DIAG_MSG.unpack_from(data, offset + NLMSGHDR.size)
                    if fields[14]:
                        found.append(DiagSocket(inode=fields[14], state=fields[1], address=fields[6][:addr_len],
                                                port=int.from_bytes(fields[4], "big"), uid=fields[13]))
                offset += (length + 3) & ~3  # NLMSG_ALIGN
