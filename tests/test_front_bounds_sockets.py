"""The front's bounds on a hostile worker, on real sockets: a worker speaking HTTP by hand on a Unix socket sends
an answer head too large, of too many lines, trickled a byte at a time, an endless chunk-size line or trailer, or
accepts and never answers while many clients ask. Each is refused as ``front.core.bounds`` says (502, 504, a cut
connection), counted by reason, and the worker's connection closed; nothing else is lost: the worker stays routable
and the next request is served. Past a worker's concurrency, requests wait in its group's queue
(``front/queueing.py``), bounded in count and time."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from test_front import answers, front, no_errors_logged, run

from elasticd.front import AppRoute, Front, RouteTable, Upstream
from elasticd.front.core.bounds import (
    FRAMING,
    HEAD_FIELDS,
    HEAD_SIZE,
    HEAD_TIME,
    INTERIM,
    MAX_HEAD_BYTES,
    MAX_HEAD_FIELDS,
    MAX_INTERIM,
)

__all__ = ["no_errors_logged"]  # a fixture, used by name

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

Answer = Callable[[bytes, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawWorker:
    """A worker on a Unix socket that answers each request head with ``answer`` (which writes what it likes); it
    counts its connections — accepted, open now, the most open at once — and those the front closed on it."""

    def __init__(self, path: Path, answer: Answer) -> None:
        self.path = path
        self.answer = answer
        self.accepted = self.open = self.most = self.closed_by_front = 0
        self.tasks: set[asyncio.Task[None]] = set()

    @property
    def upstreams(self) -> list[Upstream]:
        return [Upstream("raw", str(self.path))]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.accepted += 1
        self.open += 1
        self.most = max(self.most, self.open)
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.closed_by_front += 1
                    return
                await self.answer(head, reader, writer)
        except ConnectionError:
            self.closed_by_front += 1
        except asyncio.CancelledError:
            return  # the test is over (a handler's task ending cancelled would be logged as an error)
        finally:
            self.open -= 1
            self.tasks.discard(task)
            writer.close()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[RawWorker]:
        server = await asyncio.start_unix_server(self._serve, str(self.path))
        try:
            yield self
        finally:
            server.close()
            with contextlib.suppress(TimeoutError):  # the front closed its connections: they end by themselves
                await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 1.0)
            for task in list(self.tasks):
                task.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)


async def until(condition: Callable[[], bool], timeout: float = 2.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def get(f: Front, path: str = "/", timeout: float = 5.0) -> tuple[int, bytes, bytes]:
    """One request on its own connection, read until the front closes it: (status, body, everything read); status
    0 when no whole answer came (a cut connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
    try:
        writer.write(b"GET %s HTTP/1.1\r\nHost: shop.localhost\r\nConnection: close\r\n\r\n" % path.encode())
        data = await asyncio.wait_for(reader.read(-1), timeout)
    finally:
        writer.close()
    found = answers(data)
    whole = found and (data.endswith(b"0\r\n\r\n") or b"Content-Length" in data)
    return (found[-1].status, found[-1].body, data) if whole else (0, b"", data)


async def _until_closed(reader: asyncio.StreamReader, limit: float) -> bool:
    """Whether the front closed the connection within ``limit`` seconds (what it sends meanwhile is dropped)."""
    with contextlib.suppress(TimeoutError, ConnectionError):
        async with asyncio.timeout(limit):
            while await reader.read(65536):
                pass
            return True
    return False


def _lines(count: int, size: int) -> bytes:
    return b"".join(b"X-%04d: %s\r\n" % (i, b"v" * (size - 10)) for i in range(count))


# -- an answer head past its bounds: 502, counted, the connection closed, the worker still served ----------------

BAD_HEADS = {
    b"/big": b"HTTP/1.1 200 OK\r\n" + _lines(40, 1024) + b"Content-Length: 2\r\n\r\nok",
    b"/many": b"HTTP/1.1 200 OK\r\n" + _lines(MAX_HEAD_FIELDS + 1, 12) + b"Content-Length: 2\r\n\r\nok",
    b"/interim": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" * (MAX_INTERIM + 1) + OK,
    b"/garbage": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
}


async def _bad_heads(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(BAD_HEADS.get(head.split(b" ")[1], OK))
    await writer.drain()


@pytest.mark.parametrize(("path", "reason", "said"), [
    ("/big", HEAD_SIZE, f"sent an answer head over {MAX_HEAD_BYTES} bytes"),
    ("/many", HEAD_FIELDS, f"sent an answer head of more than {MAX_HEAD_FIELDS} header lines"),
    ("/interim", INTERIM, f"sent more than {MAX_INTERIM} interim (1xx) answers"),
    ("/garbage", "malformed", "sent a malformed answer"),
])
def test_an_answer_head_past_a_bound_is_502_counted_and_its_connection_closed(tmp_path: Path, path: str,
                                                                             reason: str, said: str) -> None:
    async def scenario() -> None:
        worker = RawWorker(tmp_path / "w.sock", _bad_heads)
        async with worker.serving(), front(worker.upstreams) as f:
            status, body, _ = await get(f, path)
            assert status == 502 and body.decode().startswith(f"acme/shop: the worker {said}"), body
            await until(lambda: worker.closed_by_front == 1, what="the worker's connection closed")
            assert f.forwards.upstream_refusals == {("acme", "shop", reason): 1}
            # It answered (badly): it stays routable, and its next answer is relayed on a new connection.
            assert f.health.unroutable == set()
            assert (await get(f, "/fine"))[:2] == (200, b"ok") and worker.accepted == 2
            exposed = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for m in f.collector().collect() for s in m.samples}
            assert exposed[("elasticd_upstream_refusals_total",
                            (("app", "shop"), ("reason", reason), ("tenant", "acme")))] == 1
            assert f.forwards.open == {}

    run(scenario())


def test_a_worker_failing_every_request_is_said_once_a_minute_not_once_a_request(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        worker = RawWorker(tmp_path / "w.sock", _bad_heads)
        async with worker.serving(), front(worker.upstreams) as f:
            caplog.set_level(logging.WARNING, logger="elasticd.front")
            for _ in range(30):
                assert (await get(f, "/garbage"))[0] == 502
            assert f.forwards.upstream_refusals == {("acme", "shop", "malformed"): 30}  # each one counted
            said = [r.getMessage() for r in caplog.records if "worker raw" in r.getMessage()]
            assert len(said) == 1 and "sent a malformed answer" in said[0], said

    run(scenario())


# -- an answer head trickled a byte at a time: 504 at the request timeout, however the bytes move ----------------


def test_a_trickled_answer_head_is_504_within_the_request_timeout(tmp_path: Path) -> None:
    async def trickle(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        for _ in range(100):  # a byte every 50 ms for 5 s: the connection is never idle for the timeout
            writer.write(b"v")
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"\r\nContent-Length: 2\r\n\r\nok")

    async def scenario() -> float:
        worker = RawWorker(tmp_path / "w.sock", trickle)
        async with worker.serving(), front(worker.upstreams, timeout=0.5) as f:
            started = time.monotonic()
            status, body, _ = await get(f)
            took = time.monotonic() - started
            assert status == 504 and b"did not send its answer head whole within 0.5s" in body, body
            await until(lambda: worker.closed_by_front == 1, what="the worker's connection closed")
            assert f.forwards.upstream_refusals == {("acme", "shop", HEAD_TIME): 1}
            return took

    assert run(scenario()) < 1.5  # the request timeout (and one tick), not the trickle's 5 s


# -- a chunked body's framing past its bound: the answer had begun, so the client's connection is cut -------------

ENDLESS = {
    "a chunk-size line": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n1;ext=", b"e" * 4096),
    "a trailer": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n", b"X-T: v\r\n" * 512),
}


@pytest.mark.parametrize("what", sorted(ENDLESS))
def test_an_endless_chunk_size_line_or_trailer_cuts_the_client_and_closes_the_worker(tmp_path: Path,
                                                                                     what: str) -> None:
    start, more = ENDLESS[what]

    async def endless(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(start)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # as fast as the front reads, up to 5 s
            writer.write(more)
            await writer.drain()
            await asyncio.sleep(0.001)

    async def scenario() -> float:
        worker = RawWorker(tmp_path / "w.sock", endless)
        async with worker.serving(), front(worker.upstreams) as f:
            started = time.monotonic()
            status, _, data = await get(f)
            assert status == 0 and data.startswith(b"HTTP/1.1 200 OK\r\n") and not data.endswith(b"0\r\n\r\n")
            await until(lambda: worker.closed_by_front == 1, what="the worker's connection closed")
            assert f.forwards.upstream_refusals == {("acme", "shop", FRAMING): 1}
            assert f.forwards.routes[("acme", "shop")].codes == {200: 1}  # its own status: the answer had begun
            return time.monotonic() - started

    assert run(scenario()) < 2.5  # refused at its bound, not after the worker's 5 s


# -- connections to a worker: never more than its bound, whatever it does ----------------------------------------


async def _never(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()  # holds the connection, answering nothing, until the front closes it
    raise ConnectionResetError


async def _slowly(head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(0.05)
    writer.write(OK)
    await writer.drain()


def _one_at_a_time(most: int = 100, timeout: float = 5.0) -> RouteTable:
    return RouteTable({"shop.localhost": AppRoute("acme", "shop", "green", concurrency=(("green", 1),),
                                                  queues=(("green", most, timeout),))})


def test_a_worker_that_never_answers_gets_its_concurrency_and_the_rest_wait_then_503(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[int], int, int, dict[str, int]]:
        worker = RawWorker(tmp_path / "w.sock", _never)
        async with worker.serving(), front(worker.upstreams, timeout=1.0, routes=_one_at_a_time(timeout=1.5)) as f:
            results = await asyncio.gather(*(get(f) for _ in range(30)))
            await until(lambda: worker.open == 0, what="the worker's connections closed")
            assert f.forwards.open == {} and f.forwards.saturated == set() and not f.waiting.parked
            return ([status for status, _, _ in results], worker.most, worker.accepted,
                    f.forwards.queues["acme/shop/green"].refused)

    statuses, most, accepted, refused = run(scenario())
    # One at a time (its concurrency) gets the worker and its 504 at the request timeout; the others waited in the
    # group's queue, in order, and were answered 503 at its timeout.
    assert statuses.count(504) >= 1 and statuses.count(504) + statuses.count(503) == 30, statuses
    assert refused == {"timeout": statuses.count(503)}
    assert most == 1 and accepted == statuses.count(504)


def test_requests_past_the_concurrency_wait_in_order_and_reuse_its_connection(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[int], int, int]:
        worker = RawWorker(tmp_path / "w.sock", _slowly)
        async with worker.serving(), front(worker.upstreams, routes=_one_at_a_time()) as f:
            results = await asyncio.gather(*(get(f) for _ in range(20)))
            waited = f.forwards.queues["acme/shop/green"]
            assert waited.count == 19 and waited.refused == {}  # every one but the first waited, none refused
            return [status for status, _, _ in results], worker.most, worker.accepted

    statuses, most, accepted = run(scenario())
    assert statuses == [200] * 20  # every one served, one at a time
    assert most == 1 and accepted == 1  # the one connection, kept alive and reused


def test_requests_waiting_for_a_worker_that_dies_wait_for_its_restart(tmp_path: Path) -> None:
    """Held, not refused: the request on the worker when it died fails (502); the ones waiting for a slot wait on
    while it is unroutable, and its restarted process (its socket accepting again) serves them."""
    path = tmp_path / "w.sock"

    async def scenario() -> list[int]:
        worker = RawWorker(path, _never)
        async with front(worker.upstreams, timeout=5.0, routes=_one_at_a_time()) as f:
            async with worker.serving():
                asking = [asyncio.ensure_future(get(f)) for _ in range(1 + 6)]
                await until(lambda: worker.open == 1 and f.waiting.parked.depth("acme/shop/green") == 6,
                            what="one on the worker, six waiting")
                for task in list(worker.tasks):  # it dies: its connections reset
                    task.cancel()
                await until(lambda: "raw" in f.health.unroutable, what="the worker found dead")
            path.unlink(missing_ok=True)  # (Python 3.13's server removes its socket file as it closes)
            await asyncio.sleep(0.3)  # the six go on waiting while nothing accepts
            assert f.waiting.parked.depth("acme/shop/green") == 6
            async with RawWorker(path, _slowly).serving():  # restarted, on the same socket
                done = await asyncio.gather(*asking)
            return [status for status, _, _ in done]

    statuses = run(scenario())
    assert sorted(statuses) == [200] * 6 + [502], statuses


def test_past_the_queue_bound_requests_are_refused_503_at_once(tmp_path: Path) -> None:
    async def scenario() -> tuple[list[tuple[int, bytes]], float, dict[str, int]]:
        worker = RawWorker(tmp_path / "w.sock", _never)
        async with worker.serving(), front(worker.upstreams, timeout=5.0, routes=_one_at_a_time(most=4)) as f:
            asking = [asyncio.ensure_future(get(f, timeout=8.0)) for _ in range(1 + 4)]
            await until(lambda: worker.open == 1 and f.waiting.parked.depth("acme/shop/green") == 4,
                        what="one on the worker, the queue full")
            started = time.monotonic()
            refused = await asyncio.gather(*(get(f) for _ in range(3)))
            took = time.monotonic() - started
            exposed = {(s.name, tuple(sorted(s.labels.items()))): s.value
                       for m in f.collector().collect() for s in m.samples}
            assert exposed[("elasticd_queue_depth", (("app", "shop"), ("group", "green"), ("tenant", "acme")))] == 4
            assert exposed[("elasticd_queue_refusals_total",
                            (("app", "shop"), ("group", "green"), ("reason", "full"), ("tenant", "acme")))] == 3
            for task in asking:
                task.cancel()
            await asyncio.gather(*asking, return_exceptions=True)
            return [(status, data) for status, _, data in refused], took, f.forwards.queues["acme/shop/green"].refused

    refused, took, counted = run(scenario())
    assert [status for status, _ in refused] == [503] * 3 and counted == {"full": 3}
    assert all(b"Retry-After: 1\r\n" in data and b"4 requests wait already" in data for _, data in refused)
    assert took < 1.0  # at once, not after a timeout
