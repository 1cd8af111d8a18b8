"""elasticd's own listeners answer no tenant's process (issue 43), through the real daemon: tenants with throw-away
users run tests/apps/listener_probe.py, which asks ``metrics_listen`` (``/metrics``, ``/monitor``, the other
tenant's ``/monitor/state``) and ``agent_listen`` from inside its view; root's own scrape and check are served.

Here the cgroup tree is a directory, so a tenant's process is told by its socket's owner; the cgroup (which also
catches a tenant without ``user:``) is proven in the VM (scenario 26). The kernel's own lookup is read here."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from harness import Daemon, browse, free_port

from elasticd.config.isolation import BWRAP
from elasticd.listener_guard.accepting import GuardedAccept
from elasticd.listener_guard.guard import ListenerGuard
from elasticd.listener_guard.sock_diag import SockDiag
from elasticd.listener_guard.verdict import Peer

SYSTEM_PYTHON = "/usr/bin/python3"
PROBE = Path(__file__).resolve().parent / "apps" / "listener_probe.py"
RESET = "error: ConnectionResetError: [Errno 104] Connection reset by peer"


def _refused(outcome: str) -> bool:
    """A refusal as a client sees it: reset (before or after its request went out), or closed without a word."""
    return outcome in (RESET, "closed") or "Broken pipe" in outcome

needs_users = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None or not os.access(BWRAP, os.X_OK)
    or not os.access(SYSTEM_PYTHON, os.X_OK), reason="needs root, useradd, bubblewrap and /usr/bin/python3")

TENANT = """\
  {name}:
    user: {user}
    apps:
      web:
        domains: [{name}.localhost]
        root: {root}
        groups:
          main:
            command: ["{python}", "probe.py"]
            env: {{PROBE_METRICS: "127.0.0.1:{metrics}", PROBE_AGENT: "127.0.0.1:{agent}",
                   PROBE_OTHER_APP: "{other}/web"}}
{isolation}"""


def _root(base: Path, name: str, uid: int, gid: int) -> Path:
    root = base / "srv" / name
    root.mkdir(parents=True)
    shutil.copy(PROBE, root / "probe.py")
    for path in (root, root / "probe.py"):
        os.chown(path, uid, gid)
    (base / "srv").chmod(0o755)
    return root


def _metrics(d: Daemon) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as response:
        return response.read().decode()


def _refusals(page: str) -> dict[tuple[str, str], float]:
    found = re.findall(r'^elasticd_listener_refusals_total\{listener="(\w+)",reason="([\w-]+)"\} (\S+)$', page, re.M)
    return {(listener, reason): float(value) for listener, reason, value in found}


def _agent(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"\n")
        return sock.recv(1024).decode()


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@needs_users
def test_no_tenant_process_reaches_metrics_monitor_or_agent_and_root_still_does(users, base):
    (alice, a_uid, a_gid), (bob, b_uid, b_gid), (carol, c_uid, c_gid) = users(), users(), users()
    agent_port = free_port()
    d = Daemon(base, "tenants: {}\n", extra_server=f"  agent_listen: 127.0.0.1:{agent_port}\n")
    tenants = "".join(
        TENANT.format(name=name, user=user, root=_root(base, name, uid, gid), python=SYSTEM_PYTHON,
                      metrics=d.metrics_port, agent=agent_port, other=other, isolation=isolation)
        for name, user, uid, gid, other, isolation in (
            ("a", alice, a_uid, a_gid, "b", ""), ("b", bob, b_uid, b_gid, "a", ""),
            # with `user:` but no view of its own: the same listeners, the same answer
            ("c", carol, c_uid, c_gid, "a", "    isolation: {enabled: false}\n")))
    d.write_config(f"tenants:\n{tenants}")
    d.start()
    try:
        for tenant in ("a", "b", "c"):
            code, body, _ = browse(d, "/", host=f"{tenant}.localhost")
            assert code == 200, body
            seen = json.loads(body)
            other = "b" if tenant == "a" else "a"
            assert list(seen) == ["/metrics", "/monitor", f"/monitor/state?app={other}/web", "agent"]
            assert all(_refused(outcome) for outcome in seen.values()), (tenant, seen)
        # root (the operator's Prometheus, HAProxy as root here) is served as before
        page = _metrics(d)
        assert "elasticd_build_info" in page
        assert _agent(agent_port).startswith("up")
        refusals = _refusals(page)
        assert refusals[("metrics", "tenant-user")] == 9 and refusals[("agent", "tenant-user")] == 3, refusals
        assert refusals[("metrics", "tenant-cgroup")] == 0 and refusals[("metrics", "lookup-failed")] == 0
        # one line per tenant, listener and reason, not one per connection
        lines = [line for line in d.log_text().splitlines() if "answers no tenant's process" in line]
        assert len(lines) == 6, lines
        assert any(f"server.metrics_listen refused a connection from tenant a at 127.0.0.1: its socket is owned by the "
                   f"tenant's user (uid {a_uid})" in line for line in lines), lines
    finally:
        d.stop()
        d.kill_leftovers()


@needs_users
def test_a_thousand_connections_from_a_tenant_are_refused_fast_and_leave_nothing(users, base):
    alice, a_uid, a_gid = users()
    d = Daemon(base, "tenants: {}\n")
    d.write_config("tenants:\n" + TENANT.format(name="a", user=alice, root=_root(base, "a", a_uid, a_gid),
                                                python=SYSTEM_PYTHON, metrics=d.metrics_port, agent=1, other="a",
                                                isolation=""))
    d.start()
    try:
        assert d.process is not None
        _metrics(d)
        before = _descriptors(d.process.pid)
        code, body, _ = browse(d, "/flood?n=1000", host="a.localhost", timeout=60)
        assert code == 200, body
        flood = json.loads(body)
        assert flood["unanswered"] == 0 and sum(flood["outcomes"].values()) == 1000, flood
        assert set(flood["outcomes"]) <= {"closed", "error: Connection reset by peer", "error: Broken pipe"}, flood
        began = time.monotonic()
        assert "elasticd_build_info" in _metrics(d)  # the scrape is served right after
        assert time.monotonic() - began < 5
        deadline = time.monotonic() + 10
        while _descriptors(d.process.pid) > before + 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _descriptors(d.process.pid) <= before + 2, (before, _descriptors(d.process.pid))
        assert _refusals(_metrics(d))[("metrics", "tenant-user")] >= 1000
        assert sum("answers no tenant's process" in line for line in d.log_text().splitlines()) == 1
    finally:
        d.stop()
        d.kill_leftovers()


# ------------------------------------------------------------------------------------------------ the kernel's answer

def test_the_kernel_names_a_local_peer_and_forgets_a_closed_one():
    diag = SockDiag()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.create_connection(server.getsockname())
        accepted, peer = server.accept()
        with accepted:
            found = diag.peer(peer, accepted.getsockname())
            assert isinstance(found, Peer) and found.uid == os.geteuid() and found.held
            assert found.tcp_state == "established" and found.cgroup_id is not None  # (every kernel since 5.7)
            assert diag.peer(("127.0.0.1", 1), accepted.getsockname()) is None  # nobody's
            client.close()  # the peer goes: FIN-WAIT, then gone; never a held socket again
            after = diag.peer(peer, accepted.getsockname())
            assert after is None or not after.held or after.tcp_state != "established"
    diag.close()


class _Diag:
    """A kernel that answers what the test says (the gate's own behaviour, without a tenant)."""

    def __init__(self, answer: Peer | Exception | None) -> None:
        self.answer = answer
        self.asked: list[tuple[tuple[str, int], tuple[str, int]]] = []

    def peer(self, source, destination):
        self.asked.append((source, destination))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def close(self) -> None:
        pass


async def _guarded_echo(guard: ListenerGuard) -> tuple[GuardedAccept, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"echo " + await reader.readline())
        await writer.drain()
        writer.close()

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    accept = GuardedAccept(sock, guard, "metrics", lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(), echo))
    accept.start()
    return accept, accept.port


@pytest.mark.parametrize(("answer", "served"), [
    (Peer(0, 5, 1, "established"), True),
    (Peer(1001, 5, 1, "established"), False),
    (Peer(0, 5, 777, "established"), False),
    (None, False),
])
def test_a_served_connection_is_handed_over_whole_and_the_others_reset(answer, served):
    async def run() -> tuple[bytes, dict]:
        guard = ListenerGuard(lambda: {777: "t"}, lambda: {1001: "t"}, diag=_Diag(answer))  # type: ignore[arg-type]
        accept, port = await _guarded_echo(guard)
        try:  # (reset so soon that the connect itself may fail)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"hello\n")
            await writer.drain()
            received = await asyncio.wait_for(reader.read(), 5)
            writer.close()
        except ConnectionResetError:
            received = b"reset"
        accept.close()
        return received, guard.refusals

    received, refusals = asyncio.run(run())
    if served:
        assert received == b"echo hello\n" and not any(refusals.values())
    else:
        assert received in (b"reset", b"") and sum(refusals.values()) == 1


def test_a_tenant_that_connects_and_sends_nothing_is_reset_at_once():
    async def run() -> tuple[bytes, float]:
        guard = ListenerGuard(dict, lambda: {1001: "t"}, diag=_Diag(Peer(1001, 5, 1, "established")))  # type: ignore[arg-type]
        accept, port = await _guarded_echo(guard)
        began = asyncio.get_running_loop().time()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            received = await asyncio.wait_for(reader.read(), 5)  # (nothing sent: the end comes without waiting)
            writer.close()
        except ConnectionResetError:
            received = b"reset"
        accept.close()
        return received, asyncio.get_running_loop().time() - began

    received, took = asyncio.run(run())
    assert received in (b"reset", b"") and took < 1


def test_past_its_budget_of_refusals_the_listener_rests_and_a_served_peer_still_gets_in():
    async def run() -> tuple[int, bytes]:
        diag = _Diag(Peer(1001, 5, 1, "established"))
        guard = ListenerGuard(dict, lambda: {1001: "t"}, diag=diag)  # type: ignore[arg-type]

        async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"echo " + await reader.readline())
            await writer.drain()
            writer.close()

        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        accept = GuardedAccept(sock, guard, "metrics",
                               lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader(), echo),
                               refusals_per_second=1.0, burst=20)  # (the daemon's: 500 a second, 1,000 at once)
        accept.start()
        flood = []
        for _ in range(60):  # (within the backlog: every one is accepted as soon as the listener reads)
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", accept.port))
            flood.append(client)
        await asyncio.sleep(1.0)
        refused = sum(guard.refusals.values())  # the burst, then about one a second: the rest wait in the backlog
        diag.answer = Peer(0, 5, 1, "established")  # the operator's peer, behind the flood
        reader, writer = await asyncio.open_connection("127.0.0.1", accept.port)
        writer.write(b"hello\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        for client in flood:
            client.close()
        accept.close()
        return refused, answer

    refused, answer = asyncio.run(run())
    assert 20 <= refused <= 23, refused
    assert answer == b"echo hello\n"


def test_a_peer_at_another_hosts_address_is_served_without_a_lookup():
    diag = _Diag(Peer(1001, 5, 1, "established"))
    guard = ListenerGuard(dict, lambda: {1001: "t"}, diag=diag, addresses=lambda: {"10.0.0.9"})  # type: ignore[arg-type]
    assert guard.judge("metrics", ("10.0.0.7", 5000), ("10.0.0.9", 9464)).served and not diag.asked
    assert not guard.judge("metrics", ("10.0.0.9", 5000), ("10.0.0.9", 9464)).served
    assert diag.asked == [(("10.0.0.9", 5000), ("10.0.0.9", 9464))]
