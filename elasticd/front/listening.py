"""The front's listener: its servers on the listening sockets, the client connections they accepted (and those
carried over a re-exec: ``takeover``), what each new connection is given (the head bound, the proxy trust, the
underscore rule), and their end — idle ones timed out, every one closed at a stop, or settled for a re-exec's
hand-over (``handover`` reads ``conns`` and ``carried``, and stops the accepting here).

It owns the connections rather than the request path because a connection outlives its requests and is what a
stop, a hand-over and a tunnel count are about; a request on it is the request path's (``FrontSide``, which each
connection is given with this listener).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import Any, cast

from elasticd.config.model import Address
from elasticd.front import serving
from elasticd.front.client import ClientConn
from elasticd.front.core.relay import RelayError
from elasticd.front.links import FrontSide, ListeningSide
from elasticd.front.upstream import UpstreamConn
from elasticd.listeners import bind_tcp

__all__ = ["Listening"]


class Listening(ListeningSide):
    __slots__ = ("_servers", "address", "carried", "clock", "closing", "conns", "forwarding", "keep_underscored",
                 "max_header_bytes", "port", "stopping", "trusts")

    def __init__(self, address: Address, forwarding: FrontSide, clock: Callable[[], float],
                 max_header_bytes: int) -> None:
        self.address = address
        self.forwarding = forwarding  # what each connection's requests go to
        self.clock = clock
        self.max_header_bytes = max_header_bytes  # request line + headers; over it: 431
        # Forwarding headers: who may state them (None: nobody; ``client.ClientConn`` asks at each connection), and
        # whether request header names with "_" pass (server.trusted_proxies, trusted_proxy_users,
        # underscored_headers; see core/http1.py).
        self.trusts: Callable[[tuple[str, int], tuple[str, int]], bool] | None = None
        self.keep_underscored = False
        self.conns: set[ClientConn] = set()
        # Tunnels carried over from the image before a re-exec (front/carried.py), until they close.
        self.carried: set[Any] = set()
        self.stopping = False
        self.closing = False  # a drained stop: every answer closes its connection (close_after_answers)
        self.port: int | None = None
        self._servers: list[asyncio.AbstractServer] = []

    def start(self, sockets: Sequence[socket.socket] | None,
              listening: Callable[[], None]) -> Coroutine[Any, Any, None]:
        """Serve on the listening sockets (none given: bound here); ``listening`` is called once they serve
        (awaitable; the coroutine is serving.py's, see there why)."""
        if sockets is None:
            sockets = bind_tcp(self.address.host, self.address.port, serving.BACKLOG)
        return serving.listen(self.connection, sockets, partial(self._listening, listening))

    def connection(self) -> ClientConn:
        """A client connection's protocol (accepted here, or carried over a re-exec)."""
        return ClientConn(self, self.forwarding)

    def _listening(self, then: Callable[[], None], servers: list[asyncio.AbstractServer]) -> None:
        self._servers = servers
        # (through Any: uvloop's server is no asyncio.Server, and its sockets are a list where asyncio's are a
        # tuple; a compiled front checks the declared type when it reads the attribute, and would refuse it)
        listening: Any = servers[0]
        port: int = listening.sockets[0].getsockname()[1]
        self.port = port
        then()

    def stop_accepting(self) -> None:
        """Close the servers: their sockets stay open in ``Listeners`` (connections wait in the backlog)."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()

    def close_after_answers(self) -> None:
        """A drained stop's first step: each connection closes after its next answer, announced, so that at the stop
        itself none is left kept alive for a balancer to send a request on as it closes (ClientRelay's)."""
        self.closing = True
        for conn in list(self.conns):
            conn.relay.close_after_answers()

    def stop(self) -> None:
        """A stop's start: nothing accepted, idle connections closed; the busy ones finish their answers."""
        self.stopping = True
        self.stop_accepting()
        for conn in list(self.conns):
            if conn.idle and conn.transport is not None:
                conn.transport.close()

    def busy(self) -> bool:
        return any(not c.idle for c in self.conns)

    def abort(self) -> None:
        """A stop's end: every connection still open is cut, every carried tunnel closed."""
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.abort()
        for tunnel in list(self.carried):
            tunnel.close()

    def time_out(self, now: float, keepalive_timeout: float, request_timeout: float, tunnel_timeout: float) -> None:
        """The front's tick: each connection idle past its limit (kept alive, a request under way, a tunnel), or
        whose worker's answer head is overdue, is timed out; so is a carried tunnel idle past the tunnel timeout."""
        for conn in list(self.conns):
            relay = conn.relay
            limit = relay.idle_limit(keepalive_timeout, request_timeout, tunnel_timeout)
            if now - conn.active_at > limit or relay.head_overdue(now, request_timeout):
                try:
                    conn.timed_out(request_timeout)
                except RelayError as exc:
                    conn.fail_closed(exc)
        for carried in list(self.carried):
            if now - carried.active_at > tunnel_timeout:
                carried.close()

    def tunnels_by_worker(self) -> dict[str, int]:
        """Open WebSocket tunnels per worker: counted from the connections themselves, so it cannot drift."""
        counts: dict[str, int] = {}
        for carried in list(self.carried):
            counts[carried.worker] = counts.get(carried.worker, 0) + 1
        for conn in list(self.conns):
            tunnel = cast("UpstreamConn | None", conn.tunnel)  # the listener made it: an UpstreamConn
            if tunnel is not None and not tunnel.closed:
                worker = tunnel.pool.worker_id
                counts[worker] = counts.get(worker, 0) + 1
        return counts

    def tunnels_of(self, user: str) -> int:
        """The user's open WebSocket tunnels (a live move waits until there are none: moving would cut them)."""
        return (sum(1 for conn in list(self.conns) if conn.tunnel_user == user and conn.tunnel is not None)
                + sum(1 for carried in list(self.carried) if carried.user == user))
