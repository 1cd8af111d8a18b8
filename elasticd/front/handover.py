"""The front's part of a re-exec in place: settle every client connection so that the next image can take it, and
take them on the other side.

What can be carried over an exec is a descriptor; what cannot is anything in this process's memory. So a connection
is carried only where nothing of it is in memory:

- a kept-alive connection between requests (``ClientConn.idle``: nothing queued, nothing half parsed — the parser
  holds a partial head only while a request is ``cur``): its reading is paused, so what the client sends next stays
  in the kernel's buffer, for the next image to read. Its answer was written whole (the write buffer is empty);
- a WebSocket tunnel: both its connections' reading paused, then both write buffers waited for until empty.

Two phases, so that one tenant's long request does not hold every tenant's new connections:

1. **Serving as usual** while the requests that were in flight when the upgrade was asked finish, up to the grace:
   nothing is paused, new connections are accepted and served. Usually milliseconds; a long poll, or a hostile
   tenant's handler that never answers, makes it the grace — during which everyone is served all the same.
2. **Stop accepting** (the listening sockets stay open: new connections wait in the backlog), and let the requests
   in flight now finish, up to the grace again; as each connection becomes idle it is paused in its turn (a client
   keeping its connection busy with request after request is paused between two). A request that was in flight
   when the upgrade was asked had its grace in phase 1: it is not waited for again. Whatever is still in flight at
   the end is cut (its connection closes with the exec: the client sees the connection end without an answer) and
   counted in the report; so is a tunnel whose buffers would not empty (a client or worker that does not read).

A tenant can still make phase 2 last up to the grace by starting a long request just before it begins (it cannot
know when); carrying a request that waits for its answer across the exec would end that too, and is not done.

If the exec then fails, ``resume`` undoes all of it: the old image goes on serving every connection as it was.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from elasticd.front.carried import CarriedTunnel
from elasticd.front.server import Front

__all__ = ["Settled", "carry_in", "resume", "settle"]

log = logging.getLogger("elasticd.front")

_POLL = 0.005  # seconds between two looks at the connections while they settle


@dataclass(slots=True)
class Settled:
    """What the front hands over: descriptors (duplicates, inheritable) and what could not be carried."""

    connections: list[int] = field(default_factory=list)
    tunnels: list[tuple[int, int, str, str | None]] = field(default_factory=list)  # client, worker, worker id, user
    cut: int = 0  # requests still in flight past the grace
    closed: int = 0  # connections not carried (closing already, or a tunnel that did not settle)
    waited: float = 0.0
    stopped_accepting: float = 0.0  # when phase 2 began (the accept gap's start)
    paused: list[Any] = field(default_factory=list)  # transports paused here: resumed if the exec fails


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
    paused: dict[int, Any] = {}  # id(transport) → transport

    def pause(transport: Any) -> None:
        if id(transport) not in paused and not transport.is_closing():
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
            elif not any(id(ex) in first_ids for ex in conn.relay.queue):  # (one from phase 1 had its grace: cut)
                busy += 1
        if not busy or clock() >= deadline:
            break
        await asyncio.sleep(_POLL)
    settled.waited = clock() - began
    settled.paused = list(paused.values())
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
        elif conn.idle and id(transport) in paused and not transport.get_write_buffer_size():
            fd = _fd(transport)
            if fd is None:
                settled.closed += 1
            else:
                settled.connections.append(_inheritable_dup(fd))
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
    if not exchanges:
        return False
    return any(id(ex) in exchanges for conn in list(front.conns) for ex in conn.relay.queue)


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
    for transport in settled.paused:
        if not transport.is_closing():
            transport.resume_reading()


async def carry_in(front: Front, connections: list[int], tunnels: list[tuple[int, int, str, str | None]],
                   ) -> tuple[int, int]:
    """The new image's side: serve the kept-alive connections and relay the tunnels the previous image handed over.
    (carried connections, carried tunnels); one that is no longer a connection is closed and not counted."""
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
    return kept, tunnels_kept
