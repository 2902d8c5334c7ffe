"""Who is at the other end of an accepted TCP connection: the local user owning the peer socket, from sock_diag.

A connection from this host has its other end in the kernel's socket table, with the uid that created it;
`NETLINK_SOCK_DIAG` looks one socket up by its four-tuple (what `ss -e` shows). One exact lookup costs a few
microseconds, where reading `/proc/net/tcp` costs a scan of every socket on the host per connection. No
library does the exact lookup (pyroute2's diag socket dumps whole tables), so the two structs are packed here.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

from probes.sock_diag import NETLINK_SOCK_DIAG, NLM_F_REQUEST, NLMSGHDR, SOCK_DIAG_BY_FAMILY

_ANY_STATE = 0xFFFFFFFF
_NO_COOKIE = 0xFFFFFFFF
# struct inet_diag_msg: family, state, timer, retrans (4 bytes), inet_diag_sockid (48), then expires, rqueue,
# wqueue, uid, inode.
_UID_OFFSET = 4 + 48 + 12


def _addr16(family: int, address: str) -> bytes:
    packed = socket.inet_pton(family, address)
    return packed + bytes(16 - len(packed))


def _request(family: int, local: tuple[str, int], peer: tuple[str, int]) -> bytes:
    # The peer's socket: its source is the peer's address, its destination ours (struct inet_diag_sockid,
    # ports and addresses in network order).
    sockid = (struct.pack("!HH", peer[1], local[1]) + _addr16(family, peer[0]) + _addr16(family, local[0])
              + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE))
    body = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, _ANY_STATE) + sockid
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, 1, 0) + body


def peer_uid(local: tuple[str, int], peer: tuple[str, int]) -> int | None:
    """The uid owning the socket at `peer` connected to our `local` address, when that socket is on this host
    (in our network namespace); None for a remote peer (or an address that is none). OSError when the kernel
    cannot be asked (no sock_diag, AF_NETLINK forbidden by a sandbox)."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(peer[0]).version == 6 else socket.AF_INET
        request = _request(family, local, peer)
    except (OSError, ValueError):
        return None
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(1.0)
        nl.sendto(request, (0, 0))
        answer = nl.recv(8192)
    if len(answer) < NLMSGHDR.size:
        return None
    _, kind, _, _, _ = NLMSGHDR.unpack_from(answer)
    if kind != SOCK_DIAG_BY_FAMILY or len(answer) < NLMSGHDR.size + _UID_OFFSET + 4:
        return None  # NLMSG_ERROR (ENOENT: not a socket of this host) or something unexpected
    (uid,) = struct.unpack_from("=I", answer, NLMSGHDR.size + _UID_OFFSET)
    return uid
