"""HTTP/1.1 on the wire through the front: pipelining, Connection: close, HTTP/1.0, framing changes, bounds
(431, 400), WebSocket upgrades both ways, the login header, idle connections and a graceful stop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from test_front import answers, client, front, no_errors_logged, raw, raw_upstream, run, upstream_app, workers

from elasticd.front import COMPILED, Upstream

__all__ = ["no_errors_logged", "workers"]  # fixtures, used by name

GET = b"GET /%s HTTP/1.1\r\nHost: shop.localhost\r\n\r\n"


async def _path(request: web.Request) -> web.Response:
    body = await request.read()
    return web.Response(text=f"{request.method} {request.path_qs} {len(body)}")


def test_pipelined_requests_are_answered_in_order(tmp_path: Path) -> None:
    body = os.urandom(70_000)
    wire = (GET % b"a" + b"POST /b HTTP/1.1\r\nHost: shop.localhost\r\nContent-Length: %d\r\n\r\n" % len(body) + body
            + b"POST /c HTTP/1.1\r\nHost: shop.localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"5\r\nhello\r\n3\r\nabc\r\n0\r\n\r\n"
            + GET % b"d?x=1" + b"GET /e HTTP/1.1\r\nHost: nowhere.localhost\r\n\r\n"
            + b"GET /f HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n"
            + GET % b"never")  # after Connection: close: not answered

    async def scenario() -> bytes:
        async with upstream_app(tmp_path / "w.sock", _path) as ups, front(ups) as f:
            return await raw(f, wire)

    got = answers(run(scenario()))
    assert [(a.status, a.body) for a in got] == [
        (200, b"GET /a 0"), (200, b"POST /b %d" % len(body)), (200, b"POST /c 8"), (200, b"GET /d?x=1 0"),
        (404, b"no app for host nowhere.localhost\n"), (200, b"GET /f 0")]
    assert got[-1].header("Connection") == "close"


@pytest.mark.parametrize(("request_head", "connection", "more"), [
    (b"GET /a HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n", "close", False),
    (b"GET /a HTTP/1.0\r\nHost: shop.localhost\r\n\r\n", "close", False),
    (b"GET /a HTTP/1.0\r\nHost: shop.localhost\r\nConnection: keep-alive\r\n\r\n", "keep-alive", True),
])
def test_connection_close_and_http10(tmp_path: Path, request_head: bytes, connection: str, more: bool) -> None:
    async def scenario() -> bytes:
        async with upstream_app(tmp_path / "w.sock", _path) as ups, front(ups) as f:
            # a second request on the same connection is answered only when the first kept it alive
            return await raw(f, request_head + b"GET /b HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n")

    got = answers(run(scenario()))
    assert got[0].header("Connection") == connection
    assert [a.body for a in got] == ([b"GET /a 0", b"GET /b 0"] if more else [b"GET /a 0"])


def test_framing_follows_the_client(tmp_path: Path) -> None:
    """A chunked or close-delimited answer is re-chunked for HTTP/1.1 and close-delimited for HTTP/1.0."""
    def answer(head: bytes) -> bytes:
        if b" /chunked " in head:
            return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n"
        return b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end"  # and the worker closes

    async def scenario() -> list[bytes]:
        async with raw_upstream(tmp_path / "raw.sock", answer, close_after=b"/eof") as ups, front(ups) as f:
            return [await raw(f, b"GET /chunked HTTP/1.1\r\nHost: shop.localhost\r\n\r\n"
                                 b"GET /eof HTTP/1.1\r\nHost: shop.localhost\r\n\r\n"
                                 b"GET /chunked HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n"),
                    await raw(f, b"GET /chunked HTTP/1.0\r\nHost: shop.localhost\r\nConnection: keep-alive\r\n\r\n")]

    eleven, ten = run(scenario())
    got = answers(eleven)
    assert [(a.header("Transfer-Encoding"), a.body) for a in got] == [
        ("chunked", b"abcdef"), ("chunked", b"until the end"), ("chunked", b"abcdef")]
    assert b"4\r\nabcd\r\n2\r\nef\r\n0\r\n\r\n" in eleven
    assert ten.startswith(b"HTTP/1.1 200 OK\r\n") and ten.endswith(b"\r\n\r\nabcdef")
    assert b"Connection: close\r\n" in ten and b"Transfer-Encoding" not in ten


@pytest.mark.parametrize("split", [False, True])
def test_oversized_headers_are_431(workers: list[Upstream], split: bool) -> None:
    big = b"GET / HTTP/1.1\r\nHost: shop.localhost\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n"

    async def scenario() -> bytes:
        async with front(workers) as f:
            if not split:
                return await raw(f, big)
            reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
            with suppress(ConnectionError):  # the front answers as soon as the bound is passed
                for i in range(0, len(big), 1000):  # a slow head: each read on its own
                    writer.write(big[i:i + 1000])
                    await writer.drain()
                    await asyncio.sleep(0.001)
            got = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return got

    got = answers(run(scenario()))
    assert [(a.status, a.header("Connection")) for a in got] == [(431, "close")]


def test_headers_under_the_bound_pass(workers: list[Upstream]) -> None:
    async def scenario() -> int:
        async with front(workers) as f, client(f) as request, \
                request("/", headers={f"X-Big-{i}": "a" * 7_000 for i in range(4)}) as resp:
            return resp.status

    assert run(scenario()) == 200


@pytest.mark.parametrize("wire", [
    b"BLAH\r\n\r\n", b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"])
def test_malformed_request_is_400(workers: list[Upstream], wire: bytes) -> None:
    async def scenario() -> bytes:
        async with front(workers) as f:
            return await raw(f, wire)

    got = answers(run(scenario()))
    assert [(a.status, a.header("Connection")) for a in got] == [(400, "close")]


@pytest.mark.parametrize(("wire", "status"), [
    (b"GET / HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
    (b"GET /\r\n\r\n", 400),  # HTTP/0.9
    (b"GET / HTTP/1.1\r\nHost: shop.localhost\r\nHost: blog.localhost\r\n\r\n", 400),  # two Hosts
    (b"GET * HTTP/1.1\r\nHost: shop.localhost\r\n\r\n", 400),
    (b"GET ftp://shop.localhost/ HTTP/1.1\r\nHost: shop.localhost\r\n\r\n", 400),
    (b"CONNECT shop.localhost:443 HTTP/1.1\r\nHost: shop.localhost\r\n\r\n", 501),
    (b"CONNECT / HTTP/1.1\r\nHost: shop.localhost\r\n\r\n", 501),  # origin-form: past the head checks
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nHost: shop.localhost\r\n\r\n", 414),
    (b"POST / HTTP/1.1\r\nHost: shop.localhost\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + b"x" * 70_000, 400),
])
def test_what_rfc_9112_refuses_never_reaches_a_worker(workers: list[Upstream], wire: bytes, status: int) -> None:
    async def scenario() -> bytes:
        async with front(workers) as f:
            with suppress(ConnectionError):
                return await raw(f, wire)
            return b""

    got = answers(run(scenario()))
    assert [(a.status, a.header("Connection")) for a in got] == [(status, "close")]
    assert b"worker" not in got[0].body


def test_an_absolute_form_target_is_routed_by_its_own_authority(tmp_path: Path) -> None:
    async def echo(request: web.Request) -> web.Response:
        return web.Response(text=f"{request.headers['Host']} {request.path_qs}")

    wire = (b"GET http://shop.localhost/x?y=1 HTTP/1.1\r\nHost: nowhere.localhost\r\n\r\n"
            b"GET http://nowhere.localhost/ HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n")

    async def scenario() -> bytes:
        async with upstream_app(tmp_path / "w.sock", echo) as ups, front({("acme", "shop", "green"): ups}) as f:
            return await raw(f, wire)

    got = answers(run(scenario()))
    assert [(a.status, a.body) for a in got] == [(200, b"shop.localhost /x?y=1"),
                                                (404, b"no app for host nowhere.localhost\n")]


def test_websocket_is_relayed_both_ways(tmp_path: Path) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() != "websocket":
            return web.Response(text="plain")
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(f"welcome {request.headers['X-Elastic-User-Id'][:4]}")  # the worker speaks first
        async for message in ws:
            if message.type == aiohttp.WSMsgType.TEXT:
                await ws.send_str(message.data.upper())
            elif message.type == aiohttp.WSMsgType.BINARY:
                await ws.send_bytes(message.data[::-1])
        return ws

    async def scenario() -> list[object]:
        async with upstream_app(tmp_path / "ws.sock", handler) as ups, front(ups) as f:
            got: list[object] = []
            async with aiohttp.ClientSession() as session, session.ws_connect(
                    f"http://127.0.0.1:{f.port}/ws", headers={"Host": "shop.localhost"}) as ws:
                got.append((await ws.receive(timeout=5)).data[:8])
                await ws.send_str("hello")
                got.append((await ws.receive(timeout=5)).data)
                payload = os.urandom(200_000)
                await ws.send_bytes(payload)
                got.append((await ws.receive(timeout=5)).data == payload[::-1])
            for _ in range(50):
                if not f.listening.conns:
                    break
                await asyncio.sleep(0.02)
            got.append(len(f.listening.conns))
            got.append(dict(f.forwards.routes[("acme", "shop")].codes))
            return got

    assert run(scenario()) == ["welcome ", "HELLO", True, 0, {101: 1}]


def test_upgrade_refused_by_the_worker_is_answered_and_closed(tmp_path: Path) -> None:
    async def scenario() -> bytes:
        async with upstream_app(tmp_path / "w.sock", _path) as ups, front(ups) as f:
            return await raw(f, b"GET /ws HTTP/1.1\r\nHost: shop.localhost\r\nUpgrade: websocket\r\n"
                                b"Connection: Upgrade\r\n\r\n")

    got = answers(run(scenario()))
    assert [(a.status, a.body, a.header("Connection")) for a in got] == [(200, b"GET /ws 0", "close")]


def test_login_header_marks_the_user_and_is_stripped(tmp_path: Path) -> None:
    async def handler(request: web.Request) -> web.Response:
        name = request.query.get("login")
        return web.Response(text="ok", headers={"X-Elastic-Login": name} if name else {})

    async def scenario() -> tuple[list[str | None], list[str | None]]:
        async with upstream_app(tmp_path / "w.sock", handler) as ups, front(ups) as f, client(f) as request:
            logins, leaked = [], []
            async with request("/?login=alice") as resp:  # logged in on its very first answer
                user = resp.cookies["elastic_uid"].value
                leaked.append(resp.headers.get("X-Elastic-Login"))
            cookie = {"Cookie": f"elastic_uid={user}"}
            logins.append(f.surface.users[user].login)
            for query in ("", "?login=-", "?login=%20bob%20"):
                async with request(f"/{query}", headers=cookie) as resp:
                    leaked.append(resp.headers.get("X-Elastic-Login"))
                logins.append(f.surface.users[user].login)
            return logins, leaked

    logins, leaked = run(scenario())
    assert logins == ["alice", "alice", None, "bob"]
    assert leaked == [None] * 4


def test_a_login_asks_the_pool_where_the_user_lives(tmp_path: Path) -> None:
    def worker(name: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            login = request.query.get("login")
            return web.Response(text=name, headers={"X-Elastic-Login": login} if login else {})
        return handler

    async def scenario() -> tuple[list[str], list[tuple[tuple[str, str, str], str]]]:
        asked: list[tuple[tuple[str, str, str], str]] = []
        async with upstream_app(tmp_path / "a.sock", worker("a"), "a") as a, \
                upstream_app(tmp_path / "b.sock", worker("b"), "b") as b, front(a + b) as f, client(f) as request:
            # the pool passes to b
            f.forwarding.on_login = lambda key, user, worker, placed: asked.append((key, user)) or "b"
            served = []
            async with request("/") as resp:
                user = resp.cookies["elastic_uid"].value
                served.append(await resp.text())
            cookie = {"Cookie": f"elastic_uid={user}"}
            for query in ("", "?login=alice", "", "?login=-", ""):
                async with request(f"/{query}", headers=cookie) as resp:
                    served.append(await resp.text())
            return served, asked

    served, asked = run(scenario())
    assert served == ["a", "a", "a", "b", "b", "b"]  # the login is answered where the guest was, then moves
    assert [key for key, _ in asked] == [("acme", "shop", "green")]  # asked at the login, not at the logout


@pytest.mark.parametrize("trusted", [True, False])
def test_secure_cookie_when_a_trusted_proxy_says_the_request_came_over_tls(workers: list[Upstream],
                                                                           trusted: bool) -> None:
    async def scenario() -> list[str]:
        async with front(workers) as f, client(f) as request:
            f.configure(request_timeout=5.0, user_ttl=1800.0, trusts=lambda peer, own: trusted)
            cookies = []
            for proto in ("https", "http"):
                async with request("/", headers={"X-Forwarded-Proto": proto}) as resp:
                    cookies.append(resp.headers["Set-Cookie"])
            return cookies

    secure, plain = run(scenario())
    assert secure.endswith("; Path=/; HttpOnly; SameSite=Lax" + ("; Secure" if trusted else ""))
    assert plain.endswith("; Path=/; HttpOnly; SameSite=Lax")


def test_idle_keep_alive_connections_are_closed(workers: list[Upstream]) -> None:
    async def scenario() -> tuple[bytes, float]:
        async with front(workers, keepalive_timeout=0.3) as f:
            reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
            writer.write(GET % b"")
            loop = asyncio.get_running_loop()
            start = loop.time()
            got = await asyncio.wait_for(reader.read(), 5)  # the answer, then EOF once idle
            writer.close()
            return got, loop.time() - start

    got, took = run(scenario())
    assert got.startswith(b"HTTP/1.1 200 OK") and 0.2 < took < 2


def test_stop_lets_answers_under_way_finish(workers: list[Upstream]) -> None:
    async def scenario() -> tuple[int, str]:
        async with front(workers) as f, client(f) as request:
            slow = asyncio.ensure_future(request("/sleep?ms=1000").__aenter__())
            deadline = asyncio.get_running_loop().time() + 5
            while not f.forwards.open:  # (under way: at its worker)
                assert asyncio.get_running_loop().time() < deadline, "the request never reached its worker"
                await asyncio.sleep(0.01)
            await f.stop(grace=5)
            resp = await slow
            return resp.status, await resp.text()

    assert run(scenario()) == (200, '{"slept_ms": 1000}')


def test_a_second_answer_in_the_same_read_is_dropped_and_the_first_stands(tmp_path: Path) -> None:
    """A worker that writes two answers for one request: the client gets the first, whole, and the connection it
    came on is closed (nothing of the second reaches anyone); the client's connection goes on (its next request
    gets a connection of its own)."""
    def answer(head: bytes) -> bytes:
        return (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"
                b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond")

    async def scenario() -> tuple[bytes, int]:
        async with raw_upstream(tmp_path / "raw.sock", answer) as ups, front(ups) as f:
            got = await raw(f, GET % b"a" + b"GET /b HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n")
            return got, len(f.forwards.open)

    got, still_open = run(scenario())
    assert [(a.status, a.body) for a in answers(got)] == [(200, b"first"), (200, b"first")]
    assert b"second" not in got and still_open == 0


@pytest.mark.skipif(COMPILED, reason="a compiled Exchange cannot be patched from Python (the sources' run has it)")
def test_an_illegal_step_fails_closed_and_gives_everything_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A step the relay's table refuses (forced here inside the worker's parser callback, where httptools wraps
    it): the client connection is aborted, the open-requests entry and the quota slot are given back, and the
    next request is served as usual."""
    from elasticd.config.model import Quotas
    from elasticd.front.core.exchange import Exchange
    from elasticd.front.core.relay import RelayError

    real = Exchange.answer_head
    calls = {"n": 0}

    def broken_once(self: Exchange, status: int, login: bytes | None) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RelayError("forced by the test")
        real(self, status, login)

    monkeypatch.setattr(Exchange, "answer_head", broken_once)

    async def scenario() -> tuple[bytes, bytes, dict, int]:
        async with upstream_app(tmp_path / "w.sock", _path) as ups, \
                front(ups, quotas={"acme": Quotas(max_concurrent_requests=1)}) as f:
            with suppress(ConnectionError):
                first = await raw(f, GET % b"first")
            second = await raw(f, b"GET /second HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n")
            return first, second, dict(f.forwards.open), f.quotas.get("acme").gate.in_flight

    with caplog.at_level("ERROR", logger="elasticd.front"):
        first, second, still_open, in_flight = run(scenario())
    assert first == b""  # aborted: no answer rather than one nobody owns
    assert [(a.status, a.body) for a in answers(second)] == [(200, b"GET /second 0")]
    assert still_open == {} and in_flight == 0
    assert any("forced by the test" in r.getMessage() for r in caplog.records)


def test_a_request_read_behind_a_refusal_that_closes_never_reaches_a_worker(tmp_path: Path,
                                                                             no_errors_logged: None) -> None:
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(text="served")

    async def scenario() -> bytes:
        async with upstream_app(tmp_path / "w.sock", handler) as ups, front(ups) as f:
            return await raw(f, b"GET /a HTTP/1.1\r\n\r\n" + GET % b"b")  # no Host, then a valid request

    got = answers(run(scenario()))
    assert [a.status for a in got] == [400] and seen == []
