"""A WebSocket tunnel carried over a re-exec in place: its two connections (the client's, the worker's) were kept
open across the exec, with nothing of either left unread or unwritten in the old image (``upgrade.handover`` paused
both and waited for their buffers to empty), so from here on it is only bytes, relayed both ways.

The tunnel's protocol (WebSocket frames, or whatever was upgraded to) is the client's and the worker's business, as
it was before: the front never parsed it. Flow control is each side's write buffer pausing the other's reading, as
the front's own tunnels do; either side's end ends both. It is counted where the front counts tunnels (a drain, a
move, a stop wait for it) and ends at the front's tunnel timeout when nothing moves.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

__all__ = ["CarriedTunnel"]


class _Side(asyncio.Protocol):
    __slots__ = ("held", "other", "transport", "tunnel")

    def __init__(self, tunnel: CarriedTunnel) -> None:
        self.tunnel = tunnel
        self.transport: asyncio.Transport | None = None
        self.other: _Side | None = None
        # What this side read before the other side's transport existed (the two are taken one after the other, and
        # what the client sent during the exec is read at once): written to the other side when it comes.
        self.held: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        other = self.other
        if other is not None and other.held:
            for data in other.held:
                self.transport.write(data)  # type: ignore[union-attr]
            other.held.clear()
            if other.transport is not None:
                other.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        self.tunnel.active_at = self.tunnel.clock()
        other = self.other
        if other is not None and other.transport is not None:
            other.transport.write(data)
        else:
            self.held.append(data)
            if self.transport is not None:
                self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.tunnel.close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.tunnel.close()

    def pause_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.other is not None and self.other.transport is not None:
            self.other.transport.resume_reading()


class CarriedTunnel:
    __slots__ = ("active_at", "client", "clock", "closed", "on_close", "upstream", "user", "worker")

    def __init__(self, worker: str, user: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.worker = worker
        self.user = user
        self.clock = clock
        self.active_at = clock()
        self.client = _Side(self)
        self.upstream = _Side(self)
        self.client.other, self.upstream.other = self.upstream, self.client
        self.closed = False
        self.on_close: Callable[[CarriedTunnel], None] | None = None

    async def open(self, client: socket.socket, upstream: socket.socket) -> None:
        """Relay between the two sockets (OSError: one of them is not a connection any more; both are closed)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(lambda: self.client, client)
            await loop.connect_accepted_socket(lambda: self.upstream, upstream)
        except BaseException:
            self.close()
            client.close()
            upstream.close()
            raise

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for side in (self.client, self.upstream):
            if side.transport is not None:
                side.transport.close()
        if self.on_close is not None:
            self.on_close(self)
