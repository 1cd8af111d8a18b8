"""``server.agent_listen``: HAProxy's agent-check, answered over TCP — one line per connection, then closed.

HAProxy sends its ``agent-send`` string right after it connects, or nothing at all; nothing is told apart from a
hint by waiting ``HINT_WAIT`` for a first line (a hint without its newline counts once that wait is over). The
answer is ``line``'s for the app the hint names (``rooms.AgentRooms``), or for the whole host. No connection is
kept: a check is one round trip, and HAProxy opens a new one every ``agent-inter``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence
from typing import Final

from elasticd.agent.line import MAX_HINT, app_line, host_line, parse_hint
from elasticd.agent.rooms import AgentRooms
from elasticd.config.model import Address
from elasticd.listener_guard.accepting import GuardedAccept
from elasticd.listener_guard.guard import ListenerGuard
from elasticd.listeners import bind_tcp

__all__ = ["HINT_WAIT", "AgentListener"]

log = logging.getLogger("elasticd.agent")

HINT_WAIT: Final = 0.2  # seconds a check may take to send its hint
_WRITE_WAIT: Final = 2.0  # seconds for the answer to go out (a peer that reads nothing is not waited for)


class AgentListener:
    __slots__ = ("_accept", "_guard", "_server", "address", "port", "rooms", "stopping")

    def __init__(self, address: Address, rooms: AgentRooms, guard: ListenerGuard | None = None) -> None:
        self.address = address
        self.rooms = rooms
        self._guard = guard  # None: every peer is answered (tests of the protocol alone)
        self._accept: GuardedAccept | None = None
        self._server: asyncio.AbstractServer | None = None
        self.port: int | None = None
        self.stopping = False  # elasticd is stopping (server.stop_drain): every answer is `drain`

    async def start(self, sockets: Sequence[socket.socket] | None = None) -> None:
        """Serve on ``sockets`` (the daemon's ``listeners.Listeners`` holds them), or on one bound here."""
        sock = (sockets or bind_tcp(self.address.host, self.address.port, 128))[0]

        def protocol() -> asyncio.BaseProtocol:  # (what asyncio.start_server makes for each connection)
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(), self._check)

        if self._guard is not None:  # (accepted by the guard's loop: judged before a byte is read)
            self._accept = GuardedAccept(sock, self._guard, "agent", protocol)
            self._accept.start()
            self.port = self._accept.port
        else:
            self._server = await asyncio.get_running_loop().create_server(protocol, sock=sock)
            self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("HAProxy agent-check answered on %s", Address(self.address.host, self.port))

    async def stop(self) -> None:
        accept, self._accept = self._accept, None
        if accept is not None:
            accept.close()
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    def answer(self, received: bytes) -> str:
        """The line for what a check sent."""
        hint = parse_hint(received)
        if hint.error is not None:
            return f"down #{hint.error}\n"
        if not hint.text:
            return host_line(self.rooms.apps(), self.stopping)
        return app_line(self.rooms.resolve(hint.text), hint.text, self.stopping)

    async def _check(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            received = await _hint(reader)
            try:
                line = self.answer(received)
            except Exception:  # a bug of ours: HAProxy hears "down" rather than nothing, and it is said
                log.exception("agent: answering %r failed", received[:80])
                line = "down #elasticd could not work out its answer\n"
            writer.write(line.encode("ascii", "replace"))
            await asyncio.wait_for(writer.drain(), _WRITE_WAIT)
        except (OSError, TimeoutError):
            pass  # the checker went away: the next check is a new connection
        finally:
            writer.close()


async def _hint(reader: asyncio.StreamReader) -> bytes:
    """What the checker sends within HINT_WAIT: up to its first newline (or more than a hint's length)."""
    received = b""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + HINT_WAIT
    while b"\n" not in received and len(received) <= MAX_HINT:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        try:
            chunk = await asyncio.wait_for(reader.read(MAX_HINT + 1), remaining)
        except TimeoutError:
            break
        if not chunk:
            break
        received += chunk
    return received
