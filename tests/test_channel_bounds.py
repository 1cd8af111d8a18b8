"""The channel's bounds (issue 27): the decisions as tables (time passed in), then each bound exceeded by a real
peer on a real socket — the connection closed or the line refused, the refusal counted, and the log kept short."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_pool_channel_server import Registry, serve_channel

from elasticd.frames import MAX_LINE
from elasticd.pool.channel_server import REASONS, ChannelError
from elasticd.pool.pacing import (
    ACCEPT_BURST,
    ACCEPT_RATE,
    ANNOUNCE_BURST,
    ANNOUNCE_DEADLINE,
    MAX_UNANNOUNCED_PER_UID,
    REPORT_BURST,
    STRIKE_BURST,
    ConnectionBudget,
    Pacing,
    Unannounced,
)
from elasticd.refusal_log import RefusalLog, Saying

# ---------------------------------------------------------------------------------------------- the decisions


def test_reports_are_taken_at_twice_the_interval_with_a_burst_of_three():
    pacing = Pacing(interval=1.0, now=0.0)
    assert [pacing.report(0.0) for _ in range(REPORT_BURST)] == [0.0] * REPORT_BURST
    assert pacing.report(0.0) == pytest.approx(0.5)  # refused: read nothing more for half an interval
    assert pacing.report(0.25) == pytest.approx(0.25)
    assert pacing.report(0.5) == 0.0  # due again
    assert pacing.report(0.6) > 0.0
    assert pacing.report(10.0) == 0.0  # a quiet worker's allowance refills up to the burst, not beyond
    assert [pacing.report(10.0) for _ in range(3)] == [0.0, 0.0, pytest.approx(0.5)]


@pytest.mark.parametrize(("interval", "steady_rate"), [(5.0, 0.4), (1.0, 2.0), (0.2, 10.0)])
def test_a_flood_gets_twice_the_interval_rate_whatever_it_sends(interval, steady_rate):
    pacing = Pacing(interval=interval, now=0.0)
    taken, now = 0, 0.0
    while now < 100.0:  # a flood: a report every millisecond for 100 s
        taken += pacing.report(now) == 0.0
        now += 0.001
    assert taken == pytest.approx(REPORT_BURST + steady_rate * 100.0, abs=1)


def test_strikes_close_after_the_burst_and_refill_one_an_interval():
    pacing = Pacing(interval=2.0, now=0.0)
    assert [pacing.strike(0.0) for _ in range(STRIKE_BURST)] == [False] * STRIKE_BURST
    assert pacing.strike(0.0) is True
    assert pacing.strike(2.0) is False  # one more allowed per interval
    assert pacing.strike(2.1) is True


def test_announces_are_paced_per_worker():
    pacing = Pacing(interval=1.0, now=0.0)
    assert [pacing.announce(0.0) for _ in range(ANNOUNCE_BURST)] == [True] * ANNOUNCE_BURST
    assert pacing.announce(0.5) is False
    assert pacing.announce(1.0) is True


def test_a_reload_changes_the_pace_from_now():
    pacing = Pacing(interval=5.0, now=0.0)
    for _ in range(REPORT_BURST):
        pacing.report(0.0)
    pacing.reconfigure(0.5, now=0.0)
    assert pacing.report(0.0) == pytest.approx(0.25)  # 4 a second now
    with pytest.raises(ValueError, match="interval must be > 0"):
        pacing.reconfigure(0.0, now=1.0)


@pytest.mark.parametrize(("peers", "refused"), [
    ([("t", 1000)] * MAX_UNANNOUNCED_PER_UID, []),
    ([("t", 1000)] * (MAX_UNANNOUNCED_PER_UID + 1), [MAX_UNANNOUNCED_PER_UID]),
    ([("t", 1000)] * MAX_UNANNOUNCED_PER_UID + [("t", 1001)], []),  # another uid has its own bound
    ([("t", 0)] * MAX_UNANNOUNCED_PER_UID + [("u", 0)], []),  # root on another tenant's socket too
])
def test_unannounced_connections_are_bounded_per_socket_and_uid(peers, refused):
    held = Unannounced()
    assert [i for i, (tenant, uid) in enumerate(peers) if held.enter(tenant, uid) is not None] == refused


def test_unannounced_connections_are_bounded_in_all_and_leave_frees_a_place():
    held = Unannounced(per_uid=2, total=3)
    assert [held.enter("t", u) for u in (1, 1, 2)] == [None, None, None]
    assert "have not announced" in (held.enter("t", 3) or "")
    held.leave("t", 1)
    assert held.enter("t", 3) is None and held.total == 3
    held.leave("t", 99)  # an unknown uid changes nothing
    assert held.total == 3


def test_new_connections_per_tenant_socket_are_a_rate():
    budget = ConnectionBudget(now=0.0)
    assert sum(budget.accept(0.0) == 0.0 for _ in range(ACCEPT_BURST + 10)) == ACCEPT_BURST
    assert budget.accept(0.0) == pytest.approx(1 / ACCEPT_RATE)  # accepting pauses this long
    later = 1 / ACCEPT_RATE
    assert budget.accept(later) == 0.0 and budget.accept(later) > 0.0
    budget.unused()  # the accept found no connection after all: the token is back
    assert budget.accept(later) == 0.0 and budget.accept(later) > 0.0


@pytest.mark.parametrize(("notes", "said"), [
    # (peer, reason, now) ... → what is said for each (None: nothing)
    ([("w", "too-fast", 0.0), ("w", "too-fast", 1.0), ("w", "too-fast", 2.0)],
     [Saying(0, None), None, None]),
    ([("w", "too-fast", 0.0), ("w", "too-fast", 1.0), ("w", "not-json", 2.0), ("w", "not-json", 3.0)],
     [Saying(0, None), None, Saying(1, "too-fast"), None]),
    ([("w", "too-fast", 0.0), ("v", "too-fast", 0.5)], [Saying(0, None), Saying(0, None)]),  # per peer
    ([("w", "too-fast", 0.0), ("w", "too-fast", 30.0), ("w", "too-fast", 61.0)],  # a steady attack: a line a minute
     [Saying(0, None), None, Saying(1, "too-fast")]),
    ([("w", "too-fast", 0.0), ("w", "too-fast", 61.0)], [Saying(0, None), Saying(0, None)]),
    # A worker reconnecting in a loop alternates between reasons: each is said once a minute, not at each change.
    ([("w", "announce-too-often", 0.0), ("w", "too-many-connections", 0.1), ("w", "announce-too-often", 0.2),
      ("w", "too-many-connections", 0.3), ("w", "announce-too-often", 60.0)],
     [Saying(0, None), Saying(0, None), None, None, Saying(2, "too-many-connections")]),
])
def test_a_refusal_is_said_once_per_change_of_reason(notes, said):
    refusals = RefusalLog(quiet=60.0)
    assert [refusals.note(peer, reason, now) for peer, reason, now in notes] == said


def test_a_forgotten_peer_starts_afresh():
    refusals = RefusalLog()
    refusals.note("w", "too-fast", 0.0)
    refusals.forget("w")
    assert len(refusals) == 0 and refusals.note("w", "too-fast", 1.0) == Saying(0, None)


# ---------------------------------------------------------------------------------------------- real peers


async def _announce(server, registry, worker="t.a.g.1"):
    registry.workers[worker] = ("secret", os.getpid())
    reader, writer = await asyncio.open_unix_connection(server.path("t"), limit=4 * MAX_LINE)
    writer.write(json.dumps({"type": "announce", "worker": worker, "token": "secret"}).encode() + b"\n")
    await writer.drain()
    assert json.loads(await asyncio.wait_for(reader.readline(), 5)) == {"type": "ok"}
    return reader, writer


async def _closed(reader, timeout=5.0) -> bytes:
    """Everything the server sent until it closed the connection (fails if it does not within ``timeout``)."""
    received = b""
    async with asyncio.timeout(timeout):
        while chunk := await reader.read(65536):
            received += chunk
    return received


def _refused(server, reason, tenant="t", app=""):
    assert reason in REASONS
    return server.refusals().get((tenant, app, reason), 0)


async def test_a_connection_that_does_not_announce_is_closed_after_the_deadline(tmp_path):
    server = await serve_channel(tmp_path, Registry())
    try:
        reader, writer = await asyncio.open_unix_connection(server.path("t"))
        started = time.monotonic()
        reply = await _closed(reader, ANNOUNCE_DEADLINE + 3)
        assert time.monotonic() - started >= ANNOUNCE_DEADLINE - 0.2
        assert b"no announce within" in reply
        assert _refused(server, "announce-timeout") == 1 and server.connected() == 0
        writer.close()
    finally:
        await server.stop()


async def test_unannounced_connections_past_the_bound_are_closed_at_once(tmp_path):
    server = await serve_channel(tmp_path, Registry())
    opened = []
    try:
        for _ in range(MAX_UNANNOUNCED_PER_UID + 4):
            opened.append(await asyncio.open_unix_connection(server.path("t")))
        # The ones past the bound are closed at once (the ones within it wait for their announce).
        extra = [await _closed(reader, 2.0) for reader, _ in opened[MAX_UNANNOUNCED_PER_UID:]]
        assert all(b"have not announced" in reply for reply in extra)
        assert _refused(server, "too-many-unannounced") == 4
        assert server.connected() == MAX_UNANNOUNCED_PER_UID
    finally:
        for _, writer in opened:
            writer.close()
        await server.stop()


async def test_connections_past_the_tenant_sockets_rate_wait_unaccepted_then_are_served(tmp_path):
    """Past the rate, elasticd stops accepting: the connections wait in the kernel's backlog (costing it nothing)
    and are served as the budget refills; none is refused."""
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    extra = 8
    workers = [f"t.a.g.{i}" for i in range(ACCEPT_BURST + extra)]
    for worker in workers:
        registry.workers[worker] = ("secret", os.getpid())
    started = time.monotonic()

    async def announce(worker: str) -> float:
        reader, writer = await asyncio.open_unix_connection(server.path("t"))
        writer.write(json.dumps({"type": "announce", "worker": worker, "token": "secret"}).encode() + b"\n")
        await writer.drain()
        assert json.loads(await asyncio.wait_for(reader.readline(), 10)) == {"type": "ok"}
        waited = time.monotonic() - started
        writer.close()
        return waited

    try:
        waits = sorted(await asyncio.gather(*(announce(w) for w in workers)))
        assert waits[-1] >= (extra - 1) / ACCEPT_RATE * 0.8  # the last ones waited for the budget
        assert _refused(server, "too-many-connections") >= 1  # counted once a pause, not per connection
        assert not {r for (_, _, r) in server.refusals()} - {"too-many-connections"}  # nothing else refused
    finally:
        await server.stop()


async def test_a_report_flood_is_paced_and_pushed_back_into_the_senders_socket(tmp_path, caplog):
    registry = Registry()
    server = await serve_channel(tmp_path, registry, interval=0.5)  # 4 reports a second at most
    try:
        _, writer = await _announce(server, registry)
        line = json.dumps({"type": "occupancy", "report": {"cpu": 0.1}}).encode() + b"\n"
        sent, started = 0, time.monotonic()
        caplog.set_level(logging.INFO, logger="elasticd.channel")
        while time.monotonic() - started < 1.5:  # flat out, as long as the kernel takes it
            writer.write(line * 100)
            sent += 100
            try:
                await asyncio.wait_for(writer.drain(), 0.1)
            except TimeoutError:
                break  # pushed back: elasticd stopped reading, the sockets' buffers are full
        elapsed = time.monotonic() - started
        taken = len(registry.reports)
        assert taken <= REPORT_BURST + 4 * elapsed + 2, (taken, elapsed)
        assert sent > 1000 and taken < sent / 100  # nearly all of it waits unread, not parsed and discarded
        assert _refused(server, "too-fast", app="a") <= taken + 2  # one refusal per pause, not per line
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "too-fast" in warnings[0].getMessage()
        writer.close()
    finally:
        await server.stop()


async def test_unusable_lines_are_refused_then_the_connection_is_closed(tmp_path, caplog):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    try:
        reader, writer = await _announce(server, registry)
        caplog.set_level(logging.WARNING, logger="elasticd.channel")
        writer.write(b"garbage\n" * 100)
        await writer.drain()
        replies = (await _closed(reader)).splitlines()
        assert len(replies) == STRIKE_BURST + 1  # one reply per refused line, then the closing one
        assert b"too many unusable lines: closing" in replies[-1]
        assert _refused(server, "not-json", app="a") == STRIKE_BURST + 1
        assert _refused(server, "struck-out", app="a") == 1
        said = [r.getMessage() for r in caplog.records]
        assert len(said) == 2 and "struck-out" in said[1] and f"{STRIKE_BURST} refusals not logged" in said[1]
        # Reconnecting brings no fresh allowance of strikes: one more bad line and it is closed again.
        reader, writer = await _announce(server, registry)
        writer.write(b"garbage\n")
        await writer.drain()
        assert b"too many unusable lines" in await _closed(reader)
    finally:
        await server.stop()


async def test_a_line_over_the_bound_closes_the_connection(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    try:
        reader, writer = await _announce(server, registry)
        writer.write(b"x" * (70 << 10) + b"\n")
        await writer.drain()
        assert b"longer than" in await _closed(reader)
        assert _refused(server, "too-long", app="a") == 1
    finally:
        await server.stop()


async def test_reannouncing_in_a_loop_is_paced(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry, interval=60.0)
    try:
        for _ in range(ANNOUNCE_BURST):
            _, writer = await _announce(server, registry)
            writer.close()
        reader, writer = await asyncio.open_unix_connection(server.path("t"))
        writer.write(json.dumps({"type": "announce", "worker": "t.a.g.1", "token": "secret"}).encode() + b"\n")
        assert b"announces more often than its allowance" in await _closed(reader)
        assert _refused(server, "announce-too-often") == 1  # (before an accepted announce: no app label)
    finally:
        await server.stop()


async def test_a_peer_that_does_not_read_is_closed(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    try:
        _, writer = await _announce(server, registry)
        # elasticd tells it things it never reads (each a user to forget): the kernel's buffers fill, then
        # elasticd's own, then the bound.
        told = 0
        while server.tell("t.a.g.1", {"type": "forget", "user": "u" * 4000}):
            told += 1
            if told % 50 == 0:
                await asyncio.sleep(0.01)
            assert told < 10_000
        assert _refused(server, "not-reading", app="a") == 1
        await asyncio.sleep(0.05)
        assert server.connected() == 0
        writer.close()
    finally:
        await server.stop()


async def test_an_answer_over_its_requests_limit_fails_the_request_and_closes(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    try:
        reader, writer = await _announce(server, registry)

        async def answer_too_much():
            request = json.loads(await reader.readline())
            writer.write(json.dumps({"type": "register", "id": request["id"], "bytes": 5000}).encode() + b"\n"
                         + b"[" + b" " * 4998 + b"]")
            await writer.drain()

        answering = asyncio.ensure_future(answer_too_much())
        with pytest.raises(ChannelError, match="answer of 5000 bytes is over the 1000 allowed"):
            await server.request("t.a.g.1", {"type": "monitor"}, 5.0, answer_limit=1000)
        await answering
        assert _refused(server, "answer-too-big", app="a") == 1
        assert b"closing" in await _closed(reader)
    finally:
        await server.stop()


async def test_bytes_after_a_message_that_carries_none_close_the_connection(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    try:
        reader, writer = await _announce(server, registry)
        writer.write(json.dumps({"type": "occupancy", "report": {}, "bytes": 10}).encode() + b"\n0123456789")
        await writer.drain()
        assert b"carries no bytes" in await _closed(reader)
        assert _refused(server, "bad-payload", app="a") == 1
    finally:
        await server.stop()


async def test_a_late_answer_is_refused_as_unasked(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    try:
        reader, writer = await _announce(server, registry)
        writer.write(json.dumps({"type": "register", "id": 12345}).encode() + b"\n")
        await writer.drain()
        reply = json.loads(await asyncio.wait_for(reader.readline(), 5))
        assert "not asked" in reply["reason"] and _refused(server, "unexpected-answer", app="a") == 1
        writer.close()
    finally:
        await server.stop()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the socket's directory is given to another user")
async def test_only_the_tenants_own_user_can_connect_to_its_channel(tmp_path):
    """The socket is in the tenant's 0700 directory: any other user is refused by the kernel before elasticd sees
    a byte (no accept, no descriptor)."""
    nobody = pwd.getpwnam("nobody")
    registry = Registry()
    runtime = Path(tempfile.mkdtemp(prefix="elasticd-channel-", dir="/tmp"))  # (pytest's tmp_path is root's: 0700)
    runtime.chmod(0o755)
    server = await serve_channel(runtime, registry)
    directory = os.path.dirname(server.path("t"))
    os.chown(directory, 0, 0)
    os.chmod(directory, 0o700)
    connect = f"import socket; socket.socket(socket.AF_UNIX).connect({server.path('t')!r})"
    try:
        denied = await asyncio.to_thread(subprocess.run, ["setpriv", f"--reuid={nobody.pw_uid}",
                                                          f"--regid={nobody.pw_gid}", "--clear-groups",
                                                          sys.executable, "-c", connect],
                                         capture_output=True, text=True, timeout=30)
        assert denied.returncode != 0 and "PermissionError" in denied.stderr
        assert server.connected() == 0
        os.chown(directory, nobody.pw_uid, nobody.pw_gid)  # the tenant's own user: it connects
        allowed = await asyncio.to_thread(subprocess.run, ["setpriv", f"--reuid={nobody.pw_uid}",
                                                           f"--regid={nobody.pw_gid}", "--clear-groups",
                                                           sys.executable, "-c", connect],
                                          capture_output=True, text=True, timeout=30)
        assert allowed.returncode == 0, allowed.stderr
    finally:
        await server.stop()
        shutil.rmtree(runtime)


async def test_a_socket_file_the_tenant_removed_is_made_again_at_the_next_activation(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    try:
        path = server.path("t")
        os.unlink(path)  # the directory is the tenant's: it may do this
        assert await server.serve({"t": path}) == []
        _, writer = await _announce(server, registry)
        writer.close()
        # A tenant no longer served: its socket goes.
        assert await server.serve({}) == [] and not os.path.exists(path) and server.path("t") is None
    finally:
        await server.stop()
