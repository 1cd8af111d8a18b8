"""elasticd's side of systemd: sd_notify messages, the watchdog, and log lines journald understands.

Every notification is a no-op without ``NOTIFY_SOCKET`` (sd_notify itself returns 0 then), so the daemon
calls these unconditionally whether it runs under systemd, in a test, or in a terminal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time

__all__ = ["Notifier", "setup_logging"]

log = logging.getLogger("elasticd.systemd")

try:
    from pystemd.daemon import notify as _sd_notify
except ImportError:  # pragma: no cover - pystemd is a dependency; this keeps --check usable without it
    _sd_notify = None


class Notifier:
    __slots__ = ("_watchdog_task",)

    def __init__(self) -> None:
        self._watchdog_task: asyncio.Task[None] | None = None

    @staticmethod
    def send(*states: str) -> None:
        if not os.environ.get("NOTIFY_SOCKET"):
            return
        if _sd_notify is None:
            log.warning("NOTIFY_SOCKET is set but pystemd is missing: systemd is not told %s", states)
            return
        try:
            _sd_notify(False, *states)
        except Exception as exc:  # a notification must never take the daemon down
            log.warning("sd_notify(%s) failed: %s", ", ".join(states), exc)

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
            self._watchdog_task = asyncio.create_task(self._watchdog(interval), name="watchdog")

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
    if _stderr_is_journal(env.get("JOURNAL_STREAM")):
        handler.setFormatter(_JournalFormatter("%(name)s: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _stderr_is_journal(journal_stream: str | None) -> bool:
    """JOURNAL_STREAM is "DEV:INODE" of the journal socket; it counts only if stderr is that very socket
    (a child that inherited the variable but writes elsewhere must not emit prefixes)."""
    if not journal_stream:
        return False
    try:
        device, inode = (int(x) for x in journal_stream.split(":"))
        st = os.fstat(sys.stderr.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)
