"""The front with real demo workers behind it: routing, failures as 404/502/503/504, streaming, headers."""

from __future__ import annotations

import asyncio
import gzip
import io
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from test_demo import DemoWorker
from yarl import URL

from elasticd.config import Address
from elasticd.front.relay import AiohttpRelay, Upstream
from elasticd.front.routing import AppRoute, RouteTable
from elasticd.front.server import _HAS_CANCELLATION, Front

SHOP = AppRoute("acme", "shop", "green")
ROUTES = RouteTable({"shop.localhost": SHOP})


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


@asynccontextmanager
async def front(upstreams: Sequence[Upstream], timeout: float = 5.0) -> AsyncIterator[Front]:
    seen: list[tuple[str, str, str]] = []

    def routable(tenant: str, app: str, group: str) -> Sequence[Upstream]:
        seen.append((tenant, app, group))
        return upstreams

    f = Front(Address("127.0.0.1", 0), ROUTES, routable, AiohttpRelay(timeout))
    await f.start()
    try:
        yield f
    finally:
        await f.stop()
    assert set(seen) <= {SHOP.key}


@asynccontextmanager
async def client(f: Front) -> AsyncIterator[Callable[..., Any]]:
    # No headers of the test client's own, so what the worker sees is what the test sent plus the front's.
    async with aiohttp.ClientSession(skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
                                     auto_decompress=False) as session:
        def request(path: str | URL, method: str = "GET", host: str = "shop.localhost", **kwargs: Any) -> Any:
            headers = {"Host": host, **kwargs.pop("headers", {})}
            url = path if isinstance(path, URL) else f"http://127.0.0.1:{f.port}{path}"
            return session.request(method, url, headers=headers, **kwargs)
        yield request


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_routes_by_host_and_alternates(workers: list[Upstream]) -> None:
    async def scenario() -> list[str]:
        async with front(workers) as f, client(f) as request:
            assert f.port
            bodies = []
            for host in ("shop.localhost", "SHOP.localhost:1234", "shop.localhost.", "shop.localhost"):
                async with request("/", host=host) as resp:
                    assert resp.status == 200
                    bodies.append((await resp.text()).split()[1])
            return bodies

    assert run(scenario()) == ["w1", "w2", "w1", "w2"]


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


def test_dead_worker_is_502_and_reported(tmp_path: Path) -> None:
    refusing = tmp_path / "refusing.sock"
    with socket.socket(socket.AF_UNIX) as s:  # a socket file nobody listens on: connection refused
        s.bind(str(refusing))
    dead = [Upstream("gone", str(tmp_path / "missing.sock")), Upstream("refusing", str(refusing))]

    async def scenario() -> tuple[list[int], list[str]]:
        failed: list[str] = []
        statuses = []
        async with front(dead) as f, client(f) as request:
            f.on_upstream_failure = failed.append
            for _ in dead:
                async with request("/") as resp:
                    statuses.append(resp.status)
                    assert "acme/shop" in await resp.text()
        return statuses, failed

    assert run(scenario()) == ([502, 502], ["gone", "refusing"])


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
    async def scenario() -> dict[str, Any]:
        async with front(workers) as f, client(f) as request:
            headers = {"Connection": "keep-alive, X-Drop-Me", "X-Drop-Me": "1", "Keep-Alive": "timeout=5",
                       "Proxy-Authorization": "Basic eA==", "TE": "trailers", "X-Keep-Me": "yes",
                       "X-Forwarded-For": "10.0.0.1", "Cookie": "a=1"}
            async with request("/echo", headers=headers) as resp:
                return await resp.json()

    seen = {name.lower(): value for name, value in run(scenario())["headers"].items()}
    for dropped in ("connection", "x-drop-me", "keep-alive", "proxy-authorization", "te",
                    # nothing added by the relay's HTTP client either
                    "user-agent", "accept", "accept-encoding", "content-type", "transfer-encoding"):
        assert dropped not in seen, dropped
    assert seen["host"] == "shop.localhost"
    assert seen["x-keep-me"] == "yes" and seen["cookie"] == "a=1"
    assert seen["x-forwarded-for"] == "10.0.0.1, 127.0.0.1"
    assert seen["x-forwarded-proto"] == "http"
    assert seen["x-forwarded-host"] == "shop.localhost"


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
async def upstream_app(path: Path, handler: Callable[[web.Request], Any]) -> AsyncIterator[list[Upstream]]:
    """A worker in this process, for misbehaviours a real app would only show by accident."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, str(path)).start()
    try:
        yield [Upstream("odd", str(path))]
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

    async def scenario() -> tuple[int, bytes, type[BaseException] | None, float, list[str]]:
        failed: list[str] = []
        async with upstream_app(tmp_path / "odd.sock", handler) as ups, front(ups, timeout=0.3) as f, \
                client(f) as request:
            f.on_upstream_failure = failed.append
            start = time.monotonic()
            async with request("/") as resp:
                got = b""
                error = None
                try:
                    async for chunk in resp.content.iter_any():
                        got += chunk
                except aiohttp.ClientPayloadError as exc:
                    error = type(exc)
                return resp.status, got, error, time.monotonic() - start, failed

    status, got, error, took, failed = run(scenario())
    assert (status, got, error) == (200, b"0123456789", aiohttp.ClientPayloadError)
    assert took < 2
    assert failed == []  # the answer had started: no 502 to give, and the worker did answer


@pytest.mark.skipif(not _HAS_CANCELLATION, reason="aiohttp 3.8 lets the handler of a gone client run on")
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
        failed: list[str] = []
        async with upstream_app(tmp_path / "odd.sock", handler) as ups, front(ups) as f:
            f.on_upstream_failure = failed.append
            async with client(f) as request:
                with pytest.raises(asyncio.TimeoutError):
                    async with request("/", timeout=aiohttp.ClientTimeout(total=0.2)):
                        pass
            for _ in range(50):  # the front notices the hang-up and closes its worker connection
                if events:
                    break
                await asyncio.sleep(0.02)
        return events + failed

    assert run(scenario()) == ["worker connection closed"]


def test_expect_100_continue(workers: list[Upstream]) -> None:
    payload = os.urandom(256 << 10)

    async def scenario() -> tuple[int, bytes]:
        async with front(workers) as f, client(f) as request, \
                request("/echo?raw=1", method="POST", data=payload, expect100=True) as resp:
            return resp.status, await resp.read()

    assert run(scenario()) == (200, payload)


@asynccontextmanager
async def raw_upstream(path: Path, answer: Callable[[bytes], bytes]) -> AsyncIterator[list[Upstream]]:
    """A worker speaking HTTP by hand, sending what aiohttp never would (e.g. a 304 without a length)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                writer.write(answer(await reader.readuntil(b"\r\n\r\n")))
                await writer.drain()
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

    assert run(scenario()) == (packed, ["a=1", "b=2"], str(len(packed)))
