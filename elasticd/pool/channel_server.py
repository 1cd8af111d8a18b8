"""TRANSPORT, elasticd's side: the channel sockets where workers announce themselves and push reports.

One socket per tenant, ``<runtime_dir>/workers/<tenant>/channel.sock``, in the tenant's own 0700 directory: no
other tenant can even connect to it. Framing is newline-delimited JSON (``elasticd.frames``): one object per
line, readable from any language, refusable line by line, and bounded (a line over ``MAX_LINE`` closes the
connection). Every connection starts with an announce ``{"type": "announce", "worker", "token", "pid",
"capabilities"}`` and is authenticated: the worker is the socket's tenant's, the token is the one elasticd gave
it, the peer's pid as the kernel reports it (``SO_PEERCRED``, not what the message claims) is inside that
worker's process tree, and for a tenant with a ``user:`` the peer's uid is that user's. So a worker can never
report for another, even one that learned its token. Then ``{"type": "occupancy", "report": {...}}`` lines
follow; nothing a peer sends can raise out of this module.

Every tenant is taken for hostile, and elasticd is shared by all of them, so everything a peer can make this
module do is bounded (``pool/pacing.py`` holds the numbers and the decisions):

- new connections per tenant socket (a rate), connections not yet announced (per peer uid and in all), and the
  time to announce (``ANNOUNCE_DEADLINE``); past any, the connection is closed;
- one live connection per worker (a reconnect replaces the old one), and its announces paced;
- reports at the rate the interval calls for, with slack: one over it is refused and *reading stops* until the
  next is due, so a flood fills the kernel's socket buffer and blocks its sender instead of costing elasticd a
  parse per line; unusable lines are refused and counted as strikes, and a connection that strikes out is closed;
- what elasticd queues for a peer on its own (ok, error replies) bounded: a peer that does not read is closed;
- an answer's bytes bounded by what its request allows (a move's package, the population's register).

Each refusal is counted in ``elasticd_channel_refused_total{tenant,app,reason}`` (the app is the authenticated
worker's; empty before an announce is accepted, never a name a peer chose) and logged once per peer per change of
reason (``elasticd/refusal_log.py``), never once per message.

elasticd also asks a worker things (``request``): for a live move, ``snapshot`` a user's package, ``install``
one, ``forget`` a user; for the population, ``monitor`` (its register of users). Each request carries an id,
its answer names it (``package``, ``installed``, ``register`` or ``refused``), and a package travels as raw
bytes after its line (``elasticd.frames``). An answer nobody waits for any more (its request timed out) is
refused; a connection that closes fails what was asked on it.
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
from collections.abc import Callable, Mapping
from typing import Any, Final

from elasticd.frames import MAX_LINE, MAX_PAYLOAD, FrameError, encode, payload_size
from elasticd.listeners import Listeners
from elasticd.pool.pacing import ANNOUNCE_DEADLINE, REPLY_BUFFER_BOUND, ConnectionBudget, Pacing, Unannounced
from elasticd.pool.report import Report, ReportError, parse_report
from elasticd.refusal_log import RefusalLog
from elasticd.worker_ids import parse_worker_id

__all__ = ["MAX_LINE", "REASONS", "ChannelError", "ChannelServer", "peer_credentials"]


# Tenants whose socket is looked at (a stat of its file) before the loop gets a turn, during ``serve``.
_STATS_A_TURN: Final = 256

log = logging.getLogger("elasticd.channel")

_ANSWERS = frozenset({"package", "installed", "refused", "register"})

# Every reason a refusal is counted under (the metric's label values: a fixed set, never a peer's words).
REASONS: Final = (
    "too-many-connections",  # past the tenant socket's rate of new connections: accepting paused (once a pause)
    "accept-failed",  # accept() itself failed (out of descriptors): accepting paused a moment
    "too-many-unannounced",  # past the bound of connections that have not announced (per uid, in all)
    "announce-timeout",  # no announce within ANNOUNCE_DEADLINE
    "announce-refused",  # the announce failed authentication (or was no announce)
    "announce-too-often",  # the worker announced faster than its allowance
    "too-long",  # a line over MAX_LINE
    "not-json",
    "not-object",
    "unknown-type",
    "bad-report",  # an occupancy report of the wrong shape
    "too-fast",  # a report over the worker's pace
    "unexpected-answer",  # an answer to nothing asked (or asked of another worker, or timed out)
    "bad-payload",  # a byte count that is no count, or bytes after a message that carries none
    "answer-too-big",  # an answer's bytes over what its request allows
    "struck-out",  # too many unusable lines: the connection is closed
    "not-reading",  # elasticd's replies piled up unread: the connection is closed
)


class ChannelError(Exception):
    """A request to a worker could not be answered: it has no channel connection, or it closed meanwhile."""


_UCRED = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}

# (the socket's tenant, worker_id, token, peer pid, peer uid) → None when accepted, else the reason for the refusal
Authenticate = Callable[[str, str, str, int, int], str | None]


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


class _Closing(Exception):
    """The connection is to be closed, for this refusal (counted and logged by whoever catches it)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


class _Pending:
    __slots__ = ("answered", "limit", "worker_id")

    def __init__(self, worker_id: str, answered: asyncio.Future[tuple[dict[str, Any], bytes | None]],
                 limit: int) -> None:
        self.worker_id = worker_id
        self.answered = answered
        self.limit = limit  # the most bytes its answer may carry


class _Listener:
    """One tenant's listening socket, accepted from at a bounded rate (``ConnectionBudget``)."""

    __slots__ = ("budget", "inode", "path", "resume", "sock", "tenant")

    def __init__(self, tenant: str, path: str, sock: socket.socket, inode: int, budget: ConnectionBudget) -> None:
        self.tenant = tenant
        self.path = path
        self.sock = sock
        self.inode = inode  # the socket file this listener bound (to see it replaced or removed)
        self.budget = budget
        self.resume: asyncio.TimerHandle | None = None  # set while accepting is paused


class ChannelServer:
    __slots__ = ("_accepts", "_authenticate", "_capabilities", "_clock", "_connections", "_interval", "_listeners",
                 "_log", "_next_id", "_on_report", "_pacing", "_peers", "_pending", "_refused", "_serving",
                 "_unannounced", "listeners", "runtime_dir")

    def __init__(self, runtime_dir: str, authenticate: Authenticate,
                 on_report: Callable[[str, Report, float], None], *, interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, listeners: Listeners | None = None) -> None:
        self.runtime_dir = runtime_dir
        # Where each tenant's listening socket is held ("channel:<tenant>"): it outlives a re-exec in place, so the
        # workers' libraries reconnect to it rather than being refused; and the socket files' inodes it was
        # bound at, passed on with them (a tenant may replace the file in its own directory meanwhile).
        self.listeners = listeners if listeners is not None else Listeners()
        self._authenticate = authenticate
        self._on_report = on_report
        self._interval = interval
        self._clock = clock
        self._listeners: dict[str, _Listener] = {}  # per tenant
        self._connections: dict[str, _Peer] = {}  # the live connection of each announced worker
        self._capabilities: dict[str, frozenset[str]] = {}  # what each connected worker announced
        self._pending: dict[int, _Pending] = {}  # by request id
        self._next_id = 0
        self._pacing: dict[str, Pacing] = {}  # per worker that announced, until it exits
        self._accepts: dict[str, ConnectionBudget] = {}  # per tenant socket
        self._unannounced = Unannounced()
        self._refused: dict[tuple[str, str, str], int] = {}  # (tenant, app, reason) → count
        self._peers: set[_Peer] = set()  # every connection open, announced or not
        self._serving: set[asyncio.Task[Any]] = set()  # their tasks, for a stop to wait on
        self._log = RefusalLog()

    # ------------------------------------------------------------------ views

    def capabilities(self, worker_id: str) -> frozenset[str]:
        """What the worker's library announced it can do, remembered while it reconnects (a move then waits
        for it or fails, rather than being taken for a worker without the library); empty before its first
        announce, and again once ``forget`` (the worker exited)."""
        return self._capabilities.get(worker_id, frozenset())

    def refusals(self) -> dict[tuple[str, str, str], int]:
        """Refusals so far by (tenant, app, reason): ``elasticd_channel_refused_total``."""
        return dict(self._refused)

    def connected(self) -> int:
        """Connections open: announced ones, and those still expected to announce."""
        return len(self._connections) + self._unannounced.total

    def path(self, tenant: str) -> str | None:
        listener = self._listeners.get(tenant)
        return listener.path if listener is not None else None

    # ------------------------------------------------------------------ the daemon's calls

    def forget(self, worker_id: str) -> None:
        """The worker's process is gone: a new one announces afresh (its allowances too)."""
        self._capabilities.pop(worker_id, None)
        self._pacing.pop(worker_id, None)
        self._log.forget(worker_id)

    def configure(self, interval: float) -> None:
        """A reload's occupancy interval: each worker's pace follows it from now."""
        if interval == self._interval:
            return
        self._interval = interval
        now = self._clock()
        for pacing in self._pacing.values():
            pacing.reconfigure(interval, now)

    async def serve(self, tenants: Mapping[str, str], inodes: Mapping[str, int] | None = None) -> list[str]:
        """Listen on each tenant's socket (tenant → path), stop listening for tenants no longer given; a socket
        file that is gone or was replaced (it is in the tenant's own directory) is bound afresh. Returns the
        problems (a tenant whose socket cannot be made is said, and the others are served)."""
        problems = []
        for tenant in [t for t in self._listeners if t not in tenants]:
            await self._close_listener(tenant)
        for n, (tenant, path) in enumerate(tenants.items(), 1):
            if not n % _STATS_A_TURN:
                await asyncio.sleep(0)  # (a stat per tenant: 2,000 of them held the front's loop ~14 ms a reload)
            listener = self._listeners.get(tenant)
            if listener is not None and listener.path == path and _inode(path) == listener.inode:
                continue
            if listener is not None:
                await self._close_listener(tenant)
            try:
                self._listeners[tenant] = await self._listen(tenant, path, (inodes or {}).get(tenant))
            except OSError as exc:
                problems.append(f"tenant {tenant}: its channel socket {path} cannot be made: {exc}")
        return problems

    async def stop(self) -> None:
        # Listeners first (nothing new comes), then every connection, then the tasks that served them (one may be
        # pacing a flood, asleep: cancelled, and waited for, so none is left for the loop's end to cancel).
        for tenant in list(self._listeners):
            await self._close_listener(tenant)
        for peer in list(self._peers):
            peer.writer.transport.abort()
        serving = [task for task in self._serving if not task.done()]
        for task in serving:
            task.cancel()
        if serving:
            await asyncio.wait(serving, timeout=1.0)

    async def request(self, worker_id: str, message: dict[str, Any], timeout: float,
                      payload: bytes | None = None, *, answer_limit: int = MAX_PAYLOAD,
                      ) -> tuple[dict[str, Any], bytes | None]:
        """Send ``message`` (and ``payload``) to the worker and wait, at most ``timeout`` seconds, for the
        answer that names it: (the answer, its payload, at most ``answer_limit`` bytes). TimeoutError, or
        ChannelError when the worker has no connection, it closed before answering, or its answer was too big.
        A worker that did not read the request within the timeout is taken for one that does not read: its
        connection is closed."""
        peer = self._connections.get(worker_id)
        if peer is None or peer.writer.is_closing():
            raise ChannelError(f"{worker_id} has no channel connection")
        writer = peer.writer
        self._next_id += 1
        request_id = self._next_id
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[tuple[dict[str, Any], bytes | None]] = loop.create_future()
        self._pending[request_id] = _Pending(worker_id, answered, answer_limit)
        deadline = loop.time() + timeout  # one deadline for the send and the answer together
        try:
            writer.write(encode({**message, "id": request_id}, payload))
            try:
                await asyncio.wait_for(writer.drain(), timeout)
            except TimeoutError:
                self._refuse(peer, "not-reading",
                             f"it did not read a request of {len(payload or b'')} bytes within {timeout:g}s")
                writer.transport.abort()
                raise
            return await asyncio.wait_for(answered, max(deadline - loop.time(), 0.0))
        except ConnectionError as exc:
            raise ChannelError(f"{worker_id}'s channel closed: {exc}") from None
        finally:
            self._pending.pop(request_id, None)
            # A close can answer the future (ChannelError) while the send still waits on drain(): that send's own
            # error is what the caller gets, and the future's is read here, or asyncio logs it as never retrieved.
            if answered.done() and not answered.cancelled():
                answered.exception()
            else:
                answered.cancel()

    def tell(self, worker_id: str, message: dict[str, Any]) -> bool:
        """Send a message that has no answer (``forget``); False when the worker has no connection."""
        peer = self._connections.get(worker_id)
        if peer is None or peer.writer.is_closing():
            return False
        self._reply(peer, message)
        return not peer.writer.is_closing()

    # ------------------------------------------------------------------ listening

    def inodes(self) -> dict[str, int]:
        """Each tenant's socket file's inode when it was bound (a re-exec passes them on)."""
        return {tenant: listener.inode for tenant, listener in self._listeners.items()}

    async def _listen(self, tenant: str, path: str, inode: int | None = None) -> _Listener:
        """Bind the socket where only root may write (the runtime directory), give it its mode there, then move
        it into the tenant's directory: binding or chmod-ing in a directory the tenant owns would let it swap the
        path for a symlink in between (chmod follows one), and elasticd runs as root."""
        name = f"channel:{tenant}"
        staged = os.path.join(self.runtime_dir, f".channel.{tenant}.sock")
        # (bound at ``staged``, then renamed: that is the name the kernel keeps for it; the inode says it is still
        # the file at ``path``)
        inherited = self.listeners.take_unix(name, path, bound_at=staged, shared=True)
        if inherited is not None:
            if inode is not None and _inode(path) == inode:
                return self._watch(tenant, path, inherited, inode)
            self.listeners.release(name)  # its file was replaced or removed meanwhile: bound afresh
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)  # (the supervisor gives it to the tenant)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staged)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(staged)
            os.chmod(staged, 0o666)  # the directory it goes into is the guard: only the tenant's user enters it
            os.rename(staged, path)
            inode = os.lstat(path).st_ino
            sock.setblocking(False)
            sock.listen(_BACKLOG)
        except BaseException:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged)
            raise
        return self._watch(tenant, path, self.listeners.hold(name, sock, shared=True), inode)

    def _watch(self, tenant: str, path: str, sock: socket.socket, inode: int) -> _Listener:
        budget = self._accepts.get(tenant)
        if budget is None:  # (kept across a re-listen: removing the socket file refills nothing)
            budget = self._accepts[tenant] = ConnectionBudget(self._clock())
        listener = _Listener(tenant, path, sock, inode, budget)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._acceptable, listener)
        return listener

    def _acceptable(self, listener: _Listener) -> None:
        """The listening socket has connections waiting: accept them while the tenant's budget allows, then stop
        watching it until the next is due. The ones over it wait in the kernel's backlog, and when that is full a
        connect() fails in the sender: a tenant reconnecting in a loop costs elasticd no accept, no descriptor,
        no task (a budget that closed each connection at once still cost an accept and a close: the hostile
        worker made thousands a second, and the neighbour lost half its throughput)."""
        loop = asyncio.get_running_loop()
        while True:
            wait = listener.budget.accept(self._clock())
            if wait > 0.0:
                loop.remove_reader(listener.sock.fileno())
                listener.resume = loop.call_later(wait, self._resume, listener)
                self._refuse_unannounced(listener.tenant, "too-many-connections",
                                         f"tenant {listener.tenant}'s channel takes new connections at a bounded "
                                         "rate: the next ones wait in the kernel's backlog")
                return
            try:
                conn, _ = listener.sock.accept()
            except (BlockingIOError, InterruptedError):
                listener.budget.unused()
                return
            except OSError as exc:  # out of descriptors (EMFILE, ENFILE) or memory: try again in a moment
                loop.remove_reader(listener.sock.fileno())
                listener.resume = loop.call_later(_ACCEPT_RETRY, self._resume, listener)
                self._refuse_unannounced(listener.tenant, "accept-failed", f"accept() failed: {exc}")
                return
            conn.setblocking(False)
            task = loop.create_task(self._accepted(listener.tenant, conn))
            self._serving.add(task)
            task.add_done_callback(self._serving.discard)

    def _resume(self, listener: _Listener) -> None:
        listener.resume = None
        if self._listeners.get(listener.tenant) is listener:
            asyncio.get_running_loop().add_reader(listener.sock.fileno(), self._acceptable, listener)

    async def _accepted(self, tenant: str, conn: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(sock=conn, limit=MAX_LINE)
        except OSError:
            conn.close()
            return
        await self._serve(tenant, reader, writer)

    async def _close_listener(self, tenant: str) -> None:
        listener = self._listeners.pop(tenant)
        if listener.resume is not None:
            listener.resume.cancel()
        else:
            asyncio.get_running_loop().remove_reader(listener.sock.fileno())
        self.listeners.release(f"channel:{tenant}")  # (listener.sock is the held socket itself: closed there)
        # Only our own socket file: the directory is the tenant's, and the name may hold something else by now.
        if _inode(listener.path) == listener.inode:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(listener.path)
        # (The connections it accepted stay: the tenant's draining workers keep theirs until they go.)

    # ------------------------------------------------------------------ one connection

    async def _serve(self, tenant: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _Peer(tenant, writer)
        self._peers.add(peer)
        try:
            if await self._admit(peer, reader):
                await self._read_messages(peer, reader)
        except _Closing as closing:
            self._refuse(peer, closing.reason, closing.detail)
            self._reply(peer, {"type": "error", "reason": f"{closing}: closing"})
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # a peer must never take the daemon down; this is a bug of ours, so say so loudly
            log.exception("channel: unexpected error serving %s", peer.name)
        finally:
            worker_id = peer.worker_id
            if worker_id is not None and self._connections.get(worker_id) is peer:
                del self._connections[worker_id]
                for pending in list(self._pending.values()):
                    if pending.worker_id == worker_id and not pending.answered.done():
                        pending.answered.set_exception(
                            ChannelError(f"{worker_id}'s channel closed before it answered"))
            self._peers.discard(peer)
            _close(writer)

    async def _admit(self, peer: _Peer, reader: asyncio.StreamReader) -> bool:
        """The bounds before an announce, then the announce: True once the peer is a worker, accepted."""
        credentials = peer_credentials(peer.writer)
        if credentials is None:
            raise _Closing("announce-refused", "the peer's credentials cannot be read")
        pid, peer.uid = credentials
        crowded = self._unannounced.enter(peer.tenant, peer.uid)
        if crowded is not None:
            raise _Closing("too-many-unannounced", crowded)
        try:
            return await asyncio.wait_for(self._announce(peer, pid, reader), ANNOUNCE_DEADLINE)
        except TimeoutError:
            raise _Closing("announce-timeout", f"no announce within {ANNOUNCE_DEADLINE:g}s") from None
        finally:
            self._unannounced.leave(peer.tenant, peer.uid)

    async def _announce(self, peer: _Peer, pid: int, reader: asyncio.StreamReader) -> bool:
        message = await _next_message(reader)
        if message is None:
            return False
        worker_id = message.get("worker") if isinstance(message, dict) else None
        token = message.get("token") if isinstance(message, dict) else None
        if not isinstance(message, dict) or message.get("type") != "announce" or not isinstance(worker_id, str) \
                or not isinstance(token, str):
            raise _Closing("announce-refused",
                           'the first message must be {"type": "announce", "worker": ..., "token": ...}')
        now = self._clock()
        pacing = self._pacing.get(worker_id)  # (only for workers that did announce: never for a made-up id)
        if pacing is not None and not pacing.announce(now):
            raise _Closing("announce-too-often", f"worker {worker_id} announces more often than its allowance "
                                                 f"(one every {pacing.interval:g}s after the first few)")
        reason = self._authenticate(peer.tenant, worker_id, token, pid, peer.uid)
        if reason is not None:
            raise _Closing("announce-refused", f"pid {pid} announcing as {worker_id[:80]!r}: {reason}")
        if pacing is None:
            pacing = self._pacing[worker_id] = Pacing(self._interval, now)
            pacing.announce(now)
        peer.accepted(worker_id, pacing)
        previous = self._connections.get(worker_id)
        if previous is not None and previous is not peer:
            _close(previous.writer)  # a worker reconnecting replaces its old connection
        self._connections[worker_id] = peer
        announced = message.get("capabilities")
        capabilities = frozenset(c for c in announced if isinstance(c, str) and len(c) <= 32) \
            if isinstance(announced, list) else frozenset()
        first = worker_id not in self._capabilities
        self._capabilities[worker_id] = capabilities
        self._reply(peer, {"type": "ok"})
        # Once per process, not once per reconnect: a worker that reconnects in a loop is paced, and not said.
        log.log(logging.INFO if first else logging.DEBUG, "channel: worker %s announced (pid %s, capabilities %s)",
                worker_id, pid, sorted(capabilities))
        return True

    async def _read_messages(self, peer: _Peer, reader: asyncio.StreamReader) -> None:
        pacing = peer.pacing
        assert pacing is not None  # (accepted)
        while True:
            message = await _next_message(reader)
            if message is None:
                return
            now = self._clock()
            if isinstance(message, str):  # an unusable line: refused, a strike
                self._struck(peer, message, _UNUSABLE[message], now)
                continue
            try:
                size = payload_size(message)
            except FrameError as exc:
                raise _Closing("bad-payload", str(exc)) from None
            kind = message.get("type")
            if kind in _ANSWERS:
                await self._answer(peer, message, size, reader, now)
                continue
            if size is not None:  # bytes after a line that carries none: they cannot be skipped unread
                raise _Closing("bad-payload", f"a {str(kind)[:40]!r} message carries no bytes")
            if kind != "occupancy":
                self._struck(peer, "unknown-type", f"unknown message type {str(kind)[:40]!r}", now)
                continue
            wait = pacing.report(now)
            if wait > 0.0:
                self._refuse(peer, "too-fast", f"reports come faster than the interval ({pacing.interval:g}s) "
                                               "calls for")
                self._reply(peer, {"type": "error", "reason": f"report refused: one every {pacing.interval:g}s"})
                # Nothing more of this peer is read until its next report is due: its flood waits in its own
                # socket buffer, and then in its own write().
                await asyncio.sleep(wait)
                continue
            try:
                report = parse_report(message.get("report"))
            except ReportError as exc:
                self._struck(peer, "bad-report", f"report refused: {exc}", now)
                continue
            try:
                self._on_report(peer.worker_id or "", report, now)
            except Exception:  # a bug of ours in the pool must not cut the channel (it would reconnect, and fail)
                log.exception("channel: the pool failed on a report of %s", peer.name)

    async def _answer(self, peer: _Peer, message: dict[str, Any], size: int | None, reader: asyncio.StreamReader,
                      now: float) -> None:
        request_id = message.get("id")
        pending = self._pending.get(request_id) if isinstance(request_id, int) else None
        if pending is None or pending.worker_id != peer.worker_id or pending.answered.done():
            unasked = f"an answer to a request it was not asked (or no longer waited for): {str(request_id)[:40]}"
            if size:
                raise _Closing("unexpected-answer", f"{unasked}, with {size} bytes")
            self._struck(peer, "unexpected-answer", unasked, now)
            return
        if size is not None and size > pending.limit:
            error = ChannelError(f"{peer.worker_id}'s answer of {size} bytes is over the {pending.limit} allowed")
            pending.answered.set_exception(error)
            raise _Closing("answer-too-big", str(error))
        payload = await reader.readexactly(size) if size is not None else None
        if not pending.answered.done():  # (its requester may have given up while the bytes came)
            pending.answered.set_result((message, payload))

    # ------------------------------------------------------------------ refusals

    def _struck(self, peer: _Peer, reason: str, detail: str, now: float) -> None:
        self._refuse(peer, reason, detail)
        assert peer.pacing is not None  # (only an accepted worker has strikes; before, one bad line closes)
        if peer.pacing.strike(now):
            raise _Closing("struck-out", "too many unusable lines")
        self._reply(peer, {"type": "error", "reason": detail})

    def _refuse(self, peer: _Peer, reason: str, detail: str) -> None:
        """Count a refusal, and say it when ``RefusalLog`` says it is worth a line."""
        self._count(peer.tenant, peer.app, peer.log_key, peer.name, reason, detail)

    def _refuse_unannounced(self, tenant: str, reason: str, detail: str) -> None:
        """A refusal of whoever connects to ``tenant``'s socket, before any connection is accepted."""
        self._count(tenant, "", f"{tenant} socket", f"connections to tenant {tenant}'s channel", reason, detail)

    def _count(self, tenant: str, app: str, log_key: str, name: str, reason: str, detail: str) -> None:
        key = (tenant, app, reason)
        self._refused[key] = self._refused.get(key, 0) + 1
        saying = self._log.note(log_key, reason, self._clock())
        if saying is None:
            return
        unsaid = f" ({saying.unsaid} refusals not logged since, the last for {saying.previous})" \
            if saying.unsaid else ""
        log.warning("channel: refused %s (%s): %s%s", name, reason, detail, unsaid)

    def _reply(self, peer: _Peer, message: dict[str, Any]) -> None:
        """Queue a message elasticd sends on its own; a peer that let too many of them pile up is closed."""
        writer = peer.writer
        if writer.is_closing():
            return
        if writer.transport.get_write_buffer_size() > REPLY_BUFFER_BOUND:
            self._refuse(peer, "not-reading", f"over {REPLY_BUFFER_BOUND} bytes of elasticd's replies wait unread")
            writer.transport.abort()  # (a close would wait for the peer to read what is queued: forever)
            return
        writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")


class _Peer:
    """One connection: its tenant (the socket's), its uid (the kernel's), and once its announce is accepted, its
    worker (the app label and the log's key come from that, never from what a peer merely claimed)."""

    __slots__ = ("app", "pacing", "tenant", "uid", "worker_id", "writer")

    def __init__(self, tenant: str, writer: asyncio.StreamWriter) -> None:
        self.tenant = tenant
        self.writer = writer
        self.uid = -1
        self.worker_id: str | None = None
        self.app = ""
        self.pacing: Pacing | None = None

    def accepted(self, worker_id: str, pacing: Pacing) -> None:
        self.worker_id = worker_id
        parts = parse_worker_id(worker_id)
        self.app = parts.app if parts is not None else ""
        self.pacing = pacing

    @property
    def name(self) -> str:
        return f"worker {self.worker_id}" if self.worker_id is not None else \
            f"a peer (uid {self.uid}) of tenant {self.tenant}'s channel"

    @property
    def log_key(self) -> str:
        return self.worker_id if self.worker_id is not None else f"{self.tenant} uid {self.uid}"


_BACKLOG = 64  # connections the kernel holds for a tenant's socket while its accepts are paused
_ACCEPT_RETRY = 0.1  # seconds before accepting again after accept() itself failed

_UNUSABLE = {"not-json": "not JSON", "not-object": "a message must be a JSON object"}


async def _next_message(reader: asyncio.StreamReader) -> dict[str, Any] | str | None:
    """The next message; a reason (``not-json``, ``not-object``) for a line that is none; None at the end of the
    stream. A line over ``MAX_LINE`` cannot be framed: _Closing."""
    try:
        line = await reader.readline()
    except (ValueError, asyncio.LimitOverrunError):
        raise _Closing("too-long", f"a line longer than {MAX_LINE} bytes") from None
    if not line.endswith(b"\n"):
        return None  # the end of the stream (maybe mid-line)
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, ValueError):
        return "not-json"
    if not isinstance(message, dict):
        return "not-object"
    return message


def _close(writer: asyncio.StreamWriter) -> None:
    """Close once what is queued is sent; at once when the peer has left it unread (a graceful close would wait
    for a peer that never reads, holding the descriptor for good)."""
    if writer.transport.get_write_buffer_size():
        writer.transport.abort()
    else:
        writer.close()


def _inode(path: str) -> int | None:
    try:
        return os.lstat(path).st_ino
    except OSError:
        return None
