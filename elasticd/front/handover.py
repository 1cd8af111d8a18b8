"""The front's part of a re-exec in place, on the old image's side: settle every client connection so that the next
image can take it (``takeover`` takes them on the other side).

What can be carried over an exec is a descriptor; what cannot is anything in this process's memory. So a connection
is carried only where nothing of it is in memory:

- a kept-alive connection between requests (``ClientConn.idle``: nothing queued, nothing half parsed — the parser
  holds a partial head only while a request is ``cur``): its reading is paused, so what the client sends next stays
  in the kernel's buffer, for the next image to read. Its answer was written whole (the write buffer is empty);
- a WebSocket tunnel: both its connections' reading paused, then both write buffers waited for until empty;
- a request awaiting its answer (``awaiting``): sent whole to its worker, not one byte of the answer read, nothing
  else queued on its connection. Both its connections' reading is paused, so the answer stays in the kernel's
  buffer; the next image makes the exchange anew from what ``SavedRequest`` keeps (its method, version, whether the
  client keeps its connection, the cookie to set, whose and where) and relays the answer as this image would have.
  A slow handler — a long poll, a report, a hostile tenant's request that never ends — holds nobody's upgrade;
- a request not yet sent to a worker (``unsent``: in its group's queue, waiting for a worker that starts, or for one
  of its worker's connections — its tenant's workers saturated): its client connection's reading is paused, and the
  request goes over as the client could have sent it (``request_again``), for the next image to read and route
  afresh. A tenant that keeps its own workers saturated holds nobody's upgrade either.

Two phases, so that one tenant's long request does not hold every tenant's new connections:

1. **Serving as usual** while the requests that were in flight when the upgrade was asked finish or come to await
   their answer, up to the grace: nothing is paused, new connections are accepted and served. Usually
   milliseconds; an answer streaming slowly (a large download to a slow client, a worker trickling its body) makes
   it longer, up to the grace — during which everyone is served all the same.
2. **Stop accepting** (the listening sockets stay open: new connections wait in the backlog), and let the requests
   in flight now finish or come to await their answer, up to the grace again; as each connection becomes idle or
   awaiting it is paused in its turn (a client keeping its connection busy with request after request is paused
   between two). A request that was in flight when the upgrade was asked had its grace in phase 1: it is not waited
   for again. Whatever is still in flight at the end is cut (its connection closes with the exec: the client sees
   the connection end without a whole answer) and counted in the report; so is a tunnel whose buffers would not
   empty (a client or worker that does not read).

What can still make phase 2 last up to the grace is an answer *under way* that began in phase 1: its body is
relayed through this image's parser (its framing, the chunk it is in), which an exec cannot carry; only a tenant's
own worker can make one last (a slow stream), and it is cut at the grace. What a *client* has yet to finish (a
request head or body begun, requests pipelined behind the one under way) is waited for ``_CLIENT_WAIT`` only, then
cut: otherwise any client could hold every tenant's new connections for the grace.

If the exec then fails, ``resume`` undoes all of it: the old image goes on serving every connection as it was.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticd.front.client import ClientConn
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.relay import PHASE_FORWARDING, PHASE_PARKED, PHASE_QUEUED
from elasticd.front.listening import Listening
from elasticd.upgrade.state import SavedRequest, SavedTunnel, SavedUnsent

__all__ = ["Settled", "awaiting", "request_again", "resume", "settle", "unsent"]

log = logging.getLogger("elasticd.front")

_POLL = 0.005  # seconds between two looks at the connections while they settle
# Seconds phase 2 waits for what only a client can finish and cannot be carried half done: a request head or body
# begun (a client sends a whole one in milliseconds), requests pipelined behind one. Past it, a client that trickles
# (slowloris: anyone can open such a connection) holds nobody: it is cut.
_CLIENT_WAIT = 1.0
# Request bytes carried for requests not yet sent, in all (each is at most a head and MAX_PENDING of body): the
# document is built in the accept gap, and past this a flood of large queued requests is cut rather than carried.
_MAX_UNSENT_BYTES = 32 << 20


@dataclass(slots=True)
class Settled:
    """What the front hands over: descriptors (duplicates, inheritable) and what could not be carried."""

    connections: list[int] = field(default_factory=list)
    tunnels: list[SavedTunnel] = field(default_factory=list)
    requests: list[SavedRequest] = field(default_factory=list)  # awaiting their answer
    unsent: list[SavedUnsent] = field(default_factory=list)  # not yet sent to a worker
    cut: int = 0  # requests still in flight past the grace
    closed: int = 0  # connections not carried (closing already, or a tunnel that did not settle)
    waited: float = 0.0
    stopped_accepting: float = 0.0  # when phase 2 began (the accept gap's start)
    paused: list[Any] = field(default_factory=list)  # transports paused here: resumed if the exec fails


def _alone(conn: ClientConn) -> Exchange | None:
    """``conn``'s one request, read whole, when nothing else is on the connection (no request queued behind it or
    half parsed, no upgrade, no tunnel, not closing) and nothing is unwritten to the client. None otherwise."""
    relay, transport = conn.relay, conn.transport
    if (transport is None or transport.is_closing() or transport.get_write_buffer_size() or len(relay.queue) != 1
            or relay.cur is not None or relay.tunnel is not None or relay.upgrading is not None or relay.draining):
        return None
    ex = relay.queue[0]
    return ex if ex.body_done and ex.head.upgrade is None else None


def awaiting(conn: ClientConn) -> Exchange | None:
    """``conn``'s one request (``_alone``) when it can be carried as it is: sent whole to its worker, whose answer
    has not begun (not a byte of it read), no body bytes held, nothing unwritten to the worker. None otherwise."""
    ex = _alone(conn)
    if (ex is None or conn.relay.pending or ex.phase is not PHASE_FORWARDING or not ex.sent or ex.route is None
            or ex.worker is None):
        return None
    link: Any = ex.conn  # (an UpstreamConn: the front made it)
    if link is None or link.closed or link.relay.received:
        return None
    upstream = link.transport
    if upstream is None or upstream.is_closing() or upstream.get_write_buffer_size():
        return None
    return ex


def unsent(conn: ClientConn) -> Exchange | None:
    """``conn``'s one request (``_alone``) when it was not yet sent to a worker — in its group's queue (parked),
    waiting for a worker that starts (parked), or for one of its worker's connections (forwarding, no connection).
    None otherwise."""
    ex = _alone(conn)
    if ex is None or ex.sent or ex.error is not None:
        return None
    phase = ex.phase
    if phase is PHASE_QUEUED or phase is PHASE_PARKED or (phase is PHASE_FORWARDING and ex.conn is None):
        return ex
    return None


def request_again(ex: Exchange) -> bytes:
    """``ex`` as its client could have sent it: its line, its end-to-end header lines as read (Host, Cookie,
    Content-Length and the rest), the X-Forwarded-For it came with, its connection's persistence as its version
    needs it said, and its body whole (a chunked one as one chunk; the trailer was dropped on reading). What the
    reader drops (hop-by-hop fields, X-Elastic-User-Id) stays dropped. Read again, it is the same request."""
    head = ex.head
    parts = [ex.method, b" ", ex.url, b" HTTP/1.1\r\n" if ex.http11 else b" HTTP/1.0\r\n", *head.lines]
    if head.forwarded_for is not None:
        parts += [b"X-Forwarded-For: ", head.forwarded_for, b"\r\n"]
    if ex.http11 and not head.keep_alive:
        parts.append(b"Connection: close\r\n")
    elif not ex.http11 and head.keep_alive:
        parts.append(b"Connection: keep-alive\r\n")
    body = b"".join(ex.body)
    if head.chunked is not None:
        parts += [b"Transfer-Encoding: ", head.chunked, b"\r\n\r\n"]
        if body:
            parts += [b"%x\r\n" % len(body), body, b"\r\n"]
        parts.append(b"0\r\n\r\n")
    else:
        parts += [b"\r\n", body]
    return b"".join(parts)


def _saved(ex: Exchange, client_fd: int, worker_fd: int) -> SavedRequest:
    """``ex`` as the next image takes it (``_carry_request``), with its connections' inheritable duplicates."""
    host = ex.head.host
    route = ex.route
    assert route is not None  # (awaiting: routed)
    return SavedRequest(client_fd, worker_fd, ex.worker or "", ex.user, route.tenant, route.app, ex.group,
                        host.decode("latin-1") if host is not None else None, ex.method.decode("latin-1"),
                        ex.url.decode("latin-1"), ex.http11, ex.head.keep_alive, ex.head.has_body,
                        ex.cookie_line.decode("latin-1"), ex.ts)


def _client_owes(conn: ClientConn) -> bool:
    """What keeps ``conn`` from settling is the client's to finish: a head or body it is still sending, or requests
    it pipelined behind the one under way."""
    relay = conn.relay
    return relay.cur is not None or len(relay.queue) > 1 or (bool(relay.queue) and not relay.queue[0].body_done)


def _fd(transport: Any) -> int | None:
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock.fileno() if sock is not None else None


async def settle(listening: Listening, grace: float, clock: Callable[[], float]) -> Settled:
    """Let the requests in flight finish (two phases, each up to ``grace`` seconds: see above), stop accepting (the
    listening sockets stay open), and duplicate every carriable connection's descriptor."""
    settled = Settled()
    began = clock()
    # Phase 1: serving as usual while the requests in flight now finish.
    # (held: their ids stay theirs)
    first: list[Any] = [ex for conn in list(listening.conns) for ex in conn.relay.queue]
    first_ids = {id(ex) for ex in first}
    deadline = began + grace
    while clock() < deadline and _any_in_flight(listening, first_ids):
        await asyncio.sleep(_POLL)
    # Phase 2: no new connection accepted; the ones open settle.
    listening.stop_accepting()
    settled.stopped_accepting = clock()
    deadline = settled.stopped_accepting + grace
    # Transports paused here (id → transport), to resume if the exec fails. One the relay paused itself (its
    # back-pressure) is left to the relay: resuming it would undo that.
    paused: dict[int, Any] = {}

    def pause(transport: Any) -> None:
        if not transport.is_closing() and transport.is_reading():
            transport.pause_reading()
            paused[id(transport)] = transport

    while True:
        busy = 0
        for conn in list(listening.conns):
            transport = conn.transport
            if transport is None or transport.is_closing():
                continue
            tunnel: Any = conn.tunnel  # (an UpstreamConn: the front made it)
            if tunnel is not None:
                pause(transport)
                if tunnel.transport is not None:
                    pause(tunnel.transport)
                    if tunnel.transport.get_write_buffer_size():
                        busy += 1
                if transport.get_write_buffer_size():
                    busy += 1
            elif conn.idle and not transport.get_write_buffer_size():
                pause(transport)
            elif (ex := awaiting(conn)) is not None:
                pause(transport)
                pause(ex.conn.transport)  # type: ignore[union-attr]  # (awaiting: it has one)
            elif unsent(conn) is not None:
                pause(transport)
            elif _client_owes(conn):
                if clock() - settled.stopped_accepting < _CLIENT_WAIT:  # (see _CLIENT_WAIT: then cut)
                    busy += 1
            elif not any(id(ex) in first_ids for ex in conn.relay.queue):  # (one from phase 1 had its grace: cut)
                busy += 1
        if not busy or clock() >= deadline:
            break
        await asyncio.sleep(_POLL)
    settled.waited = clock() - began
    settled.paused = list(paused.values())
    try:
        _collect(listening, settled)
    except BaseException:  # (a descriptor the kernel would not give: undo what was done, and say why above)
        resume(listening, settled)
        raise
    return settled


def _collect(listening: Listening, settled: Settled) -> None:
    """Duplicate every settled connection's descriptors into ``settled``; count the rest as cut or closed."""
    unsent_bytes = 0
    for conn in list(listening.conns):
        transport = conn.transport
        if transport is None or transport.is_closing():
            continue
        carried: Any = conn.tunnel  # (an UpstreamConn: the front made it)
        if carried is not None:
            upstream = carried.transport
            if (upstream is None or upstream.is_closing() or transport.get_write_buffer_size()
                    or upstream.get_write_buffer_size()):
                settled.closed += 1
                continue
            client_fd, worker_fd = _fd(transport), _fd(upstream)
            if client_fd is None or worker_fd is None:
                settled.closed += 1
                continue
            settled.tunnels.append(SavedTunnel(*_inheritable_pair(client_fd, worker_fd),
                                               carried.pool.worker_id, conn.tunnel_user))
        elif conn.idle and not transport.is_reading() and not transport.get_write_buffer_size():
            fd = _fd(transport)
            if fd is None:
                settled.closed += 1
            else:
                settled.connections.append(_inheritable_dup(fd))
        elif ((ex := awaiting(conn)) is not None and not transport.is_reading()
              and not ex.conn.transport.is_reading()):  # type: ignore[union-attr]  # (awaiting: it has one)
            client_fd, worker_fd = _fd(transport), _fd(ex.conn.transport)  # type: ignore[union-attr]
            if client_fd is None or worker_fd is None:
                settled.cut += 1
            else:
                settled.requests.append(_saved(ex, *_inheritable_pair(client_fd, worker_fd)))
        elif (ex := unsent(conn)) is not None and not transport.is_reading():
            # (no await from here to the exec: this image sends it nowhere meanwhile, so it is sent once, by the next)
            client_fd = _fd(transport)
            data = request_again(ex)
            unsent_bytes += len(data)
            if client_fd is None or unsent_bytes > _MAX_UNSENT_BYTES:
                settled.cut += 1
            else:
                settled.unsent.append(SavedUnsent(_inheritable_dup(client_fd), base64.b64encode(data).decode()))
        else:
            settled.cut += 1
    # Tunnels carried over from the image before: carried on again, as they are (never paused: both sides are
    # kernel buffers only while this image relays nothing, which the exec guarantees from here on).
    for tunnel in list(listening.carried):
        client, upstream = tunnel.client.transport, tunnel.upstream.transport
        if client is None or upstream is None or client.get_write_buffer_size() or upstream.get_write_buffer_size():
            settled.closed += 1
            continue
        client_fd, worker_fd = _fd(client), _fd(upstream)
        if client_fd is None or worker_fd is None:
            settled.closed += 1
            continue
        client.pause_reading()
        upstream.pause_reading()
        settled.paused.extend((client, upstream))
        settled.tunnels.append(SavedTunnel(*_inheritable_pair(client_fd, worker_fd), tunnel.worker,
                                           tunnel.user))


def _any_in_flight(listening: Listening, exchanges: set[int]) -> bool:
    """One of ``exchanges`` is still in flight, and neither awaiting its answer nor unsent (those are carried)."""
    if not exchanges:
        return False
    for conn in list(listening.conns):
        for ex in conn.relay.queue:
            if id(ex) in exchanges and awaiting(conn) is not ex and unsent(conn) is not ex:
                return True
    return False


def _inheritable_dup(fd: int) -> int:
    copy = os.dup(fd)
    os.set_inheritable(copy, True)
    return copy


def _inheritable_pair(client_fd: int, worker_fd: int) -> tuple[int, int]:
    """Both ends' duplicates, or neither (the first closed when the second cannot be had)."""
    client = _inheritable_dup(client_fd)
    try:
        return client, _inheritable_dup(worker_fd)
    except BaseException:
        os.close(client)
        raise


def resume(listening: Listening, settled: Settled) -> None:
    """The exec failed: close the duplicates, resume every paused connection (``Front.start`` serves again)."""
    for fd in settled.connections:
        os.close(fd)
    for tunnel in settled.tunnels:
        os.close(tunnel.client)
        os.close(tunnel.upstream)
    for request in settled.requests:
        os.close(request.client)
        os.close(request.upstream)
    for queued in settled.unsent:
        os.close(queued.client)
    for transport in settled.paused:
        if not transport.is_closing():
            transport.resume_reading()
