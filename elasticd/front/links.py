"""What the two halves of the relay see of each other: the client connection (``client.ClientConn``) and a
worker connection (``upstream.UpstreamConn``) each drive the relay core and talk to the other only through
these Protocols, so neither module imports the other (the front's parts build both). And what a client connection
sees of the front: the request path (``FrontSide``: ``forwarding.Forwarding``, also what the parts that call back
into it see of it) and the listener that accepted it (``ListeningSide``: ``listening.Listening``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

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


class ClientSide(Protocol):
    """The client connection, as a worker connection streams an answer to it."""

    active_at: float
    clock: Callable[[], float]
    transport: Any  # the client's asyncio transport, None once it is lost (the worker side writes to it)

    def write(self, data: bytes) -> None: ...

    def answered(self, ex: Exchange, close_after: bool | None) -> None:
        """The worker's answer is complete and was relayed. ``close_after``: what its head said (None: no
        head came, which closes)."""

    def send_head(self, ex: Exchange) -> None:
        """``ex`` has its worker connection (``ex.conn``): its head, with whatever body came, goes to the worker."""

    def upstream_failed(self, ex: Exchange, reused: bool, received: bool, path: str, why: str,
                        refused: str = "") -> None:
        """The worker's connection (on socket ``path``) ended before the answer did; ``refused``: the bound its
        answer passed (``core.bounds``' reason), "" when the connection failed."""

    def became_tunnel(self, ex: Exchange, conn: WorkerSide, tail: bytes) -> None: ...

    def tunnel_closed(self) -> None: ...

    def pause_reading_for_upstream(self) -> None: ...

    def resume_reading_for_upstream(self) -> None: ...

    def fail_closed(self, error: BaseException) -> None: ...


class ListeningSide(Protocol):
    """The listener (``listening.Listening``), as a client connection it accepted joins it, leaves it, and asks
    how to answer while the front stops."""

    clock: Callable[[], float]
    closing: bool  # a drained stop: every answer closes its connection, announced
    conns: set[Any]
    keep_underscored: bool
    max_header_bytes: int
    stopping: bool
    # Whether a connection's peer is a proxy trusted with X-Forwarded-* and Forwarded, from its address and the
    # address it connected to (None: nobody is; the daemon's ``ProxyTrust``).
    trusts: Callable[[tuple[str, int], tuple[str, int]], bool] | None


class FrontSide(Protocol):
    """The request path (``forwarding.Forwarding``), as a client connection asks it to route, settle and give up,
    and as the front's other parts hand it a request back (decided again, or answered)."""

    forwards: ForwardCounters
    routes: RouteTable
    surface: Surface

    def target(self, host: bytes | None) -> Target | None: ...

    def dispatch(self, client: Any, ex: Exchange) -> None: ...

    def settle(self, ex: Exchange, status: int, event: Event) -> None: ...

    def logged_in(self, ex: Exchange, now: float) -> None: ...

    def backed_off(self, ex: Exchange) -> None: ...

    def relay_failed(self, client: Any, ex: Exchange, status: int, text: str, close: bool = False,
                     retry_after: int | None = None) -> None: ...

    def retry(self, client: Any, ex: Exchange) -> None: ...

    def worker_failed(self, worker_id: str | None, path: str) -> None: ...

    def tell_of_worker(self, worker: str | None, kind: str, message: str, *args: object) -> None: ...
