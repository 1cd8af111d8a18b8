"""The front with real demo workers behind it: routing, failures as 404/502/503/504, streaming, headers.

Also the helpers the other front test modules use (``front``, ``client``, ``raw``, ``upstream_app``...).
"""

from __future__ import annotations

import asyncio
import gzip
import io
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import httptools
import pytest
from aiohttp import web
from test_demo import DemoWorker
from yarl import URL

from elasticd.config.model import Address
from elasticd.front import AppRoute, Front, RouteTable, Upstream

SHOP = AppRoute("acme", "shop", "green")
BLOG = AppRoute("globex", "blog", "blue")
ROUTES = RouteTable({"shop.localhost": SHOP, "blog.localhost": BLOG})


@pytest.fixture(autouse=True)
def no_errors_logged(caplog: pytest.LogCaptureFixture):
    """Expected failures are answered (502, 504, a cut connection), never logged as errors or tracebacks."""
    yield
    noisy = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not noisy, [r.getMessage() for r in noisy]


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory):
    where = tmp_path_factory.mktemp("front")
    started: list[DemoWorker] = []
    try:
        for worker_id in ("w1", "w2"):
            started.append(DemoWorker(worker_id, f"unix:{where}/{worker_id}.sock"))
        yield [Upstream(w.worker_id, w.socket_path) for w in started]
    finally:
        for worker in started:
            worker.stop()


Routable = Sequence[Upstream] | Mapping[tuple[str, str, str], Sequence[Upstream]] | Callable[[], Sequence[Upstream]]


@asynccontextmanager
async def front(upstreams: Routable, timeout: float = 5.0, **options: Any) -> AsyncIterator[Front]:
    """A front on a free port. ``upstreams``: the same workers for every app, a mapping per route key, or a
    callable asked at each request (so a test can reorder or empty the list)."""
    def routable(tenant: str, app: str, group: str) -> Sequence[Upstream]:
        if callable(upstreams):
            return upstreams()
        if isinstance(upstreams, Mapping):
            return upstreams.get((tenant, app, group), [])
        return upstreams

    f = Front(Address("127.0.0.1", 0), options.pop("routes", ROUTES), routable, request_timeout=timeout, **options)
    await f.start()
    try:
        yield f
    finally:
        await f.stop(1.0)


@asynccontextmanager
async def client(f: Front) -> AsyncIterator[Callable[..., Any]]:
    # No headers of the test client's own, so what the worker sees is what the test sent plus the front's.
    async with aiohttp.ClientSession(skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
                                     auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar()) as session:
        def request(path: str | URL, method: str = "GET", host: str = "shop.localhost", **kwargs: Any) -> Any:
            headers = {"Host": host, **kwargs.pop("headers", {})}
            url = path if isinstance(path, URL) else f"http://127.0.0.1:{f.port}{path}"
            return session.request(method, url, headers=headers, **kwargs)
        yield request


async def raw(f: Front, data: bytes, timeout: float = 5.0) -> bytes:
    """Send bytes on one connection and read until the front closes it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
    try:
        writer.write(data)
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


class Answer:
    __slots__ = ("body", "headers", "status")

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.body = b""

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)


def answers(data: bytes) -> list[Answer]:
    """The responses in a byte stream (none of them to a HEAD request)."""
    found: list[Answer] = []

    class Collect:
        def on_message_begin(self) -> None:
            found.append(Answer())

        def on_header(self, name: bytes, value: bytes) -> None:
            found[-1].headers.append((name.decode(), value.decode()))

        def on_headers_complete(self) -> None:
            found[-1].status = parser.get_status_code()

        def on_body(self, body: bytes) -> None:
            found[-1].body += body

    parser = httptools.HttpResponseParser(Collect())
    parser.feed_data(data)
    return found


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_routes_by_host_and_places_new_users_on_the_reception(workers: list[Upstream]) -> None:
    async def scenario() -> list[tuple[str, bool]]:
        async with front(workers) as f, client(f) as request:
            assert f.port
            bodies = []
            for host in ("shop.localhost", "SHOP.localhost:1234", "shop.localhost.", "blog.localhost"):
                async with request("/", host=host) as resp:
                    assert resp.status == 200
                    bodies.append(((await resp.text()).split()[1], "elastic_uid=" in resp.headers["Set-Cookie"]))
            return bodies

    # every new user is born on the group's first routable worker, and gets its cookie
    assert run(scenario()) == [("w1", True)] * 4


def test_unknown_host_is_404(workers: list[Upstream]) -> None:
    async def scenario() -> tuple[int, str]:
        async with front(workers) as f, client(f) as request, request("/", host="nope.localhost") as resp:
            return resp.status, await resp.text()

    assert run(scenario()) == (404, "no app for host nope.localhost\n")


def test_no_workers_is_503_with_retry_after() -> None:
    async def scenario() -> tuple[int, str | None, str]:
        async with front([]) as f, client(f) as request, request("/") as resp:
            return resp.status, resp.headers.get("Retry-After"), await resp.text()

    status, retry_after, text = run(scenario())
    assert (status, retry_after) == (503, "1")
    assert "acme/shop" in text


def test_a_dead_worker_is_unroutable_until_it_accepts_again_and_its_refused_request_goes_elsewhere_once(
        tmp_path: Path) -> None:
    refusing = tmp_path / "refusing.sock"
    with socket.socket(socket.AF_UNIX) as s:  # a socket file nobody listens on: connection refused
        s.bind(str(refusing))
    missing = tmp_path / "missing.sock"
    dead = [Upstream("gone", str(missing)), Upstream("refusing", str(refusing))]

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="back")

    async def scenario() -> tuple[list[int], list[set[str]], str]:
        statuses, unroutable = [], []
        async with front(dead) as f, client(f) as request:
            # Gone (the reception) refuses the connection: nothing was sent, so the request is decided again, once,
            # and goes to "refusing", which refuses too: 502. Then nobody is left.
            for _ in range(3):
                async with request("/") as resp:
                    statuses.append(resp.status)
                    assert "acme/shop" in await resp.text()
                unroutable.append(set(f.health.unroutable))
            async with upstream_app(missing, ok):  # "gone" comes back on its socket
                for _ in range(100):
                    if "gone" not in f.health.unroutable:
                        break
                    await asyncio.sleep(0.05)
                async with request("/") as resp:
                    text = await resp.text()
            counters = f.forwards.workers
            # (the first forward to gone was undone, not counted: only its answer after it came back)
            assert (counters["gone"].requests, counters["gone"].errors) == (1, 0)
            assert (counters["refusing"].requests, counters["refusing"].errors) == (1, 1)
            assert f.forwards.routes[("acme", "shop")].codes == {502: 1, 503: 2, 200: 1}
        return statuses, unroutable, text

    statuses, unroutable, text = run(scenario())
    assert statuses == [502, 503, 503]
    assert unroutable == [{"gone", "refusing"}] * 3
    assert text == "back"


def test_slow_worker_is_504(workers: list[Upstream]) -> None:
    async def scenario() -> tuple[int, float]:
        async with front(workers[:1], timeout=0.3) as f, client(f) as request:
            start = time.monotonic()
            async with request("/sleep?ms=1500") as resp:
                return resp.status, time.monotonic() - start

    status, took = run(scenario())
    assert status == 504
    assert took < 1.2


def test_timeout_is_idle_not_total(workers: list[Upstream]) -> None:
    """An upload that keeps moving outlives the timeout; only a pause as long as it is fatal."""
    async def trickle() -> AsyncIterator[bytes]:
        for _ in range(6):
            await asyncio.sleep(0.1)
            yield b"x" * 1000

    async def scenario() -> tuple[int, bytes]:
        async with front(workers[:1], timeout=0.3) as f, client(f) as request, \
                request("/echo?raw=1", method="POST", data=trickle()) as resp:
            return resp.status, await resp.read()

    assert run(scenario()) == (200, b"x" * 6000)


def test_hop_by_hop_dropped_and_forwarded_for_set(workers: list[Upstream]) -> None:
    async def scenario() -> tuple[dict[str, Any], str]:
        async with front(workers) as f, client(f) as request:
            headers = {"Connection": "keep-alive, X-Drop-Me", "X-Drop-Me": "1", "Keep-Alive": "timeout=5",
                       "Proxy-Authorization": "Basic eA==", "TE": "trailers", "X-Keep-Me": "yes",
                       "X-Forwarded-For": "10.0.0.1", "Cookie": "a=1", "X-Elastic-User-Id": "forged"}
            async with request("/echo", headers=headers) as resp:
                return await resp.json(), resp.cookies["elastic_uid"].value

    body, user = run(scenario())
    seen = {name.lower(): value for name, value in body["headers"].items()}
    for dropped in ("connection", "x-drop-me", "keep-alive", "proxy-authorization", "te",
                    # nothing added by the relay's HTTP client either
                    "user-agent", "accept", "accept-encoding", "content-type", "transfer-encoding"):
        assert dropped not in seen, dropped
    assert seen["host"] == "shop.localhost"
    assert seen["x-keep-me"] == "yes" and seen["cookie"] == "a=1"
    assert seen["x-forwarded-for"] == "127.0.0.1"  # the client's own claim dropped: it is trusted by nobody
    assert seen["x-forwarded-proto"] == "http"
    assert seen["x-forwarded-host"] == "shop.localhost"
    assert seen["x-elastic-user-id"] == user  # ours, never the client's


@pytest.mark.parametrize("trusted", [False, True])
def test_forwarding_headers_pass_from_a_trusted_peer_alone(workers: list[Upstream], trusted: bool) -> None:
    """What a client says of where a request came from reaches the worker only from a peer the front trusts (the
    daemon's ProxyTrust, asked once a connection with the connection's two addresses)."""
    asked: list[tuple[str, str]] = []

    def trusts(peer: tuple[str, int], own: tuple[str, int]) -> bool:
        asked.append((peer[0], own[0]))
        return trusted

    async def scenario() -> tuple[dict[str, Any], str]:
        async with front(workers) as f, client(f) as request:
            f.configure(request_timeout=5.0, user_ttl=1800.0, trusts=trusts)
            headers = {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https",
                       "X-Forwarded-Host": "shop.example.com", "X-Forwarded-Port": "443",
                       "Forwarded": "for=203.0.113.7;proto=https", "X-Real-IP": "203.0.113.7"}
            async with request("/echo", headers=headers) as resp:
                return await resp.json(), resp.headers.get("Set-Cookie", "")

    body, cookie = run(scenario())
    seen = {name.lower(): value for name, value in body["headers"].items()}
    assert asked == [("127.0.0.1", "127.0.0.1")]
    if trusted:
        assert seen["x-forwarded-for"] == "203.0.113.7, 127.0.0.1"
        assert (seen["x-forwarded-proto"], seen["x-forwarded-host"]) == ("https", "shop.example.com")
        assert (seen["x-forwarded-port"], seen["forwarded"]) == ("443", "for=203.0.113.7;proto=https")
        assert "Secure" in cookie  # the user came over TLS, as the trusted proxy says
    else:
        assert seen["x-forwarded-for"] == "127.0.0.1"
        assert (seen["x-forwarded-proto"], seen["x-forwarded-host"]) == ("http", "shop.localhost")
        for said in ("x-forwarded-port", "forwarded", "x-real-ip"):
            assert said not in seen, said
        assert "Secure" not in cookie


@pytest.mark.parametrize("keep", [False, True])
def test_underscored_request_headers_are_dropped_unless_kept(workers: list[Upstream], keep: bool) -> None:
    async def scenario() -> dict[str, Any]:
        async with front(workers) as f, client(f) as request:
            f.configure(request_timeout=5.0, user_ttl=1800.0, keep_underscored=keep)
            headers = {"Transfer_Encoding": "chunked", "Content_Length": "5", "X_Forwarded_For": "6.6.6.6",
                       "X-Plain": "1", "X_Plain": "2"}
            async with request("/echo", headers=headers) as resp:
                return await resp.json()

    seen = {name.lower(): value for name, value in run(scenario())["headers"].items()}
    assert seen["x-plain"] == "1" and ("x_plain" in seen) == keep
    for name in ("transfer_encoding", "content_length", "x_forwarded_for"):  # (kept or not: they read as the front's)
        assert name not in seen, name


def test_path_and_query_reach_the_worker_unchanged(workers: list[Upstream]) -> None:
    async def scenario() -> dict[str, Any]:
        async with front(workers) as f, client(f) as request, \
                request(URL(f"http://127.0.0.1:{f.port}/echo?q=%20x&q=2&r=a%2Fb", encoded=True)) as resp:
            return await resp.json()

    body = run(scenario())
    assert (body["path"], body["query"]) == ("/echo", "q=%20x&q=2&r=a%2Fb")


@pytest.mark.parametrize("chunked", [False, True])
def test_large_body_streams_through_byte_for_byte(workers: list[Upstream], chunked: bool) -> None:
    payload = os.urandom(5 << 20)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 256 << 10):
            yield payload[i:i + (256 << 10)]

    async def scenario() -> tuple[int, str | None, bytes]:
        body = chunks() if chunked else io.BytesIO(payload)
        async with front(workers) as f, client(f) as request, \
                request("/echo?raw=1", method="POST", data=body) as resp:
            return resp.status, resp.headers.get("Content-Length"), await resp.read()

    status, length, echoed = run(scenario())
    assert status == 200
    assert length == (None if chunked else str(len(payload)))  # the worker's Content-Length is kept
    assert echoed == payload


def test_head_and_keep_alive_survive(workers: list[Upstream]) -> None:
    """A HEAD answer carries no body; the next request on the same connection still works."""
    async def scenario() -> list[int]:
        connector = aiohttp.TCPConnector(limit=1)
        async with front(workers) as f, aiohttp.ClientSession(connector=connector) as s:
            statuses = []
            for method in ("HEAD", "GET", "HEAD", "GET"):
                async with s.request(method, f"http://127.0.0.1:{f.port}/",
                                     headers={"Host": "shop.localhost"}) as resp:
                    body = await resp.read()
                    assert (body == b"") == (method == "HEAD")
                    statuses.append(resp.status)
            return statuses

    assert run(scenario()) == [200] * 4


def test_set_routes_on_reload(workers: list[Upstream]) -> None:
    async def scenario() -> list[int]:
        async with front(workers) as f, client(f) as request:
            statuses = []
            async with request("/", host="shop.localhost") as resp:
                statuses.append(resp.status)
            f.set_routes(RouteTable({"new.localhost": SHOP}))
            for host in ("shop.localhost", "new.localhost"):
                async with request("/", host=host) as resp:
                    statuses.append(resp.status)
            return statuses

    assert run(scenario()) == [200, 404, 200]


@asynccontextmanager
async def upstream_app(path: Path, handler: Callable[[web.Request], Any],
                       worker_id: str = "odd") -> AsyncIterator[list[Upstream]]:
    """A worker in this process, for misbehaviours a real app would only show by accident."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, str(path)).start()
    try:
        yield [Upstream(worker_id, str(path))]
    finally:
        await runner.cleanup()


async def _half_answer(request: web.Request, then: Callable[[web.Request], Any]) -> web.StreamResponse:
    out = web.StreamResponse(headers={"Content-Length": "100"})
    await out.prepare(request)
    await out.write(b"0123456789")
    await then(request)
    return out


async def _stall(request: web.Request) -> None:
    for _ in range(150):  # until the front gives up on us (at most 3 s)
        if request.transport is None or request.transport.is_closing():
            return
        await asyncio.sleep(0.02)


async def _hang_up(request: web.Request) -> None:
    assert request.transport is not None
    request.transport.close()


@pytest.mark.parametrize("then", [_hang_up, _stall], ids=["reset", "stall"])
def test_failure_mid_answer_truncates_the_client(tmp_path: Path, then: Callable[[web.Request], Any]) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await _half_answer(request, then)

    async def scenario() -> tuple[int, bytes, type[BaseException] | None, float, set[str]]:
        async with upstream_app(tmp_path / "odd.sock", handler) as ups, front(ups, timeout=0.3) as f, \
                client(f) as request:
            start = time.monotonic()
            async with request("/") as resp:
                got = b""
                error = None
                try:
                    async for chunk in resp.content.iter_any():
                        got += chunk
                except aiohttp.ClientPayloadError as exc:
                    error = type(exc)
                return resp.status, got, error, time.monotonic() - start, set(f.health.unroutable)

    status, got, error, took, unroutable = run(scenario())
    assert (status, got, error) == (200, b"0123456789", aiohttp.ClientPayloadError)
    assert took < 2
    assert unroutable == set()  # the answer had started: no 502 to give, and the worker did answer


def test_client_hanging_up_frees_the_worker(tmp_path: Path) -> None:
    events: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        # aiohttp 3.8 cancels a handler whose client left; later versions only close its transport.
        try:
            for _ in range(150):
                if request.transport is None or request.transport.is_closing():
                    events.append("worker connection closed")
                    break
                await asyncio.sleep(0.02)
        except asyncio.CancelledError:
            events.append("worker connection closed")
            raise
        return web.Response(text="late")

    async def scenario() -> list[str]:
        async with upstream_app(tmp_path / "odd.sock", handler) as ups, front(ups) as f:
            async with client(f) as request:
                with pytest.raises(asyncio.TimeoutError):
                    async with request("/", timeout=aiohttp.ClientTimeout(total=0.2)):
                        pass
            for _ in range(50):  # the front notices the hang-up and closes its worker connection
                if events:
                    break
                await asyncio.sleep(0.02)
            for _ in range(50):
                if not f.forwards.open:
                    break
                await asyncio.sleep(0.02)
            assert f.forwards.open == {} and f.forwards.routes[("acme", "shop")].codes == {499: 1}
            assert f.health.unroutable == set()
        return events

    assert run(scenario()) == ["worker connection closed"]


def test_expect_100_continue(workers: list[Upstream]) -> None:
    payload = os.urandom(256 << 10)

    async def scenario() -> tuple[int, bytes]:
        async with front(workers) as f, client(f) as request, \
                request("/echo?raw=1", method="POST", data=payload, expect100=True) as resp:
            return resp.status, await resp.read()

    assert run(scenario()) == (200, payload)


@asynccontextmanager
async def raw_upstream(path: Path, answer: Callable[[bytes], bytes],
                       close_after: bytes | None = None) -> AsyncIterator[list[Upstream]]:
    """A worker speaking HTTP by hand, sending what aiohttp never would (e.g. a 304 without a length).
    ``close_after``: a path after whose answer it closes the connection (a close-delimited body)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                writer.write(answer(head))
                await writer.drain()
                if close_after is not None and head.split(b" ")[1] == close_after:
                    break
        writer.close()

    server = await asyncio.start_unix_server(serve, str(path))
    try:
        yield [Upstream("raw", str(path))]
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(("method", "status"), [("GET", 204), ("GET", 304), ("HEAD", 200)])
def test_bodiless_answers_leave_nothing_on_the_wire(tmp_path: Path, method: str, status: int) -> None:
    """No chunked terminator after a 204/304/HEAD answer: it would corrupt the next one on the connection."""
    def answer(head: bytes) -> bytes:
        if head.split(b" ")[1] == b"/empty":  # no Content-Length, no body: what a 304 may well look like
            return f"HTTP/1.1 {status} Whatever\r\nETag: \"x\"\r\n\r\n".encode()
        return b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"

    async def scenario() -> bytes:
        async with raw_upstream(tmp_path / "raw.sock", answer) as ups, front(ups) as f:
            reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
            writer.write(f"{method} /empty HTTP/1.1\r\nHost: shop.localhost\r\n\r\n"
                         "GET /next HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n".encode())
            try:
                return await asyncio.wait_for(reader.read(), 5)
            finally:
                writer.close()

    first, second = run(scenario()).split(b"\r\n\r\n", 1)
    assert first.startswith(f"HTTP/1.1 {status} Whatever\r\n".encode())
    assert b"transfer-encoding" not in first.lower()
    assert second.startswith(b"HTTP/1.1 200 OK\r\n") and second.endswith(b"\r\n\r\nnext")


def test_encoded_body_and_repeated_headers_pass_untouched(tmp_path: Path) -> None:
    packed = gzip.compress(b"hello " * 1000)

    async def handler(request: web.Request) -> web.Response:
        out = web.Response(body=packed, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})
        out.headers.add("Set-Cookie", "a=1")
        out.headers.add("Set-Cookie", "b=2")
        return out

    async def scenario() -> tuple[bytes, list[str], str]:
        async with upstream_app(tmp_path / "odd.sock", handler) as ups, front(ups) as f, \
                client(f) as request, request("/") as resp:
            return await resp.read(), resp.headers.getall("Set-Cookie"), resp.headers["Content-Length"]

    body, cookies, length = run(scenario())
    assert (body, cookies[:2], length) == (packed, ["a=1", "b=2"], str(len(packed)))
    assert cookies[2].startswith("elastic_uid=")  # the new user's, after the worker's own


@pytest.mark.parametrize("request_bytes", [
    # HTTP/1.0 with Transfer-Encoding (RFC 9112 §6.1: the framing is faulty; close), kept alive by the client
    b"POST /echo HTTP/1.0\r\nHost: shop.localhost\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n0\r\n\r\n",
    # a last coding other than chunked (§6.3: the body's length cannot be known)
    b"POST /echo HTTP/1.1\r\nHost: shop.localhost\r\nTransfer-Encoding: chunked, gzip\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
])
def test_a_request_whose_framing_cannot_be_trusted_is_refused_and_nothing_after_it_is_served(
        workers: list[Upstream], request_bytes: bytes) -> None:
    smuggled = b"GET /echo HTTP/1.1\r\nHost: shop.localhost\r\n\r\n"

    async def scenario() -> bytes:
        async with front(workers) as f:
            return await raw(f, request_bytes + smuggled)

    answer = run(scenario())
    assert answer.startswith(b"HTTP/1.1 400 ") and answer.count(b"HTTP/1.1 ") == 1, answer
    assert b"Connection: close\r\n" in answer
