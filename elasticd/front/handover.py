"""The front's part of a re-exec in place: settle every client connection so that the next image can take it, and
take them on the other side.

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
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from elasticd.front.carried import CarriedTunnel
from elasticd.front.client import ClientConn
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.http1 import RequestHead
from elasticd.front.core.relay import EVENT_CLIENT_LEFT, PHASE_FORWARDING, PHASE_PARKED, PHASE_QUEUED
from elasticd.front.server import Front
from elasticd.front.upstream import Upstream, UpstreamConn
from elasticd.upgrade.state import SavedRequest, SavedUnsent

__all__ = ["Settled", "awaiting", "carry_in", "request_again", "resume", "settle", "unsent"]

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
    tunnels: list[tuple[int, int, str, str | None]] = field(default_factory=list)  # client, worker, worker id, user
    requests: list[SavedRequest] = field(default_factory=list)  # awaiting their answer
    unsent: list[SavedUnsent] = field(default_factory=list)  # not yet sent to a worker
    cut: int = 0  # requests still in flight past the grace
    closed: int = 0  # connections not carried (closing already, or a tunnel that did not settle)
    waited: float = 0.0
    stopped_accepting: float = 0.0  # when phase 2 began (the accept gap's start)
    paused: list[Any] = field(default_factory=list)  # transports paused here: resumed if the exec fails


def awaiting(conn: ClientConn) -> Exchange | None:
    """``conn``'s one request when it can be carried as it is: sent whole to its worker, whose answer has not begun
    (not a byte of it read), with nothing else on the connection (no request queued behind it or half parsed, no
    body bytes held, no upgrade) and nothing unwritten either way. None otherwise."""
    relay, transport = conn.relay, conn.transport
    if (transport is None or transport.is_closing() or transport.get_write_buffer_size() or len(relay.queue) != 1
            or relay.cur is not None or relay.pending or relay.tunnel is not None or relay.upgrading is not None
            or relay.draining):
        return None
    ex = relay.queue[0]
    if (ex.phase is not PHASE_FORWARDING or not ex.sent or not ex.body_done or ex.head.upgrade is not None
            or ex.route is None or ex.worker is None):
        return None
    link: Any = ex.conn  # (an UpstreamConn: the front made it)
    if link is None or link.closed or link.relay.received:
        return None
    upstream = link.transport
    if upstream is None or upstream.is_closing() or upstream.get_write_buffer_size():
        return None
    return ex


def unsent(conn: ClientConn) -> Exchange | None:
    """``conn``'s one request when it was read whole and not yet sent to a worker — in its group's queue (parked),
    waiting for a worker that starts (parked), or for one of its worker's connections (forwarding, no connection) —,
    with nothing else on the connection and nothing unwritten to the client. None otherwise."""
    relay, transport = conn.relay, conn.transport
    if (transport is None or transport.is_closing() or transport.get_write_buffer_size() or len(relay.queue) != 1
            or relay.cur is not None or relay.tunnel is not None or relay.upgrading is not None or relay.draining):
        return None
    ex = relay.queue[0]
    if not ex.body_done or ex.sent or ex.error is not None or ex.head.upgrade is not None:
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


async def settle(front: Front, grace: float, clock: Callable[[], float]) -> Settled:
    """Let the requests in flight finish (two phases, each up to ``grace`` seconds: see above), stop accepting (the
    listening sockets stay open), and duplicate every carriable connection's descriptor."""
    settled = Settled()
    began = clock()
    # Phase 1: serving as usual while the requests in flight now finish.
    first: list[Any] = [ex for conn in list(front.conns) for ex in conn.relay.queue]  # (held: their ids stay theirs)
    first_ids = {id(ex) for ex in first}
    deadline = began + grace
    while clock() < deadline and _any_in_flight(front, first_ids):
        await asyncio.sleep(_POLL)
    # Phase 2: no new connection accepted; the ones open settle.
    front.stop_accepting()
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
        for conn in list(front.conns):
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
    unsent_bytes = 0
    for conn in list(front.conns):
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
            settled.tunnels.append((_inheritable_dup(client_fd), _inheritable_dup(worker_fd),
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
                settled.requests.append(_saved(ex, _inheritable_dup(client_fd), _inheritable_dup(worker_fd)))
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
    for tunnel in list(front.carried):
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
        settled.tunnels.append((_inheritable_dup(client_fd), _inheritable_dup(worker_fd), tunnel.worker,
                                tunnel.user))
    return settled


def _any_in_flight(front: Front, exchanges: set[int]) -> bool:
    """One of ``exchanges`` is still in flight, and neither awaiting its answer nor unsent (those are carried)."""
    if not exchanges:
        return False
    for conn in list(front.conns):
        for ex in conn.relay.queue:
            if id(ex) in exchanges and awaiting(conn) is not ex and unsent(conn) is not ex:
                return True
    return False


def _inheritable_dup(fd: int) -> int:
    copy = os.dup(fd)
    os.set_inheritable(copy, True)
    return copy


def resume(front: Front, settled: Settled) -> None:
    """The exec failed: close the duplicates, resume every paused connection (``Front.start`` serves again)."""
    for fd in settled.connections:
        os.close(fd)
    for client, upstream, _, _ in settled.tunnels:
        os.close(client)
        os.close(upstream)
    for request in settled.requests:
        os.close(request.client)
        os.close(request.upstream)
    for queued in settled.unsent:
        os.close(queued.client)
    for transport in settled.paused:
        if not transport.is_closing():
            transport.resume_reading()


async def carry_in(front: Front, connections: list[int], tunnels: list[tuple[int, int, str, str | None]],
                   requests: Sequence[SavedRequest] = (),
                   upstream_of: Callable[[str], Upstream | None] = lambda worker: None,
                   unsent_requests: Sequence[SavedUnsent] = ()) -> tuple[int, int, int]:
    """The new image's side: serve the kept-alive connections, relay the tunnels, and take up the requests awaiting
    their answer and those not yet sent that the previous image handed over (``upstream_of``: a running worker's
    Upstream by its id, routable or not). (carried connections, carried tunnels, carried requests of both kinds); one
    whose connection is gone is closed and not counted."""
    loop = asyncio.get_running_loop()
    kept = 0
    for fd in connections:
        sock = socket.socket(fileno=fd)
        os.set_inheritable(fd, False)
        try:
            await loop.connect_accepted_socket(front.connection, sock)
        except OSError as exc:
            log.info("a client connection carried over the re-exec is gone: %s", exc)
            sock.close()
            continue
        kept += 1
    tunnels_kept = 0
    for client_fd, worker_fd, worker, user in tunnels:
        client, upstream = socket.socket(fileno=client_fd), socket.socket(fileno=worker_fd)
        for sock in (client, upstream):
            os.set_inheritable(sock.fileno(), False)
            sock.setblocking(False)
        tunnel = CarriedTunnel(worker, user, front.clock)
        try:
            await tunnel.open(client, upstream)
        except OSError as exc:
            log.info("a WebSocket tunnel carried over the re-exec is gone: %s", exc)
            continue
        front.carried.add(tunnel)
        tunnel.on_close = front.carried.discard
        tunnels_kept += 1
    requests_kept = 0
    for saved in requests:
        try:
            requests_kept += await _carry_request(front, saved, upstream_of)
        except Exception:  # one request that cannot be taken up must not keep the others from theirs
            log.exception("taking up %s %s, carried over the re-exec, failed", saved.method, saved.url)
    for queued in unsent_requests:
        try:
            requests_kept += await _carry_unsent(front, queued)
        except Exception:
            log.exception("taking up a request not yet sent, carried over the re-exec, failed")
    return kept, tunnels_kept, requests_kept


async def _carry_unsent(front: Front, saved: SavedUnsent) -> bool:
    """Read ``saved``'s request on a client connection of this image's front as if its client had sent it now, and
    route it as any: the connection's own bytes (a next request) are read after it, in order."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(fileno=saved.client)
    os.set_inheritable(sock.fileno(), False)
    sock.setblocking(False)
    client = front.connection()
    client.relay.receive(base64.b64decode(saved.data))  # parsed before the transport reads a byte of the socket
    if len(client.relay.queue) != 1:
        log.warning("a request carried over the re-exec did not read as one: its connection is closed")
        sock.close()
        return False
    try:
        await loop.connect_accepted_socket(lambda: client, sock)
    except OSError as exc:
        log.info("a request carried over the re-exec: its client is gone: %s", exc)
        sock.close()
        return False
    if client.transport is None or client.transport.is_closing():
        return False  # the client left as its connection was taken: nothing to send for it
    # Dispatched through the protocol's own path (an empty read: the request queued is DISPATCHed, or, if the
    # client's next bytes were read first, served in order), so that what follows an answer is what follows it.
    client.data_received(b"")
    return True


async def _carry_request(front: Front, saved: SavedRequest, upstream_of: Callable[[str], Upstream | None]) -> bool:
    """Make ``saved``'s exchange anew, in the phase it was in (forwarded, its answer not begun), on a client
    connection and a worker connection of this image's front: the answer then goes through the front's own relay
    (its head rewritten, the sticky cookie set, a login taken, the request settled and counted), and the client's
    connection goes on as any kept-alive one."""
    loop = asyncio.get_running_loop()
    client_sock, worker_sock = socket.socket(fileno=saved.client), socket.socket(fileno=saved.upstream)
    for sock in (client_sock, worker_sock):
        os.set_inheritable(sock.fileno(), False)
        sock.setblocking(False)
    host = saved.host.encode("latin-1") if saved.host is not None else None
    target = front.target(host)
    if target is not None and (target.route.tenant, target.route.app) != (saved.tenant, saved.app):
        target = None  # (a reload between the images gave its host to another app: not this request's route)
    upstream = upstream_of(saved.worker)
    if upstream is None and target is not None:  # a node (another host's elasticd) is not a worker of ours
        upstream = next((u for u in front.workers_of(target.route.tenant, target.route.app, saved.group)
                         if u.worker_id == saved.worker), None)
    if target is None or upstream is None:
        why = (f"its host no longer routes to {saved.tenant}/{saved.app}" if target is None
               else f"its worker {saved.worker} is gone")
        log.warning("%s %s, carried over the re-exec: %s; its connection is closed", saved.method, saved.url, why)
        client_sock.close()
        worker_sock.close()
        return False
    route = target.route
    pool = front.pool_of(upstream, route, saved.group)
    head = RequestHead()
    head.host = host
    head.keep_alive = saved.keep_alive
    if saved.has_body:
        head.length = b"1"  # (only whether it had one matters now: a request with a body is never sent twice)
    ex = Exchange()
    ex.method, ex.url, ex.http11, ex.head = (saved.method.encode("latin-1"), saved.url.encode("latin-1"),
                                             saved.http11, head)
    ex.body_done = ex.sent = True
    ex.route, ex.stats, ex.group, ex.worker, ex.user = route, target.stats, saved.group, saved.worker, saved.user
    ex.entry = front.surface.users.get(saved.user) if saved.user is not None else None
    ex.cookie_line = saved.cookie_line.encode("latin-1")
    ex.ts = saved.began
    ex.counters = pool.counters
    quota = target.quota
    if quota is not None:  # in flight already: counted against its tenant's concurrency, whatever the limit
        quota.gate.in_flight += 1
        ex.quota = quota
    # Every link is made before either transport exists: the answer may be in the worker socket's buffer already, and
    # the client may have sent its next request; either is read as soon as its transport is.
    client = front.connection()
    client.relay.queue.append(ex)
    link = UpstreamConn(pool)
    ex.forward(front.forwards, link)
    link.attach(ex, client, reused=False)  # (not reused: the request went whole; a close now is a 502, never resent)
    try:
        await loop.connect_accepted_socket(lambda: client, client_sock)
    except OSError as exc:
        log.info("%s %s, carried over the re-exec: its client is gone: %s", saved.method, saved.url, exc)
        client_sock.close()
        worker_sock.close()
        link.relay.detach()
        front.settle(ex, 499, EVENT_CLIENT_LEFT)
        return False
    try:
        await loop.connect_accepted_socket(lambda: link, worker_sock)
    except OSError as exc:
        worker_sock.close()
        link.connection_lost(exc)  # the worker's connection ended before the answer: 502, as the front says it
        return False
    except BaseException:
        worker_sock.close()
        ex.abandon(front.clock(), front.forwards)  # (its forward undone: no entry, in-flight count or quota held)
        raise
    if link.closed:
        # The client left while the worker's side was being taken (its 499 is settled, and it closed this link
        # before it had a transport): nobody waits for the answer.
        if link.transport is not None:
            link.transport.close()
        return False
    pool.opened(link)
    return True
