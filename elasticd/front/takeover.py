"""The front's part of a re-exec in place, on the new image's side: take what the previous image handed over
(``handover`` settled it) — the kept-alive connections, the WebSocket tunnels, the requests awaiting their answer
and those not yet sent — and serve them as this image's own.

Each is taken on its own: one whose connection is gone is closed and not counted, and one that fails to be taken
does not keep the others from theirs.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
from collections.abc import Callable

from elasticd.front.carried import CarriedTunnel
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.http1 import RequestHead
from elasticd.front.core.relay import EVENT_CLIENT_LEFT
from elasticd.front.server import Front
from elasticd.front.upstream import Upstream, UpstreamConn
from elasticd.upgrade.state import SavedRequest, SavedState, SavedUnsent

__all__ = ["carry_in"]

log = logging.getLogger("elasticd.front")


def _taken(fd: int) -> socket.socket:
    """An inherited descriptor as this image's socket: not passed on to what it starts, non-blocking."""
    sock = socket.socket(fileno=fd)
    os.set_inheritable(fd, False)
    sock.setblocking(False)
    return sock


async def carry_in(front: Front, saved: SavedState,
                   upstream_of: Callable[[str], Upstream | None]) -> tuple[int, int, int]:
    """Serve the kept-alive connections, relay the tunnels, and take up the requests in flight that the previous
    image handed over (``upstream_of``: a running worker's Upstream by its id, routable or not). Returns (carried
    connections, carried tunnels, carried requests of both kinds)."""
    loop = asyncio.get_running_loop()
    kept = 0
    for fd in saved.connections:
        sock = _taken(fd)
        try:
            await loop.connect_accepted_socket(front.listening.connection, sock)
        except OSError as exc:
            log.info("a client connection carried over the re-exec is gone: %s", exc)
            sock.close()
            continue
        kept += 1
    tunnels_kept = 0
    for saved_tunnel in saved.tunnels:
        tunnel = CarriedTunnel(saved_tunnel.worker, saved_tunnel.user, front.clock)
        try:
            await tunnel.open(_taken(saved_tunnel.client), _taken(saved_tunnel.upstream))
        except OSError as exc:
            log.info("a WebSocket tunnel carried over the re-exec is gone: %s", exc)
            continue
        front.listening.carried.add(tunnel)
        tunnel.on_close = front.listening.carried.discard
        tunnels_kept += 1
    requests_kept = 0
    for request in saved.requests:
        try:
            requests_kept += await _carry_request(front, request, upstream_of)
        except Exception:  # one request that cannot be taken up must not keep the others from theirs
            log.exception("taking up %s %s, carried over the re-exec, failed", request.method, request.url)
    for queued in saved.unsent:
        try:
            requests_kept += await _carry_unsent(front, queued)
        except Exception:
            log.exception("taking up a request not yet sent, carried over the re-exec, failed")
    return kept, tunnels_kept, requests_kept


async def _carry_unsent(front: Front, saved: SavedUnsent) -> bool:
    """Read ``saved``'s request on a client connection of this image's front as if its client had sent it now, and
    route it as any: the connection's own bytes (a next request) are read after it, in order."""
    loop = asyncio.get_running_loop()
    sock = _taken(saved.client)
    client = front.listening.connection()
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
    client_sock, worker_sock = _taken(saved.client), _taken(saved.upstream)
    host = saved.host.encode("latin-1") if saved.host is not None else None
    target = front.forwarding.target(host)
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
    pool = front.worker_links.pool_of(upstream, route, saved.group)
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
    client = front.listening.connection()
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
        front.forwarding.settle(ex, 499, EVENT_CLIENT_LEFT)
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
