"""Relaying one request to one worker and its answer back, behind a small interface.

Routing decides *where*; the relay only moves bytes. ``Relay`` is the seam: a later protocol-level relay
(splicing sockets instead of re-framing HTTP through aiohttp's client) replaces ``AiohttpRelay`` without the
front or routing changing.

Failures map to two exceptions raised before any byte of the answer went to the client: ``UpstreamError``
(the worker could not be reached or dropped the connection: 502) and ``UpstreamTimeout`` (504). Once the
answer has started, a failure can only cut the client's connection short, so the client sees a truncated
response rather than a complete-looking wrong one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp import hdrs, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

__all__ = [
    "HOP_BY_HOP",
    "AiohttpRelay",
    "Relay",
    "Upstream",
    "UpstreamError",
    "UpstreamTimeout",
    "forwarded_request_headers",
    "forwarded_response_headers",
]

log = logging.getLogger("elasticd.front")

# RFC 9110 §7.6.1: these describe one connection, not the message, so they never cross the proxy.
# Proxy-Connection is the pre-standard spelling some clients still send.
HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade",
})
# The front's server already answered "Expect: 100-continue" to the client; forwarding it would make the
# client side of the relay wait for a second 100 from the worker before sending the body.
_REQUEST_ONLY = frozenset({"expect"})
# Methods that may be sent again when a kept-alive worker connection turned out closed (RFC 9112 §9.3.1).
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
# What aiohttp's client would otherwise add on its own: the relay sends exactly what the client sent.
_SKIP_AUTO = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
# 499, as nginx logs it: the client went away before the worker answered. Nobody receives this response.
CLIENT_CLOSED = 499


@dataclass(frozen=True, slots=True)
class Upstream:
    worker_id: str
    socket_path: str


class UpstreamError(Exception):
    """The worker could not be reached, or closed the connection before answering (→ 502)."""


class UpstreamTimeout(Exception):
    """The worker did not accept, answer or continue its answer within the timeout (→ 504)."""


class Relay(Protocol):
    async def forward(self, request: web.Request, upstream: Upstream) -> web.StreamResponse: ...

    async def close_upstream(self, worker_id: str) -> None: ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------------------------- headers (pure)


def _connection_tokens(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    """Header names listed in Connection: they are hop-by-hop too (RFC 9110 §7.6.1)."""
    values = headers.getall(hdrs.CONNECTION, ())
    return {token.strip().lower() for value in values for token in value.split(",")}


def _end_to_end(headers: CIMultiDictProxy[str] | CIMultiDict[str], drop: Iterable[str]) -> CIMultiDict[str]:
    dropped = HOP_BY_HOP | _connection_tokens(headers) | set(drop)
    # items() keeps repeated headers (Set-Cookie, Via, ...) in order.
    return CIMultiDict((name, value) for name, value in headers.items() if name.lower() not in dropped)


def forwarded_request_headers(
    headers: CIMultiDictProxy[str] | CIMultiDict[str], peer: str | None, scheme: str, host: str | None,
) -> CIMultiDict[str]:
    """The headers a worker receives: end-to-end ones, Host kept, plus the X-Forwarded-* trio.

    X-Forwarded-For is appended to (a proxy in front of elasticd keeps its chain); Proto and Host are only
    set when absent, so a TLS terminator in front of elasticd can state the scheme and host the user saw.
    """
    out = _end_to_end(headers, _REQUEST_ONLY)
    if peer:
        previous = ", ".join(out.getall("X-Forwarded-For", ()))
        out["X-Forwarded-For"] = f"{previous}, {peer}" if previous else peer
    out.setdefault("X-Forwarded-Proto", scheme)
    if host:
        out.setdefault("X-Forwarded-Host", host)
    return out


def forwarded_response_headers(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> CIMultiDict[str]:
    """The headers the client receives. Content-Length stays: the body is relayed byte for byte."""
    return _end_to_end(headers, ())


def _must_be_empty(method: str, status: int) -> bool:
    return method == hdrs.METH_HEAD or status in (204, 304) or 100 <= status < 200


# --------------------------------------------------------------------------------------------- the relay


class _IdleDeadline:
    """One timeout for the whole exchange, pushed forward whenever bytes move either way.

    So ``timeout`` bounds the connect, the wait for the answer's headers after the last body byte went up,
    and any pause inside either body — but never a long upload or download that keeps moving. aiohttp's own
    sock_read timer cannot do this: it runs while the request body is still being sent.
    """

    __slots__ = ("_cm", "_loop", "_open", "_timeout")

    def __init__(self, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout
        self._cm = asyncio.timeout_at(self._loop.time() + timeout)
        self._open = False

    async def __aenter__(self) -> _IdleDeadline:
        await self._cm.__aenter__()
        self._open = True
        return self

    async def __aexit__(self, *exc: object) -> bool | None:
        self._open = False
        return await self._cm.__aexit__(*exc)  # type: ignore[arg-type]

    def touch(self) -> None:
        # The request body is pumped by aiohttp's own task, which may still run a step after the exchange
        # ended or the deadline fired: rescheduling then would raise there.
        if self._open and not self._cm.expired():
            self._cm.reschedule(self._loop.time() + self._timeout)


def _client_closed() -> web.Response:
    return web.Response(status=CLIENT_CLOSED, reason="Client Closed Request")


def _client_gone(request: web.BaseRequest) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


def _upstream_url(request: web.BaseRequest) -> URL:
    # The raw target, re-encoded by nobody: workers see exactly the path and query the client sent.
    target = request.raw_path if request.raw_path.startswith("/") else request.rel_url.raw_path_qs
    return URL(f"http://worker{target}", encoded=True)


class AiohttpRelay:
    """A relay on aiohttp's client: one session (and connection pool) per worker, over its Unix socket."""

    __slots__ = ("_closing", "_sessions", "_timeout")

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._sessions: dict[str, tuple[str, aiohttp.ClientSession]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def _session(self, upstream: Upstream) -> aiohttp.ClientSession:
        known = self._sessions.get(upstream.worker_id)
        if known is not None:
            path, session = known
            if path == upstream.socket_path and not session.closed:
                return session
            self._close_later(session)
        session = aiohttp.ClientSession(
            # No pool limit: how many requests a worker gets is the pool's and the quotas' decision, and a
            # hidden queue here would only turn overload into timeouts.
            connector=aiohttp.UnixConnector(path=upstream.socket_path, limit=0),
            # All timing is the idle deadline's; aiohttp's default 5-minute total would cut long streams.
            timeout=aiohttp.ClientTimeout(total=None, connect=None, sock_read=None, sock_connect=None),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_SKIP_AUTO,
        )
        self._sessions[upstream.worker_id] = (upstream.socket_path, session)
        return session

    def _close_later(self, session: aiohttp.ClientSession) -> None:
        task = asyncio.get_running_loop().create_task(session.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close_upstream(self, worker_id: str) -> None:
        known = self._sessions.pop(worker_id, None)
        if known is not None:
            await known[1].close()

    async def close(self) -> None:
        sessions = [session for _, session in self._sessions.values()]
        self._sessions.clear()
        await asyncio.gather(*(s.close() for s in sessions), *self._closing, return_exceptions=True)

    async def forward(self, request: web.Request, upstream: Upstream) -> web.StreamResponse:
        session = self._session(upstream)
        headers = forwarded_request_headers(
            request.headers, request.remote, request.scheme, request.headers.get(hdrs.HOST))
        out: web.StreamResponse | None = None
        try:
            async with _IdleDeadline(self._timeout) as deadline:
                answer = await self._send(session, request, headers, deadline)
                async with answer:
                    out_headers = forwarded_response_headers(answer.headers)
                    if _must_be_empty(request.method, answer.status):
                        return web.Response(status=answer.status, reason=answer.reason, headers=out_headers)
                    out = web.StreamResponse(status=answer.status, reason=answer.reason, headers=out_headers)
                    await out.prepare(request)
                    async for chunk in answer.content.iter_any():
                        await out.write(chunk)
                        deadline.touch()
                    return out
        except TimeoutError:
            if out is not None and out.prepared:
                return self._cut(request, out, upstream, "stalled")
            if _client_gone(request):
                return _client_closed()
            raise UpstreamTimeout(
                f"worker {upstream.worker_id} did not answer within {self._timeout:g}s") from None
        except (aiohttp.ClientError, OSError) as exc:
            # OSError covers the client's side too: a write to a closed client connection raises
            # ConnectionResetError, which is no fault of the worker.
            if out is not None and out.prepared:
                return self._cut(request, out, upstream, _describe(exc))
            if _client_gone(request):
                return _client_closed()
            raise UpstreamError(f"worker {upstream.worker_id}: {_describe(exc)}") from exc

    async def _send(
        self, session: aiohttp.ClientSession, request: web.Request, headers: CIMultiDict[str],
        deadline: _IdleDeadline,
    ) -> aiohttp.ClientResponse:
        has_body = request.body_exists
        for attempt in (1, 2):
            if session.closed:  # close_upstream() or close() ran while this request waited
                raise aiohttp.ClientConnectionError("the relay closed its connections to this worker")
            try:
                return await session.request(
                    request.method, _upstream_url(request), headers=headers,
                    data=_body(request.content, deadline) if has_body else None,
                    allow_redirects=False,
                )
            except aiohttp.ServerDisconnectedError:
                # A kept-alive connection the worker closed while idle: safe to send once more, but only
                # when nothing was consumed from the client (no body) and repeating is harmless.
                if attempt == 2 or has_body or request.method not in _IDEMPOTENT:
                    raise
        raise AssertionError("unreachable")

    def _cut(self, request: web.BaseRequest, out: web.StreamResponse, upstream: Upstream,
             why: str) -> web.StreamResponse:
        """The answer already started: close the client's connection so it sees a truncated response."""
        if not _client_gone(request):
            log.warning("%s %s: worker %s %s mid-answer; cutting the client connection",
                        request.method, request.path, upstream.worker_id, why)
            assert request.transport is not None
            request.transport.close()
        # aiohttp's own end of the response now fails to write and treats it as a client disconnect.
        return out


async def _body(content: aiohttp.StreamReader, deadline: _IdleDeadline) -> AsyncIterator[bytes]:
    """The client's body as it arrives (the worker sees it chunked unless it had a Content-Length)."""
    async for chunk in content.iter_any():
        deadline.touch()
        yield chunk


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
