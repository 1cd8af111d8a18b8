"""Who is at the other end of a local TCP connection: the kernel's ``NETLINK_SOCK_DIAG`` (what ``ss -e`` reads).

A TCP peer on this host has a socket of its own in this network namespace, whose source is the connection's far
end and whose destination is our end. One ``SOCK_DIAG_BY_FAMILY`` request for that exact 4-tuple (no dump) makes
the kernel look the socket up as an arriving packet would and answer with its owner's uid (the ``fsuid`` of the
process that created it, which no unprivileged process can choose), its inode (0 once the process closed it) and,
since Linux 5.7, the id of the cgroup it was created in (``INET_DIAG_CGROUP_ID``: the cgroup directory's inode
number on cgroup2, fixed at the socket's creation). ``ENOENT``: no such socket here — the peer is another host,
another network namespace, or gone.

Why not ``SO_PEERCRED``: it is for Unix sockets only. Why not /proc/net/tcp: a scan of every socket on the host
per connection (tens of thousands on a hosting host), against one lookup in the kernel's hash table here
(``benchmarks/listener_guard_bench.py``).

The request and answer formats are pure (``request``, ``parse_answer``); ``SockDiag`` is the socket.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from typing import Final

from elasticd.listener_guard.verdict import Peer

__all__ = ["TCP_STATES", "SockDiag", "SockDiagError", "parse_answer", "request"]

NETLINK_SOCK_DIAG: Final = 4
SOCK_DIAG_BY_FAMILY: Final = 20
NLM_F_REQUEST: Final = 0x1
NLMSG_ERROR: Final = 2
INET_DIAG_CGROUP_ID: Final = 21
_NO_COOKIE: Final = 0xFFFFFFFF
_ALL_STATES: Final = 0xFFFFFFFF

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port id
# inet_diag_req_v2: family, protocol, ext, pad, states; inet_diag_sockid: sport, dport (network order), src, dst
# (16 bytes each, network order), interface, cookie (two u32).
_REQ_HEAD = struct.Struct("=BBBxI")
_SOCKID = struct.Struct("!HH16s16s")
_SOCKID_TAIL = struct.Struct("=III")
# inet_diag_msg: family, state, timer, retrans, sockid (48 bytes), expires, rqueue, wqueue, uid, inode
_MSG_HEAD = struct.Struct("=BBBB")
_MSG_TAIL = struct.Struct("=IIIII")
_MSG_SIZE: Final = _MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size + _MSG_TAIL.size
_ATTR = struct.Struct("=HH")

# The kernel's TCP states (include/net/tcp_states.h), by number.
TCP_STATES: Final = {1: "established", 2: "syn-sent", 3: "syn-recv", 4: "fin-wait-1", 5: "fin-wait-2",
                     6: "time-wait", 7: "close", 8: "close-wait", 9: "last-ack", 10: "listen", 11: "closing",
                     12: "new-syn-recv"}


class SockDiagError(Exception):
    """The kernel did not answer the lookup (not: "no such socket", which is ``None``)."""


def _packed(address: str) -> tuple[int, bytes]:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # (a dual-stack listener sees an IPv4 peer as ::ffff:a.b.c.d; its socket is AF_INET)
    if isinstance(ip, ipaddress.IPv4Address):
        return socket.AF_INET, ip.packed + bytes(12)
    return socket.AF_INET6, ip.packed


def request(source: tuple[str, int], destination: tuple[str, int], sequence: int) -> bytes:
    """The request for the TCP socket whose local end is ``source`` and remote end ``destination``."""
    family, src = _packed(source[0])
    other_family, dst = _packed(destination[0])
    if family != other_family:
        raise ValueError(f"{source[0]} and {destination[0]} are not of one address family")
    body = (_REQ_HEAD.pack(family, socket.IPPROTO_TCP, 0, _ALL_STATES)
            + _SOCKID.pack(source[1], destination[1], src, dst)
            + _SOCKID_TAIL.pack(0, _NO_COOKIE, _NO_COOKIE))
    return _HEADER.pack(_HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, sequence, 0) + body


def parse_answer(data: bytes, sequence: int) -> Peer | None:
    """The kernel's answer to ``request``: the peer, or None for "no such socket". SockDiagError: any other error,
    or an answer that is not one (short, another sequence number)."""
    if len(data) < _HEADER.size:
        raise SockDiagError(f"a short answer ({len(data)} bytes)")
    length, kind, _flags, seq, _port = _HEADER.unpack_from(data)
    if seq != sequence:
        raise SockDiagError(f"an answer to request {seq}, not {sequence}")
    length = min(length, len(data))
    if kind == NLMSG_ERROR:
        (code,) = struct.unpack_from("=i", data, _HEADER.size)
        if code == -errno.ENOENT:
            return None
        raise SockDiagError(f"the kernel refused the lookup: {os.strerror(-code)}")
    if kind != SOCK_DIAG_BY_FAMILY or length < _HEADER.size + _MSG_SIZE:
        raise SockDiagError(f"an answer of type {kind}, {length} bytes")
    offset = _HEADER.size
    _family, state, _timer, _retrans = _MSG_HEAD.unpack_from(data, offset)
    offset += _MSG_HEAD.size + _SOCKID.size + _SOCKID_TAIL.size
    _expires, _rqueue, _wqueue, uid, inode = _MSG_TAIL.unpack_from(data, offset)
    offset += _MSG_TAIL.size
    cgroup_id: int | None = None
    while offset + _ATTR.size <= length:
        size, kind = _ATTR.unpack_from(data, offset)
        if size < _ATTR.size:
            break
        if kind == INET_DIAG_CGROUP_ID and size >= _ATTR.size + 8:
            (cgroup_id,) = struct.unpack_from("=Q", data, offset + _ATTR.size)
        offset += (size + 3) & ~3
    return Peer(uid, inode, cgroup_id, TCP_STATES.get(state, str(state)))


class SockDiag:
    """One netlink socket, asked one question at a time (blocking: the kernel answers from its hash table at once,
    without waiting for anything; the event loop is held for microseconds)."""

    __slots__ = ("_sequence", "_socket")

    def __init__(self) -> None:
        self._socket: socket.socket | None = None
        self._sequence = 0

    def peer(self, source: tuple[str, int], destination: tuple[str, int]) -> Peer | None:
        """The socket on this host whose local end is ``source`` (the connection's far end, as we see it) and whose
        remote end is ``destination`` (our end); None when there is none. SockDiagError when the kernel cannot
        say (no sock_diag in this kernel, a netlink error)."""
        self._sequence = (self._sequence + 1) & 0xFFFFFFFF
        message = request(source, destination, self._sequence)
        try:
            sock = self._open()
            sock.send(message)
            while True:
                data = sock.recv(8192)
                try:
                    return parse_answer(data, self._sequence)
                except SockDiagError:
                    if len(data) >= _HEADER.size and _HEADER.unpack_from(data)[3] != self._sequence:
                        continue  # an answer left over from a request that failed halfway: skip it
                    raise
        except OSError as exc:
            self.close()  # the next lookup opens a new one
            raise SockDiagError(f"netlink: {exc.strerror or exc}") from exc

    def _open(self) -> socket.socket:
        if self._socket is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
            sock.settimeout(1.0)  # (never reached in practice: the kernel answers in the send's own call)
            self._socket = sock
        return self._socket

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
