"""elasticd's side of systemd: sd_notify messages, the watchdog, and log lines journald understands.

Every notification is a no-op without ``NOTIFY_SOCKET``, so the daemon calls these unconditionally whether it
runs under systemd, in a test, or in a terminal.

The notification protocol is one datagram to ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract
namespace), which this module sends itself on a NON-BLOCKING socket. libsystemd's ``sd_notify`` (what pystemd
wraps) blocks when the receiver's queue is full — ``net.unix.max_dgram_qlen`` is 10 by default; systemd
raises it for PID 1, but any reader that falls behind will do — and pystemd calls it holding the GIL: the
daemon's whole event loop froze there, and never handled the SIGTERM that followed (found by the stop stress
test, with a harness that reads the socket only now and then). Here a full queue costs a retry instead:
READY/RELOADING/STOPPING wait in order and are retried from the event loop every ``_RETRY`` seconds; a STATUS
or WATCHDOG message waiting is replaced by the next of its kind (only the latest one matters).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Final

from elasticd.background import watch

if TYPE_CHECKING:
    from elasticd.listeners import Listeners

__all__ = ["Notifier", "forget_stored", "listen_fds", "notify_address", "setup_logging", "stderr_is_journal",
           "store_listeners"]

log = logging.getLogger("elasticd.systemd")

_RETRY = 0.05  # seconds between two tries to deliver what a full queue refused
_MAX_PENDING = 64  # messages that must not be dropped, waiting; past it the oldest go (with a warning)
_LATEST_ONLY = ("STATUS=", "WATCHDOG=1")  # a message made only of these is superseded by the next one


def notify_address(value: str | None) -> str | None:
    """``$NOTIFY_SOCKET`` as an AF_UNIX address: a path, or ``@name`` → the abstract name (a leading NUL)."""
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    return value if value.startswith("/") else None


def _kind(message: bytes) -> bytes | None:
    """The kind a message supersedes others of (None: it must be delivered)."""
    lines = message.split(b"\n")
    if all(line.startswith(b"STATUS=") for line in lines):
        return b"STATUS"
    if lines == [b"WATCHDOG=1"]:
        return b"WATCHDOG"
    return None


class _Datagrams:
    """The one non-blocking socket to $NOTIFY_SOCKET, and what waits for room in its queue."""

    __slots__ = ("loop", "pending", "sock", "timer", "warned")

    def __init__(self) -> None:
        self.sock: socket.socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: list[tuple[str, bytes]] = []  # (address, message), in order
        self.timer: asyncio.TimerHandle | None = None
        self.warned = False

    def send(self, address: str, message: bytes) -> None:
        if self.pending:  # in order: behind what already waits; the armed retry delivers it
            self._queue(address, message)
            self._schedule()
            return
        if not self._try(address, message):
            self._queue(address, message)
            self._schedule()

    def _try(self, address: str, message: bytes) -> bool:
        """True when done with (sent, or refused for good and said so); False when the queue is full."""
        try:
            if self.sock is None:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK
                                          | socket.SOCK_CLOEXEC)
            self.sock.sendto(message, address)
        except BlockingIOError:
            return False
        except OSError as exc:  # a notification must never take the daemon down
            if not self.warned:
                log.warning("cannot notify systemd at %s: %s", address.replace("\0", "@"), exc)
                self.warned = True
            return True
        self.warned = False
        return True

    def _queue(self, address: str, message: bytes) -> None:
        kind = _kind(message)
        if kind is not None:
            self.pending = [(a, m) for a, m in self.pending if _kind(m) != kind]
        self.pending.append((address, message))
        if len(self.pending) > _MAX_PENDING:
            dropped = self.pending.pop(0)
            log.warning("systemd is not reading its notify socket: dropped %r", dropped[1][:60])

    def _flush(self) -> None:
        self.timer = None  # only the retry timer calls this: one armed at a time
        while self.pending:
            address, message = self.pending[0]
            if not self._try(address, message):
                self._schedule()
                return
            self.pending.pop(0)

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): what cannot go now is dropped, said once
            log.warning("systemd's notify socket is full: not sent: %r", [m[:60] for _, m in self.pending])
            self.pending.clear()
            return
        if self.timer is not None and self.loop is loop:
            return  # one retry armed at a time (one armed on a loop since closed is forgotten)
        self.loop = loop
        self.timer = loop.call_later(_RETRY, self._flush)


_datagrams = _Datagrams()


class Notifier:
    __slots__ = ("_watchdog_task",)

    def __init__(self) -> None:
        self._watchdog_task: asyncio.Task[None] | None = None

    @staticmethod
    def send(*states: str) -> None:
        address = notify_address(os.environ.get("NOTIFY_SOCKET"))
        if address is None:
            return
        _datagrams.send(address, "\n".join(states).encode())

    @staticmethod
    def pending() -> int:
        """Messages waiting for room in systemd's queue (tests, and a stuck PID 1 is worth seeing)."""
        return len(_datagrams.pending)

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def reloading(self) -> None:
        # MONOTONIC_USEC lets systemd ≥ 253 tell this reload from an earlier one; older ones ignore it.
        self.send("RELOADING=1", f"MONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")

    def stopping(self) -> None:
        self.send("STOPPING=1")

    def start_watchdog(self) -> None:
        interval = watchdog_interval(os.environ, os.getpid())
        if interval is not None and self._watchdog_task is None:
            self._watchdog_task = watch(asyncio.create_task(self._watchdog(interval), name="watchdog"), log,
                                        "the systemd watchdog ping")

    async def stop_watchdog(self) -> None:
        if self._watchdog_task is not None:
            self._watchdog_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog_task
            self._watchdog_task = None

    async def _watchdog(self, interval: float) -> None:
        # Sent from the event loop itself: if the loop is stuck, the pings stop and systemd acts.
        while True:
            self.send("WATCHDOG=1")
            await asyncio.sleep(interval)


def watchdog_interval(environ: os._Environ[str] | dict[str, str], pid: int) -> float | None:
    """Half of WATCHDOG_USEC, when the watchdog is enabled for this very process."""
    usec = environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    owner = environ.get("WATCHDOG_PID")
    if owner and owner != str(pid):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1_000_000 if value > 0 else None


# ---------------------------------------------------------------------- the file-descriptor store
#
# systemd keeps descriptors a service hands it (``FDSTORE=1`` with the descriptors attached, ``FileDescriptorStoreMax=``
# in the unit) across a restart of the service, and passes them to the next start as sd_listen_fds(3) describes
# (``LISTEN_FDS``, ``LISTEN_FDNAMES``, from descriptor 3). elasticd stores its listening sockets there: during a
# ``systemctl restart`` (a real stop and start, every worker stopped) the sockets stay open in systemd, so a client's
# connect waits in the backlog for the next start rather than being refused.

# TCP only: a Unix socket's file is removed at the stop (and a socket without its file cannot be connected to); nor a
# channel socket (FDNAME may not hold ":"), which no restart could use anyway: its workers stop with elasticd.
_STORED: Final = ("front", "metrics", "agent")


def store_listeners(listeners: Listeners, *, front: bool = True) -> None:
    """Hand the listening sockets to systemd's store (a no-op without NOTIFY_SOCKET). systemd keeps one copy of a
    socket however often it is sent, so every start (and every re-exec) sends them all. ``front=False``: not the
    front's (and any stored before is dropped)."""
    address = notify_address(os.environ.get("NOTIFY_SOCKET"))
    if address is None:
        return
    if not front:
        forget_stored("front")
    for name in _STORED:
        if name == "front" and not front:
            continue
        fds = [sock.fileno() for sock in listeners.held_sockets(name)]
        if fds:
            _send_fds(address, f"FDSTORE=1\nFDNAME={name}".encode(), fds)


def store_state(fd: int) -> None:
    """Hand the memfd keeping the running state (elasticd/crash) to systemd's store, once: it is rewritten in place."""
    address = notify_address(os.environ.get("NOTIFY_SOCKET"))
    if address is not None:
        _send_fds(address, b"FDSTORE=1\nFDNAME=state", [fd])


def forget_stored(name: str) -> None:
    """Ask systemd to drop what it stores under ``name`` (a socket for an address the configuration no longer has)."""
    address = notify_address(os.environ.get("NOTIFY_SOCKET"))
    if address is not None:
        _send_fds(address, f"FDSTOREREMOVE=1\nFDNAME={name}".encode(), [])


def _send_fds(address: str, message: bytes, fds: list[int]) -> None:
    # One datagram with the descriptors attached, on a socket of its own: rare (at a start), and a full queue only
    # costs the store (said once), never the daemon a blocked loop.
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC) as sock:
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            sock.sendmsg([message], ancillary, 0, address)
    except OSError as exc:
        log.warning("cannot hand descriptors to systemd's store (%s): a restart refuses connections meanwhile, and "
                    "a crash loses the running state", exc)


def listen_fds(environ: MutableMapping[str, str]) -> dict[str, list[int]]:
    """The descriptors systemd passed this start (sd_listen_fds(3): for this very pid), by name; the variables are
    removed, so that a re-exec or a worker never reads them as its own."""
    pid, count, names = (environ.pop(key, None) for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"))
    if pid != str(os.getpid()) or not count or not count.isdigit():
        return {}
    labels = (names or "").split(":")
    found: dict[str, list[int]] = {}
    for index in range(int(count)):
        name = labels[index] if index < len(labels) and labels[index] else "unknown"
        found.setdefault(name, []).append(3 + index)
    return found


# sd-daemon(3) priority prefixes: journald reads "<N>" at the start of a stderr line as its priority.
_PRIORITIES = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6, logging.DEBUG: 7}


class _JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{_PRIORITIES.get(record.levelno, 6)}>"
        # Each physical line gets the prefix, or journald records the continuation lines at "info".
        return "\n".join(prefix + line for line in super().format(record).splitlines() or [""])


def setup_logging(level: int = logging.INFO, environ: dict[str, str] | None = None) -> None:
    """Logs go to stderr; under journald without timestamps (it has its own) and with priorities."""
    env = os.environ if environ is None else environ
    handler = logging.StreamHandler(sys.stderr)
    if stderr_is_journal(env.get("JOURNAL_STREAM")):
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def stderr_is_journal(journal_stream: str | None) -> bool:
    """Whether elasticd's own stderr is journald's stream socket (then its log lines carry priority prefixes, and
    its workers' output goes to journald directly). JOURNAL_STREAM is "DEV:INODE" of the journal socket; it
    counts only if stderr is that very socket (a child that inherited the variable but writes elsewhere must not
    emit prefixes)."""
    if not journal_stream:
        return False
    try:
        device, inode = (int(x) for x in journal_stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)
