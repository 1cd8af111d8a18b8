"""The parts of a re-exec in place, one at a time: the listening sockets held across a server's close and taken by
the next image (or refused when they listen elsewhere), an adopted child watched by pidfd, a carried tunnel, the
surface and buckets out and back, the report's lines, the descriptors a start keeps, and systemd's store."""

from __future__ import annotations

import array
import asyncio
import os
import socket
import subprocess
import sys

import pytest

from elasticd.config.model import Quotas
from elasticd.front.carried import CarriedTunnel
from elasticd.front.core.quota import QuotaBook
from elasticd.front.core.sticky import Surface
from elasticd.listeners import Listeners
from elasticd.supervisor.identity import start_time
from elasticd.systemd import listen_fds, store_listeners
from elasticd.upgrade.inherited import close_strays, kept_descriptors
from elasticd.upgrade.report import describe
from elasticd.upgrade.snapshot import restore_buckets, restore_users, saved_buckets, saved_users
from elasticd.upgrade.state import SavedState, SavedTunnel, SavedUser, SavedWorker

# ---------------------------------------------------------------------------------------------- listeners


def test_a_closed_server_leaves_its_socket_listening_and_the_next_image_takes_it():
    async def scenario() -> None:
        first = Listeners()
        sockets = first.tcp("front", "127.0.0.1", 0, 16)
        port = sockets[0].getsockname()[1]
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, sock=sockets[0])
        server.close()
        await server.wait_closed()
        waiting = socket.create_connection(("127.0.0.1", port), timeout=2)  # in the backlog, not refused
        handed = first.handover()
        assert list(handed) == ["front"] and all(os.get_inheritable(fd) for fd in handed["front"])
        # The next image: the same descriptors (here: duplicates, as an exec would keep them).
        second = Listeners({"front": [os.dup(fd) for fd in handed["front"]]})
        taken = second.tcp("front", "127.0.0.1", port, 16)
        assert taken[0].getsockname()[1] == port
        accepted: list[asyncio.BaseTransport] = []

        class Seen(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                accepted.append(transport)

        server = await asyncio.get_running_loop().create_server(Seen, sock=taken[0])
        for _ in range(100):
            if accepted:
                break
            await asyncio.sleep(0.01)
        assert len(accepted) == 1  # the connection that waited through the gap is served
        accepted[0].close()  # (Python 3.12's wait_closed waits for the server's connections too)
        waiting.close()
        server.close()
        await server.wait_closed()
        first.close_all()
        second.close_all()

    asyncio.run(scenario())


def test_an_inherited_socket_for_another_address_is_closed_and_the_new_one_bound():
    old = Listeners()
    port = old.tcp("front", "127.0.0.1", 0, 16)[0].getsockname()[1]
    fds = old.handover()["front"]
    discarded = []
    new = Listeners({"front": [os.dup(fd) for fd in fds]})
    new.on_discard = discarded.append
    sockets = new.tcp("front", "127.0.0.1", _other_port(port), 16)
    assert sockets[0].getsockname()[1] != port and discarded == ["front"]
    assert new.close_unclaimed() == []
    old.close_all()
    new.close_all()


def _other_port(port: int) -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        other = probe.getsockname()[1]
    return other if other != port else other + 1


def test_a_unix_socket_is_taken_only_while_its_file_is_there(tmp_path):
    path = str(tmp_path / "admin.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)
    sock.listen(4)
    old = Listeners()
    old.hold("admin", sock).close()
    fd = old.handover()["admin"][0]
    taken = Listeners({"admin": [os.dup(fd)]}).take_unix("admin", path)
    assert taken is not None and taken.getsockname() == path
    taken.close()
    os.unlink(path)
    assert Listeners({"admin": [os.dup(fd)]}).take_unix("admin", path) is None
    old.close_all()


def test_a_unix_socket_bound_then_renamed_is_taken_by_the_path_it_was_bound_at(tmp_path):
    """A tenant's channel socket is bound where only root writes, then renamed into the tenant's directory: the
    kernel's name for it stays the first path, and that is what the next image matches."""
    staged, path = str(tmp_path / ".channel.acme.sock"), str(tmp_path / "channel.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(staged)
    os.rename(staged, path)
    sock.listen(4)
    old = Listeners()
    old.hold("channel:acme", sock).close()
    fd = old.handover()["channel:acme"][0]
    assert Listeners({"channel:acme": [os.dup(fd)]}).take_unix("channel:acme", path) is None  # (its name differs)
    taken = Listeners({"channel:acme": [os.dup(fd)]}).take_unix("channel:acme", path, bound_at=staged)
    assert taken is not None and os.fstat(taken.fileno()).st_ino == os.fstat(fd).st_ino  # the same socket
    taken.close()
    old.close_all()


def test_names_not_claimed_are_closed_and_said():
    old = Listeners()
    old.tcp("agent", "127.0.0.1", 0, 4)
    fds = old.handover()["agent"]
    new = Listeners({"agent": [os.dup(fd) for fd in fds]})
    assert new.close_unclaimed() == ["agent"]
    old.close_all()


# ---------------------------------------------------------------------------------------------- a process's identity


def test_start_time_is_that_of_a_child_and_none_once_it_ended():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        started = start_time(child.pid)
        assert started is not None and started > 0
    finally:
        child.kill()
        child.wait()
    assert start_time(child.pid) is None  # reaped: no such process now


def test_start_time_is_none_for_a_process_that_is_not_our_child():
    assert start_time(1) is None
    assert start_time(os.getpid()) is None


# ---------------------------------------------------------------------------------------------- a carried tunnel


def test_a_carried_tunnel_relays_both_ways_what_waited_included_and_ends_both_sides():
    client_end, client_far = socket.socketpair()
    worker_end, worker_far = socket.socketpair()
    client_far.sendall(b"sent during the exec")  # waiting in the kernel when the tunnel is taken

    async def scenario() -> list[bytes]:
        loop = asyncio.get_running_loop()
        tunnel = CarriedTunnel("acme.shop.green.1", "u1")
        ended: list[CarriedTunnel] = []
        tunnel.on_close = ended.append
        await tunnel.open(client_end, worker_end)
        worker_far.setblocking(False)
        client_far.setblocking(False)
        got = [await _read(loop, worker_far, len(b"sent during the exec"))]
        await loop.sock_sendall(worker_far, b"echo")
        got.append(await _read(loop, client_far, 4))
        worker_far.close()
        for _ in range(100):
            if ended:
                break
            await asyncio.sleep(0.01)
        assert ended == [tunnel] and tunnel.closed
        got.append(await loop.sock_recv(client_far, 10))  # the client's side ended with it
        return got

    assert asyncio.run(scenario()) == [b"sent during the exec", b"echo", b""]
    client_far.close()


async def _read(loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += await asyncio.wait_for(loop.sock_recv(sock, size - len(data)), 5)
    return data


# ---------------------------------------------------------------------------------------------- memory carried


def test_users_and_buckets_go_out_and_come_back():
    surface = Surface(600.0)
    alice = surface.assign("a" * 32, "acme.shop.green.2", 100.0, "green", "acme/shop")
    alice.login = "alice"
    alice.requests, alice.seconds = 7, 1.5
    surface.assign("b" * 32, "acme.shop.green.1", 101.0, "green", "acme/shop")
    saved = saved_users(surface)
    assert SavedUser("a" * 32, "acme.shop.green.2", "green", "acme/shop", "alice", 100.0, 7, 1.5) in saved
    again = Surface(600.0)
    assert restore_users(again, saved, lambda user: user.worker == "acme.shop.green.2") == 1
    back = again.get("a" * 32)
    assert back is not None and (back.worker, back.login, back.requests, back.group) == (
        "acme.shop.green.2", "alice", 7, "green")
    assert again.get("b" * 32) is None  # its worker was not adopted: placed anew at its next request

    book = QuotaBook({"acme": Quotas(requests_per_second=10.0, burst=20)}, 0.0)
    book.tenants["acme"].bucket.tokens = 3.0  # type: ignore[union-attr]
    buckets = saved_buckets(book)
    assert buckets == {"acme": (3.0, 0.0)}
    fresh = QuotaBook({"acme": Quotas(requests_per_second=10.0, burst=2)}, 5.0)
    restore_buckets(fresh, buckets)
    assert fresh.tenants["acme"].bucket.tokens == 2  # type: ignore[union-attr]  # clamped to the new burst


# ---------------------------------------------------------------------------------------------- the report


@pytest.mark.parametrize(("report", "first"), [
    ({"outcome": "refused", "error": "bad config"}, "upgrade refused, nothing was stopped: bad config"),
    ({"outcome": "failed", "version_before": "1", "pid": 5, "error": "ENOENT"},
     "upgrade failed, elasticd 1 serves on (pid 5): ENOENT"),
    ({"outcome": "done", "version_before": "1", "version_after": "2", "pid": 5, "generation": 1, "kept": ["w.1"],
      "accept_gap": 0.4, "wall": 1.2, "waited": 0.1}, "upgraded in place: elasticd 1 → 2, pid 5 (re-exec 1)"),
    ({"outcome": "fresh", "error": "format 9", "pid": 5}, "re-executed, but the state could not be taken (format 9)"),
])
def test_the_report_reads_as_lines(report, first):
    lines = describe(report)
    assert lines[0].startswith(first), lines
    if report["outcome"] == "done":
        assert "workers kept: 1 (w.1)" in lines and any(line.startswith("accept gap: 400 ms") for line in lines)


# ---------------------------------------------------------------------------------------------- descriptors


def test_a_start_keeps_the_named_descriptors_and_closes_the_other_inheritable_ones():
    named, stray, private = os.pipe()[0], os.dup(0), os.dup(0)
    os.set_inheritable(named, True)
    os.set_inheritable(stray, True)
    os.set_inheritable(private, False)
    state = SavedState(workers=(SavedWorker("acme.shop.green.1", "acme", "shop", "green", 1, 1, "/s", "t", "d",
                                            output=named),),
                       tunnels=(SavedTunnel(90001, 90002, "w", None),))
    keep = kept_descriptors(state, {"front": [90003]})
    assert {named, 90001, 90002, 90003} <= keep
    closed = close_strays(keep)
    assert stray in closed and named not in closed and private not in closed
    os.fstat(named)
    os.fstat(private)
    with pytest.raises(OSError):
        os.fstat(stray)
    os.close(named)
    os.close(private)


def test_systemd_passes_descriptors_only_to_its_pid_and_the_variables_go():
    environ = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "3", "LISTEN_FDNAMES": "front:front:metrics"}
    assert listen_fds(environ) == {"front": [3, 4], "metrics": [5]}
    assert environ == {}
    assert listen_fds({"LISTEN_PID": "1", "LISTEN_FDS": "1"}) == {}


def test_the_listening_sockets_go_to_systemds_store(tmp_path, monkeypatch):
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(tmp_path / "notify"))
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify"))
    listeners = Listeners()
    listeners.tcp("front", "127.0.0.1", 0, 4)
    listeners.tcp("metrics", "127.0.0.1", 0, 4)
    store_listeners(listeners)
    got = []
    receiver.settimeout(2)
    for _ in range(2):
        message, ancillary, _, _ = receiver.recvmsg(256, socket.CMSG_SPACE(4 * 4))
        fds = array.array("i")
        for level, kind, data in ancillary:
            assert (level, kind) == (socket.SOL_SOCKET, socket.SCM_RIGHTS)
            fds.frombytes(data)
        got.append((message.decode(), len(fds)))
        for fd in fds:
            os.close(fd)
    assert got == [("FDSTORE=1\nFDNAME=front", 1), ("FDSTORE=1\nFDNAME=metrics", 1)]
    listeners.close_all()
    receiver.close()


# ---------------------------------------------------------------------------------------------- a request read again

AGAIN = [
    ("a GET with its cookie", b"GET /a?b=1 HTTP/1.1\r\nHost: shop.localhost\r\nCookie: elastic_uid=u1; x=2\r\n"
     b"Accept: */*\r\n\r\n"),
    ("a POST with a body", b"POST /form HTTP/1.1\r\nHost: shop.localhost\r\nContent-Length: 7\r\n"
     b"Content-Type: text/plain\r\n\r\nx=1&y=\xff"),
    ("a chunked body, its trailer dropped", b"PUT /up HTTP/1.1\r\nHost: shop.localhost\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n"),
    ("HTTP/1.0, kept alive", b"GET / HTTP/1.0\r\nHost: shop.localhost\r\nConnection: keep-alive\r\n\r\n"),
    ("HTTP/1.1, closing", b"GET / HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n"),
    ("forwarded, a user id the client has no say in", b"GET / HTTP/1.1\r\nHost: shop.localhost\r\n"
     b"X-Forwarded-For: 203.0.113.9\r\nX-Forwarded-Proto: https\r\nX-Elastic-User-Id: forged\r\n\r\n"),
]


def _read_request(data: bytes):
    from elasticd.front.core.connection import ClientRelay
    relay = ClientRelay(65536)
    relay.receive(data)
    assert len(relay.queue) == 1 and relay.cur is None
    return relay.queue[0]


@pytest.mark.parametrize(("name", "sent"), AGAIN, ids=[row[0] for row in AGAIN])
def test_a_request_not_yet_sent_reads_again_as_the_same_request(name, sent):
    from elasticd.front.handover import request_again
    first = _read_request(sent)
    again = _read_request(request_again(first))
    for read in (first, again):
        assert read.body_done and read.error is None
    assert (again.method, again.url, again.http11) == (first.method, first.url, first.http11)
    assert b"".join(again.body) == b"".join(first.body)
    for attribute in ("host", "cookie", "forwarded_for", "proto", "chunked", "keep_alive", "lines"):
        assert getattr(again.head, attribute) == getattr(first.head, attribute), attribute
    assert b"forged" not in request_again(first)
