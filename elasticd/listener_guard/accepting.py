"""A guarded listener's accept loop: each connection judged (``ListenerGuard.judge``) on the bare socket, before any
transport, protocol or task exists for it; a refused one reset at once; and refusals bounded in rate, past which
the listener stops accepting for a moment.

Why its own loop rather than ``loop.create_server`` with a gate in front of the protocol (this module's first
form): measured with ``benchmarks/neighbour_bench.py --only listeners`` (a tenant flooding ``metrics_listen`` from
64 threads), that gate refused 57,000 connections in 11 s, at about 60 µs of elasticd's time each (a transport, a
protocol, their callbacks), and the neighbour tenant's throughput fell to 0.74x. Here a refusal is an accept, one
kernel lookup and a close (``SO_LINGER`` 0: a reset, no TIME-WAIT kept), and past ``REFUSALS_PER_SECOND`` (a burst
of ``REFUSAL_BURST``) the listening socket is left alone until the budget has room again (at least ``PAUSE``): the
flood waits in the kernel's backlog, and a full backlog makes the kernel drop the attacker's SYNs, which costs
elasticd nothing. The operator's scrape in the middle of a flood waits for its turn in the backlog, a second or so;
a legitimate peer is never refused.

A served connection is handed to the server's protocol with ``loop.connect_accepted_socket`` (asyncio's and
uvloop's), as if the server had accepted it itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import struct
import time
from collections.abc import Callable
from typing import Final

from elasticd.front.core.quota import TokenBucket
from elasticd.listener_guard.guard import ListenerGuard

__all__ = ["PAUSE", "REFUSALS_PER_SECOND", "REFUSAL_BURST", "GuardedAccept"]

log = logging.getLogger("elasticd.listener_guard")

REFUSALS_PER_SECOND: Final = 500.0
REFUSAL_BURST: Final = 1000
PAUSE: Final = 0.1  # seconds the listener is left alone once the refusals' budget is spent
_BATCH: Final = 64  # connections accepted per wake-up (the rest at the next turn of the loop)
_RESET: Final = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() resets


class GuardedAccept:
    """Accepts on ``sock`` (a listening socket of the daemon's ``Listeners``) for ``factory`` (a protocol factory,
    as ``create_server`` takes), behind ``guard``."""

    __slots__ = ("_bucket", "_clock", "_factory", "_guard", "_listener", "_loop", "_reading", "_sock", "_tasks",
                 "_timer")

    def __init__(self, sock: socket.socket, guard: ListenerGuard, listener: str,
                 factory: Callable[[], asyncio.BaseProtocol], *, clock: Callable[[], float] = time.monotonic,
                 refusals_per_second: float = REFUSALS_PER_SECOND, burst: int = REFUSAL_BURST) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._guard = guard
        self._listener = listener
        self._factory = factory
        self._clock = clock
        self._bucket = TokenBucket(refusals_per_second, burst, clock())
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[object]] = set()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._resume()

    def _resume(self) -> None:
        self._timer = None
        if self._loop is not None and not self._reading and self._sock.fileno() >= 0:
            self._loop.add_reader(self._sock.fileno(), self._ready)
            self._reading = True

    def _pause(self, seconds: float = PAUSE) -> None:
        assert self._loop is not None
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False
        if self._timer is None:
            self._timer = self._loop.call_later(max(seconds, PAUSE), self._resume)

    def _ready(self) -> None:
        for _ in range(_BATCH):
            try:
                conn, peer = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    log.warning("%s: cannot accept (%s); trying again in %gs", self._listener, exc.strerror, PAUSE)
                    self._pause()  # (out of descriptors: the next connection waits in the backlog, not in a loop)
                return
            try:
                own = conn.getsockname()
                verdict = self._guard.judge(self._listener, peer, own)
            except OSError:  # (the peer reset it already: nothing to judge, nothing to serve)
                conn.close()
                continue
            if verdict.served:
                self._serve(conn)
                continue
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            conn.close()
            wait = self._bucket.take(self._clock())
            if wait > 0:  # (the budget spent: rest until a token is due, and at least PAUSE)
                self._pause(wait)
                return

    def _serve(self, conn: socket.socket) -> None:
        assert self._loop is not None
        conn.setblocking(False)
        task: asyncio.Task[object] = self._loop.create_task(self._hand_over(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _hand_over(self, conn: socket.socket) -> object:
        assert self._loop is not None
        try:
            return await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError as exc:  # (gone between the accept and now)
            log.debug("%s: a connection went before it was served: %s", self._listener, exc)
            conn.close()
            return None

    def close(self) -> None:
        """Stop accepting and close the socket (a duplicate: the held one keeps listening, see listeners.py)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False
        self._sock.close()
        for task in self._tasks:
            task.cancel()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])
