"""A live move's traffic on the channel: the framing (tables), the worker library's user states and move
thread, and both real ends (elasticd's ChannelServer, the library's ChannelClient in its threads) asking for a
user's package on one worker and installing it on another."""

from __future__ import annotations

import asyncio
import os
import pickle

import pytest
from test_pool_channel_server import Registry, serve_channel

from elasticd.frames import MAX_LINE, MAX_PAYLOAD, FrameError, FrameReader, encode
from elasticd.pool.channel_server import ChannelError, ChannelServer
from elasticd.worker.channel import ChannelClient
from elasticd.worker.moves import MoveHandler
from elasticd.worker.user_state import UserStates

# ------------------------------------------------------------------ framing


def test_a_message_with_bytes_is_its_line_then_the_raw_bytes():
    data = encode({"type": "package", "id": 3}, b"\x00\nraw\n")
    assert data == b'{"type":"package","id":3,"bytes":6}\n\x00\nraw\n'
    assert FrameReader().feed(data) == [({"type": "package", "id": 3, "bytes": 6}, b"\x00\nraw\n")]


@pytest.mark.parametrize("cut", range(1, 40))
def test_however_the_stream_is_cut_the_same_messages_come_out(cut):
    stream = encode({"type": "a"}) + encode({"type": "install", "id": 1}, b"x\ny" * 5) + b"\n" + encode({"n": 2})
    reader = FrameReader()
    got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
    assert got == [({"type": "a"}, None), ({"type": "install", "id": 1, "bytes": 15}, b"x\ny" * 5), ({"n": 2}, None)]


@pytest.mark.parametrize(("data", "why"), [
    (b"{nope\n", "not JSON"),
    (b"[1, 2]\n", "must be a JSON object"),
    (b'{"bytes": -1}\n', '"bytes" must be a count'),
    (b'{"bytes": "10"}\n', '"bytes" must be a count'),
    (b'{"bytes": true}\n', '"bytes" must be a count'),
    (b'{"bytes": %d}\n' % (MAX_PAYLOAD + 1), '"bytes" must be a count'),
    (b"x" * (MAX_LINE + 1), "longer than"),
])
def test_what_cannot_be_framed_is_an_error_naming_why(data, why):
    with pytest.raises(FrameError, match=why):
        FrameReader().feed(data)


# ------------------------------------------------------------------ the library's side


def test_a_users_state_and_the_apps_own_go_in_its_package_and_come_back_installed():
    kept: dict[str, object] = {}
    source, target = UserStates(), UserStates()
    source.hooks(lambda user: {"doc": f"{user}'s document"}, lambda user, obj: None)
    target.hooks(lambda user: None, lambda user, obj: kept.__setitem__(user, obj))
    source.of("alice")["count"] = 5
    package = source.snapshot("alice")
    assert pickle.loads(package) == {"state": {"count": 5}, "extra": {"doc": "alice's document"}}
    assert source.of("alice") == {"count": 5}  # kept until forgotten: an aborted move leaves it here
    target.of("alice")["count"] = 99  # a stale copy from an earlier visit is replaced
    target.install("alice", package)
    assert target.of("alice") == {"count": 5} and kept == {"alice": {"doc": "alice's document"}}
    source.forget("alice")
    assert len(source) == 0


def test_hooks_come_in_pairs():
    with pytest.raises(ValueError, match="both hooks"):
        UserStates().hooks(lambda user: None, None)


@pytest.mark.parametrize(("message", "payload", "answer"), [
    ({"type": "snapshot", "id": 1}, None, {"type": "refused", "id": 1, "reason": "snapshot needs a user"}),
    ({"type": "install", "id": 2, "user": "u"}, None,
     {"type": "refused", "id": 2, "reason": "ValueError: an install carries the package"}),
    ({"type": "install", "id": 3, "user": "u"}, pickle.dumps(["not", "a", "package"]),
     {"type": "refused", "id": 3, "reason": "ValueError: not a package of elasticd.worker's"}),
    ({"type": "install", "id": 4, "user": "u"}, b"\x80\x05garbage",
     {"type": "refused", "id": 4, "reason": "UnpicklingError: pickle data was truncated"}),
    ({"type": "dance", "id": 5, "user": "u"}, None,
     {"type": "refused", "id": 5, "reason": "ValueError: unknown request 'dance'"}),
])
def test_a_request_the_library_cannot_do_is_refused_with_its_reason(message, payload, answer):
    assert MoveHandler(UserStates()).answer(message, payload) == (answer, None)


def test_an_apps_hook_that_fails_refuses_the_snapshot():
    states = UserStates()
    states.hooks(lambda user: 1 / 0, lambda user, obj: None)
    answer, _ = MoveHandler(states).answer({"type": "snapshot", "id": 9, "user": "u"}, None)
    assert answer == {"type": "refused", "id": 9, "reason": "ZeroDivisionError: division by zero"}


# ------------------------------------------------------------------ both real ends


@pytest.fixture
async def channel(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    clients: list[ChannelClient] = []

    def connect(worker_id: str, states: UserStates | None) -> ChannelClient:
        registry.workers[worker_id] = (f"token-{worker_id}", os.getpid())
        client = ChannelClient(lambda now: {"cpu": 0.0, "executor": {"busy": 0, "total": 1}}, path=server.path("t"),
                               worker_id=worker_id, token=f"token-{worker_id}", interval=0.2,
                               moves=MoveHandler(states) if states is not None else None)
        client.start()
        clients.append(client)
        return client

    yield server, connect
    for client in clients:
        client.stop()
    await server.stop()


async def _connected(server: ChannelServer, *workers: str) -> None:
    for _ in range(250):
        if all(server.capabilities(w) for w in workers):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{workers} did not announce")


async def test_a_package_goes_from_one_worker_to_another_over_the_channel(channel):
    server, connect = channel
    a_states, b_states = UserStates(), UserStates()
    a_states.of("alice").update(count=5, blob=os.urandom(200_000))  # over a line's bound: raw bytes
    connect("t.a.g.1", a_states)
    connect("t.a.g.2", b_states)
    await _connected(server, "t.a.g.1", "t.a.g.2")
    assert server.capabilities("t.a.g.1") == {"occupancy", "snapshot", "install"}
    answer, package = await server.request("t.a.g.1", {"type": "snapshot", "user": "alice"}, 5.0)
    assert answer["type"] == "package" and package is not None and len(package) > 200_000
    answer, _ = await server.request("t.a.g.2", {"type": "install", "user": "alice"}, 5.0, package)
    assert answer["type"] == "installed"
    assert b_states.of("alice") == a_states.of("alice")
    assert server.tell("t.a.g.1", {"type": "forget", "user": "alice"})
    # What a library announced is remembered while it reconnects (a move then fails rather than re-points),
    # and forgotten when the worker exits.
    server.forget("t.a.g.2")
    assert server.capabilities("t.a.g.2") == frozenset() and "install" in server.capabilities("t.a.g.1")
    for _ in range(100):
        if not len(a_states):
            break
        await asyncio.sleep(0.02)
    assert len(a_states) == 0


async def test_a_worker_without_state_refuses_and_an_unknown_worker_is_an_error(channel):
    server, connect = channel
    connect("t.a.g.3", None)
    await _connected(server, "t.a.g.3")
    assert server.capabilities("t.a.g.3") == {"occupancy"}
    answer, _ = await server.request("t.a.g.3", {"type": "snapshot", "user": "alice"}, 5.0)
    assert answer == {"type": "refused", "id": answer["id"], "reason": "no state to move here"}
    with pytest.raises(ChannelError, match="has no channel connection"):
        await server.request("t.a.g.9", {"type": "snapshot", "user": "alice"}, 1.0)
    assert not server.tell("t.a.g.9", {"type": "forget", "user": "alice"})


async def test_a_request_nobody_answers_times_out_and_a_closed_channel_fails_what_it_was_asked(channel):
    server, _ = channel
    registry_reader, writer = await asyncio.open_unix_connection(server.path("t"))
    # A peer that announces (as this test process) and then never answers.
    server._authenticate = lambda *args: None  # type: ignore[assignment]
    writer.write(encode({"type": "announce", "worker": "t.a.g.7", "token": "t", "capabilities": ["snapshot"]}))
    await writer.drain()
    assert b'"ok"' in await asyncio.wait_for(registry_reader.readline(), 5)
    with pytest.raises(TimeoutError):
        await server.request("t.a.g.7", {"type": "snapshot", "user": "alice"}, 0.2)
    asked = asyncio.create_task(server.request("t.a.g.7", {"type": "snapshot", "user": "alice"}, 5.0))
    await asyncio.sleep(0.1)
    writer.close()
    with pytest.raises(ChannelError, match="closed before it answered"):
        await asked
