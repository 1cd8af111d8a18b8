"""TRANSPORT, elasticd's side: the channel socket where workers announce themselves and push reports.

Framing is newline-delimited JSON: one object per line, readable from any language, refusable line by line,
and bounded (a line over ``MAX_LINE`` closes the connection). Every connection starts with an announce
``{"type": "announce", "worker", "token", "pid", "capabilities"}`` and is authenticated twice: the token
elasticd gave that worker, and the peer's pid as the kernel reports it (``SO_PEERCRED``, not what the
message claims) inside that worker's process tree; for a tenant with a ``user:``, the peer's uid must be that
user's too. So a worker can never report for another, even one that learned its token. Then
``{"type": "occupancy", "report": {...}}`` lines follow; a malformed one is refused with a reason and the
connection stays; nothing a peer sends can raise out of this module.

elasticd also asks a worker things (``request``): for a live move, ``snapshot`` a user's package, ``install``
one, ``forget`` a user; for the population, ``monitor`` (its register of users). Each request carries an id,
its answer names it (``package``, ``installed``, ``register`` or ``refused``), and a package travels as raw
bytes after its line (``elasticd.frames``). An answer nobody waits
for any more (its request timed out) is dropped; a connection that closes fails what was asked on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from elasticd.frames import MAX_LINE, FrameError, encode, payload_size
from elasticd.pool.report import Report, ReportError, parse_report

__all__ = ["MAX_LINE", "ChannelError", "ChannelServer", "peer_credentials"]

log = logging.getLogger("elasticd.channel")

_ANSWERS = frozenset({"package", "installed", "refused", "register"})


class ChannelError(Exception):
    """A request to a worker could not be answered: it has no channel connection, or it closed meanwhile."""
_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}

# (worker_id, token, peer pid, peer uid) → None when accepted, else the reason for the refusal
Authenticate = Callable[[str, str, int, int], str | None]


def peer_credentials(writer: asyncio.StreamWriter) -> tuple[int, int] | None:
    """(pid, uid) of the peer as the kernel saw it connect (SO_PEERCRED), never what a message claims."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return None
    try:
        pid, uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return pid, uid


class ChannelServer:
    __slots__ = ("_authenticate", "_capabilities", "_clock", "_connections", "_next_id", "_on_report", "_pending",
                 "_server", "path")

    def __init__(self, path: str, authenticate: Authenticate, on_report: Callable[[str, Report, float], None], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._authenticate = authenticate
        self._on_report = on_report
        self._clock = clock
        self._server: asyncio.base_events.Server | None = None
        self._connections: dict[str, asyncio.StreamWriter] = {}
        self._capabilities: dict[str, frozenset[str]] = {}  # what each connected worker announced
        # request id → (the worker asked, the future its answer resolves)
        self._pending: dict[int, tuple[str, asyncio.Future[tuple[dict[str, Any], bytes | None]]]] = {}
        self._next_id = 0

    def capabilities(self, worker_id: str) -> frozenset[str]:
        """What the worker's library announced it can do, remembered while it reconnects (a move then waits
        for it or fails, rather than being taken for a worker without the library); empty before its first
        announce, and again once ``forget`` (the worker exited)."""
        return self._capabilities.get(worker_id, frozenset())

    def forget(self, worker_id: str) -> None:
        self._capabilities.pop(worker_id, None)

    async def request(self, worker_id: str, message: dict[str, Any], timeout: float,
                      payload: bytes | None = None) -> tuple[dict[str, Any], bytes | None]:
        """Send ``message`` (and ``payload``) to the worker and wait, at most ``timeout`` seconds, for the
        answer that names it: (the answer, its payload). TimeoutError, or ChannelError when the worker has no
        connection or it closed before answering."""
        writer = self._connections.get(worker_id)
        if writer is None or writer.is_closing():
            raise ChannelError(f"{worker_id} has no channel connection")
        self._next_id += 1
        request_id = self._next_id
        answered: asyncio.Future[tuple[dict[str, Any], bytes | None]] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (worker_id, answered)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout  # one deadline for the send and the answer together
        try:
            writer.write(encode({**message, "id": request_id}, payload))
            await asyncio.wait_for(writer.drain(), timeout)
            return await asyncio.wait_for(answered, max(deadline - loop.time(), 0.0))
        except ConnectionError as exc:
            raise ChannelError(f"{worker_id}'s channel closed: {exc}") from None
        finally:
            self._pending.pop(request_id, None)

    def tell(self, worker_id: str, message: dict[str, Any]) -> bool:
        """Send a message that has no answer (``forget``); False when the worker has no connection."""
        writer = self._connections.get(worker_id)
        if writer is None or writer.is_closing():
            return False
        _send_nowait(writer, message)
        return True

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_LINE)
        # Workers run as other users once per-tenant users land; the token and SO_PEERCRED are the guard.
        os.chmod(self.path, 0o666)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections.values()):
                writer.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        worker_id = None
        try:
            worker_id = await self._handshake(reader, writer)
            if worker_id is None:
                return
            while True:
                message = await self._read(reader, writer)
                if message is None:
                    return
                try:
                    size = payload_size(message)
                except FrameError as exc:
                    await _send(writer, {"type": "error", "reason": f"{exc}: closing"})
                    return
                payload = await reader.readexactly(size) if size is not None else None
                self._dispatch(worker_id, message, payload, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a peer must never take the daemon down; this is a bug of ours, so say so loudly
            log.exception("channel: unexpected error serving %s", worker_id or "an unannounced peer")
        finally:
            if worker_id is not None and self._connections.get(worker_id) is writer:
                del self._connections[worker_id]
                for asked, answered in list(self._pending.values()):
                    if asked == worker_id and not answered.done():
                        answered.set_exception(ChannelError(f"{worker_id}'s channel closed before it answered"))
            writer.close()

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> dict[str, Any] | None:
        """The next message; None at the end of the stream or when the line cannot be framed."""
        while True:
            try:
                line = await reader.readline()
            except (ValueError, asyncio.LimitOverrunError):
                await _send(writer, {"type": "error", "reason": f"line longer than {MAX_LINE} bytes: closing"})
                return None
            if not line:
                return None
            try:
                message = json.loads(line)
            except (UnicodeDecodeError, ValueError) as exc:
                await _send(writer, {"type": "error", "reason": f"not JSON: {exc}"})
                continue
            if not isinstance(message, dict):
                await _send(writer, {"type": "error", "reason": "a message must be a JSON object"})
                continue
            return message

    async def _handshake(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> str | None:
        credentials = peer_credentials(writer)
        pid = credentials[0] if credentials is not None else None
        message = await self._read(reader, writer)
        if message is None:
            return None
        worker_id, token = message.get("worker"), message.get("token")
        reason: str | None
        if message.get("type") != "announce" or not isinstance(worker_id, str) or not isinstance(token, str):
            reason = 'the first message must be {"type": "announce", "worker": ..., "token": ...}'
        elif credentials is None:
            reason = "the peer's credentials cannot be read"
        else:
            reason = self._authenticate(worker_id, token, *credentials)
        if reason is not None:
            log.warning("channel: refused a peer (pid %s) announcing as %r: %s", pid, worker_id, reason)
            await _send(writer, {"type": "error", "reason": reason})
            return None
        assert isinstance(worker_id, str)  # an announce without a string id has a reason above
        previous = self._connections.get(worker_id)
        if previous is not None and previous is not writer:
            previous.close()  # a worker reconnecting replaces its old connection
        self._connections[worker_id] = writer
        announced = message.get("capabilities")
        self._capabilities[worker_id] = frozenset(c for c in announced if isinstance(c, str)) \
            if isinstance(announced, list) else frozenset()
        await _send(writer, {"type": "ok"})
        log.info("channel: worker %s announced (pid %s, capabilities %s)", worker_id, pid,
                 message.get("capabilities"))
        return worker_id

    def _dispatch(self, worker_id: str, message: dict[str, Any], payload: bytes | None,
                  writer: asyncio.StreamWriter) -> None:
        kind = message.get("type")
        if kind in _ANSWERS:
            self._answered(worker_id, message, payload)
            return
        if kind != "occupancy":
            _send_nowait(writer, {"type": "error", "reason": f"unknown message type {kind!r}"})
            return
        try:
            report = parse_report(message.get("report"))
        except ReportError as exc:
            log.warning("channel: refused a report from %s: %s", worker_id, exc)
            _send_nowait(writer, {"type": "error", "reason": f"report refused: {exc}"})
            return
        try:
            self._on_report(worker_id, report, self._clock())
        except Exception:  # a bug of ours in the pool must not cut the channel (it would reconnect, and fail again)
            log.exception("channel: the pool failed on a report of %s", worker_id)


    def _answered(self, worker_id: str, message: dict[str, Any], payload: bytes | None) -> None:
        request_id = message.get("id")
        pending = self._pending.get(request_id) if isinstance(request_id, int) else None
        if pending is None or pending[0] != worker_id:  # timed out already, or not asked of this worker
            log.info("channel: %s answered request %r, which nobody waits for", worker_id, message.get("id"))
            return
        answered = pending[1]
        if not answered.done():
            answered.set_result((message, payload))


def _send_nowait(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    if not writer.is_closing():
        writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")


async def _send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    _send_nowait(writer, message)
    with contextlib.suppress(ConnectionError):
        await writer.drain()
