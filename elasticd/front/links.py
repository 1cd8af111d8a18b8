"""What the two halves of the relay see of each other: the client connection (``client.ClientConn``) and a
worker connection (``upstream.UpstreamConn``) each drive the relay core and talk to the other only through
these, so neither module imports the other (the front's parts build both). And what a client connection
sees of the front: the request path (``FrontSide``: ``forwarding.Forwarding``, also what the parts that call back
into it see of it) and the listener that accepted it (``ListeningSide``: ``listening.Listening``).

Base classes, not Protocols: the one class of each side inherits its base, and the compiled front (mypyc) then calls
across through the base's vtable and reads its attributes from the instance's struct. Through a Protocol it looked
each method up by name, parsed its arguments and checked the types of what came back, at every request (about 4 % of
the compiled front's CPU in perf). The methods here are never run: each says what its class does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.dispatch import Target
from elasticd.front.core.exchange import Exchange, Link
from elasticd.front.core.relay import Event
from elasticd.front.core.routing import RouteTable
from elasticd.front.core.sticky import Surface

__all__ = ["ClientSide", "FrontSide", "ListeningSide", "WorkerSide"]


# A connection to a worker, as the client connection holds it (``Exchange.conn``, or the tunnel): the core's
# own ``Link``, so the exchange and the shell name one protocol.
WorkerSide = Link


class ClientSide(asyncio.Protocol):
    """The client connection (``client.ClientConn``), as a worker connection streams an answer to it. (An asyncio
    Protocol: the event loop's side of the connection is the class's.)"""

    __slots__ = ("clock", "transport")

    # (No float attribute here: Debian 13's mypyc, 1.15, fails to build a subclass that sets a float its base
    # declares, "value is not in list" in its attribute bitmap; ``stamp`` sets the client's own.)
    clock: Callable[[], float]
    transport: asyncio.Transport | None  # the client's, None once it is lost (the worker side writes to it)

    def stamp(self) -> float:
        """Now, on the client's clock, kept as its last activity (the worker side's answer bytes came)."""
        raise NotImplementedError

    def write(self, data: bytes) -> None:
        raise NotImplementedError

    def answered(self, ex: Exchange, close_after: bool | None) -> None:
        """The worker's answer is complete and was relayed. ``close_after``: what its head said (None: no
        head came, which closes)."""
        raise NotImplementedError

    def send_head(self, ex: Exchange) -> None:
        """``ex`` has its worker connection (``ex.conn``): its head, with whatever body came, goes to the worker."""
        raise NotImplementedError

    def upstream_failed(self, ex: Exchange, reused: bool, received: bool, path: str, why: str,
                        refused: str = "") -> None:
        """The worker's connection (on socket ``path``) ended before the answer did; ``refused``: the bound its
        answer passed (``core.bounds``' reason), "" when the connection failed."""
        raise NotImplementedError

    def became_tunnel(self, ex: Exchange, conn: WorkerSide, tail: bytes) -> None:
        raise NotImplementedError

    def tunnel_closed(self) -> None:
        raise NotImplementedError

    def pause_reading_for_upstream(self) -> None:
        raise NotImplementedError

    def resume_reading_for_upstream(self) -> None:
        raise NotImplementedError

    def fail_closed(self, error: BaseException) -> None:
        raise NotImplementedError


class ListeningSide:
    """The listener (``listening.Listening``), as a client connection it accepted joins it, leaves it, and asks
    how to answer while the front stops."""

    __slots__ = ()

    clock: Callable[[], float]
    closing: bool  # a drained stop: every answer closes its connection, announced
    conns: set[Any]
    keep_underscored: bool
    max_header_bytes: int
    stopping: bool
    # Whether a connection's peer is a proxy trusted with X-Forwarded-* and Forwarded, from its address and the
    # address it connected to (None: nobody is; the daemon's ``ProxyTrust``).
    trusts: Callable[[tuple[str, int], tuple[str, int]], bool] | None


class FrontSide:
    """The request path (``forwarding.Forwarding``), as a client connection asks it to route, settle and give up,
    and as the front's other parts hand it a request back (decided again, or answered)."""

    __slots__ = ()

    forwards: ForwardCounters
    routes: RouteTable
    surface: Surface

    def target(self, host: bytes | None) -> Target | None:
        raise NotImplementedError

    def dispatch(self, client: Any, ex: Exchange) -> None:
        raise NotImplementedError

    def settle(self, ex: Exchange, status: int, event: Event) -> None:
        raise NotImplementedError

    def logged_in(self, ex: Exchange, now: float) -> None:
        raise NotImplementedError

    def backed_off(self, ex: Exchange) -> None:
        raise NotImplementedError

    def relay_failed(self, client: Any, ex: Exchange, status: int, text: str, close: bool = False,
                     retry_after: int | None = None) -> None:
        raise NotImplementedError

    def retry(self, client: Any, ex: Exchange) -> None:
        raise NotImplementedError

    def worker_failed(self, worker_id: str | None, path: str) -> None:
        raise NotImplementedError

    def tell_of_worker(self, worker: str | None, kind: str, message: str, *args: object) -> None:
        raise NotImplementedError
