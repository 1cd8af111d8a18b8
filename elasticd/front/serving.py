"""The front's coroutines: opening the listener, the drain at stop, and probing an unroutable worker's socket.

They live apart from ``server.py`` because the request path (server, client, upstream, the core) is compiled
with mypyc (setup.py) and holds no coroutine: the mypyc of Debian bookworm (1.0.1, the one the .deb is built
with) crashes the interpreter when an exception is thrown into a compiled coroutine (a refused connect, a
cancelled sleep), where in Python it is just an exception. Each takes what it needs as arguments and hands its
outcome to a callback of the front's, so this module imports nothing of the front's (no cycle) and the
decisions stay in the front.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from elasticd.listener_guard.own import OWN_LISTENERS

__all__ = ["BACKLOG", "drain", "listen", "open_to", "probe"]

P = TypeVar("P", bound=asyncio.BaseProtocol)


async def listen(factory: Callable[[], asyncio.Protocol], sockets: Sequence[socket.socket],
                 listening: Callable[[list[asyncio.AbstractServer]], None]) -> None:
    """Serve on the front's listening sockets (bound already: ``listeners.Listeners``), one server each."""
    loop = asyncio.get_running_loop()
    listening([await loop.create_server(factory, sock=sock, backlog=BACKLOG) for sock in sockets])


BACKLOG = 1024  # connections waiting to be accepted: a burst, and the clients that come during a re-exec's gap


async def drain(busy: Callable[[], bool], grace: float, drained: Callable[[], None]) -> None:
    """Wait (up to ``grace`` seconds) until nothing is ``busy``, then ``drained``; one more loop turn lets the
    transports' close callbacks run."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while busy() and loop.time() < deadline:
        await asyncio.sleep(0.02)
    drained()
    await asyncio.sleep(0)


def open_to(factory: Callable[[], P], address: str) -> Coroutine[Any, Any, tuple[asyncio.BaseTransport, P]]:
    """A connection to a worker's Unix socket (``address`` an absolute path) or a node ("host:port", "[v6]:port"),
    as the loop's own coroutine."""
    loop = asyncio.get_running_loop()
    if address.startswith("/"):
        return loop.create_unix_connection(factory, address)
    host, _, port = address.rpartition(":")
    return _tcp(loop.create_connection(factory, host.strip("[]"), int(port)))


NODE_CONNECT_TIMEOUT = 2.0  # seconds: a node's host that is off answers nothing, and the kernel waits ~2 minutes


async def _tcp(connecting: Coroutine[Any, Any, tuple[asyncio.BaseTransport, P]]) -> tuple[asyncio.BaseTransport, P]:
    """A node's TCP connect, bounded: one that does not come in time is a failed connect (the node is found dead,
    the request answered 502), not a request hanging until request_timeout. One that reached elasticd's own
    metrics or agent listener (a tenant's node named by a DNS name that points here) is closed before a byte goes
    and failed the same way: elasticd would ask itself, as root, for the tenant."""
    transport, protocol = await asyncio.wait_for(connecting, NODE_CONNECT_TIMEOUT)
    peer, own = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
    # (each end spelled out: Debian 12's mypyc, which type-checks this module for the compiled front, reads a slice
    # of a tuple as a tuple of any length)
    if isinstance(peer, tuple) and OWN_LISTENERS.reached(
            (str(peer[0]), int(peer[1])), (str(own[0]), int(own[1])) if isinstance(own, tuple) else None):
        transport.close()  # (nothing was written: the close sends no byte of a request)
        raise ConnectionRefusedError(f"{peer[0]}:{peer[1]} is elasticd's own listener: not a node")
    return transport, protocol


async def probe(path: str, accepting: Callable[[], None]) -> None:
    """Try to connect to the worker's socket ``path`` (or a node's "host:port") (backing off from 50 ms to 2 s)
    until it accepts, then ``accepting``. Cancelled when the worker goes or the front stops."""
    delay = 0.05
    while True:
        await asyncio.sleep(delay)
        try:
            transport, _ = await open_to(asyncio.Protocol, path)
        except OSError:
            delay = min(delay * 2, 2.0)
            continue
        transport.close()
        accepting()
        return
