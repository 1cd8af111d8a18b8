"""The listener guard's pure parts: the verdict table, what is a local address, the uid table, and sock_diag's
request and answer formats (the kernel's own answer is read in test_listener_guard.py)."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from elasticd.listener_guard.sock_diag import INET_DIAG_CGROUP_ID, SockDiagError, parse_answer, request
from elasticd.listener_guard.verdict import Peer, PeerVerdict, is_local, judge, tenants_by_uid

CGROUPS = {501: "acme", 502: "acme", 601: "globex"}
UIDS = {1001: "acme", 1002: "globex"}


def _peer(uid: int = 0, cgroup: int | None = 1, state: str = "established", inode: int = 77) -> Peer:
    return Peer(uid, inode, cgroup, state)


@pytest.mark.parametrize(("peer", "failed", "expected"), [
    (None, True, PeerVerdict(False, "lookup-failed")),
    (None, False, PeerVerdict(False, "peer-gone")),
    (_peer(uid=1001, inode=0), False, PeerVerdict(False, "peer-gone", uid=1001)),
    (_peer(uid=0, state="time-wait"), False, PeerVerdict(False, "peer-gone", uid=0)),
    (_peer(uid=0, cgroup=601), False, PeerVerdict(False, "tenant-cgroup", "globex", 0)),  # a tenant without `user:`
    (_peer(uid=1001, cgroup=502), False, PeerVerdict(False, "tenant-cgroup", "acme", 1001)),
    (_peer(uid=1002, cgroup=1), False, PeerVerdict(False, "tenant-user", "globex", 1002)),  # its user, outside
    (_peer(uid=1002, cgroup=None), False, PeerVerdict(False, "tenant-user", "globex", 1002)),  # a kernel before 5.7
    (_peer(uid=1002, cgroup=501), False, PeerVerdict(False, "tenant-cgroup", "acme", 1002)),  # the cgroup says whose
    (_peer(uid=0, cgroup=1), False, PeerVerdict(True, uid=0)),  # root's Prometheus
    (_peer(uid=115, cgroup=9999), False, PeerVerdict(True, uid=115)),  # the prometheus user, in its own unit
    (_peer(uid=115, state="fin-wait-2"), False, PeerVerdict(True, uid=115)),  # half-closed: still reads
])
def test_the_verdict_table(peer, failed, expected):
    assert judge(peer, failed, CGROUPS, UIDS) == expected


def test_a_verdict_names_the_peer_by_tenant_then_uid():
    assert PeerVerdict(False, "tenant-user", "acme", 1001).who == "tenant acme"
    assert PeerVerdict(False, "peer-gone", uid=7).who == "uid 7"
    assert PeerVerdict(False, "lookup-failed").who == "an unknown local peer"


@pytest.mark.parametrize(("peer", "own", "hosts", "local"), [
    ("127.0.0.1", "127.0.0.1", set(), True),
    ("127.5.6.7", "127.0.0.1", set(), True),
    ("::1", "::1", set(), True),
    ("::ffff:127.0.0.1", "::ffff:127.0.0.1", set(), True),  # an IPv4 peer of a dual-stack listener
    ("10.0.0.5", "10.0.0.5", set(), True),  # a connection to our own address from it
    ("10.0.0.5", "10.0.0.9", {"10.0.0.5"}, True),  # another of this host's addresses
    ("fe80::1%eth0", "fe80::2", {"fe80::1"}, True),
    ("10.0.0.7", "10.0.0.9", {"10.0.0.5"}, False),  # another host: Prometheus elsewhere
    ("2001:db8::7", "2001:db8::1", set(), False),
    ("not-an-address", "127.0.0.1", set(), True),  # fail closed
])
def test_what_is_a_local_peer(peer, own, hosts, local):
    assert is_local(peer, own, hosts) is local


def test_the_uid_table_leaves_root_out_and_names_sharing_tenants_together():
    assert tenants_by_uid([("a", 1001), ("b", 0), ("c", 1002), ("d", 1001)]) == {1001: "a, d", 1002: "c"}


# ------------------------------------------------------------------------------------------------ sock_diag's format

def test_the_request_names_the_peer_socket_by_its_four_tuple():
    data = request(("127.0.0.1", 40000), ("127.0.0.2", 9464), sequence=7)
    length, kind, flags, sequence, _ = struct.unpack_from("=IHHII", data)
    assert (length, kind, flags, sequence) == (len(data), 20, 1, 7) and len(data) == 16 + 56
    family, protocol = data[16], data[17]
    assert (family, protocol) == (socket.AF_INET, socket.IPPROTO_TCP)
    sport, dport, src, dst = struct.unpack_from("!HH16s16s", data, 24)
    assert (sport, dport) == (40000, 9464)
    assert src[:4] == socket.inet_aton("127.0.0.1") and dst[:4] == socket.inet_aton("127.0.0.2")
    assert struct.unpack_from("=III", data, 24 + 36) == (0, 0xFFFFFFFF, 0xFFFFFFFF)  # any interface, no cookie


def test_an_ipv4_peer_seen_through_a_dual_stack_listener_is_looked_up_as_ipv4():
    data = request(("::ffff:127.0.0.1", 40000), ("::ffff:127.0.0.1", 9464), sequence=1)
    assert data[16] == socket.AF_INET


def test_the_two_ends_must_be_of_one_family():
    with pytest.raises(ValueError, match="not of one address family"):
        request(("127.0.0.1", 1), ("::1", 2), sequence=1)


def _answer(sequence: int, uid: int, inode: int, state: int = 1, cgroup: int | None = 4242) -> bytes:
    message = struct.pack("=BBBB", socket.AF_INET, state, 0, 0) + bytes(48) + struct.pack("=IIIII", 0, 0, 0, uid,
                                                                                          inode)
    attributes = struct.pack("=HH", 5, 8) + b"\x00" + bytes(3)  # another attribute first (padded to 4)
    if cgroup is not None:
        attributes += struct.pack("=HHQ", 12, INET_DIAG_CGROUP_ID, cgroup)
    body = message + attributes
    return struct.pack("=IHHII", 16 + len(body), 20, 0, sequence, 0) + body


def test_an_answer_gives_uid_inode_state_and_cgroup():
    assert parse_answer(_answer(3, uid=1001, inode=99), 3) == Peer(1001, 99, 4242, "established")
    assert parse_answer(_answer(3, uid=0, inode=0, state=6, cgroup=None), 3) == Peer(0, 0, None, "time-wait")


def test_no_such_socket_is_none_and_other_errors_raise():
    def error(code: int, sequence: int = 4) -> bytes:
        return struct.pack("=IHHII", 36, 2, 0, sequence, 0) + struct.pack("=i", -code) + bytes(16)
    assert parse_answer(error(errno.ENOENT), 4) is None
    with pytest.raises(SockDiagError, match="refused the lookup"):
        parse_answer(error(errno.EPERM), 4)
    with pytest.raises(SockDiagError, match="not 5"):
        parse_answer(error(errno.ENOENT, sequence=4), 5)
    with pytest.raises(SockDiagError, match="short"):
        parse_answer(b"\x00" * 8, 4)
    with pytest.raises(SockDiagError, match="type 3"):
        parse_answer(struct.pack("=IHHII", 16, 3, 0, 4, 0), 4)
