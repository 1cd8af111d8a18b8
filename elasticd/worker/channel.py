"""TRANSPORT, the worker side: announce on ``ELASTIC_CHANNEL`` and push the report every interval.

The client runs in a daemon thread of its own with a plain blocking socket, not as a task on the app's event
loop: a handler that holds the loop (a synchronous, CPU-bound view) would otherwise silence the sensor, and
elasticd would take the busiest worker there is for a hung one. The loop's health is reported instead, as the
report's ``loop_lag`` (see ``heartbeat``), so a busy loop and a wedged one are told apart.

Newline-delimited JSON over the Unix socket (``elasticd.frames``): one object per line, easy to read in any
language and to refuse line by line; a live move's package follows its line as raw bytes. If elasticd is not
there (restarting), the client retries with a capped backoff; a report is never queued for later (an old
reading is confidently wrong, a missing one merely imprecise). elasticd's move requests (snapshot, install,
forget) are handed to the ``MoveHandler``'s own thread, which answers on the same socket; its ``monitor``
request (the population: ``{"type": "monitor", "id": N}``) is answered at once from this thread, with the
sensor's register (``{"type": "register", "id": N, "bytes": B}`` then B bytes: the users as a JSON list): a
copy of a table, never behind a big package being pickled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from elasticd.frames import MAX_LINE, FrameReader, encode
from elasticd.worker.moves import MOVE_REQUESTS, MoveHandler

__all__ = ["MAX_LINE", "ChannelClient"]

log = logging.getLogger("elasticd.worker.channel")
_FIRST_DELAY = 0.1  # the backoff's first retry; it doubles up to the interval
_ANNOUNCE_TIMEOUT = 1.0  # at least this long for elasticd to answer the announce
_REPLY_TIMEOUT = 30.0  # a move's answer (a package of up to 64 MiB) may take this long to send


class ChannelClient:
    __slots__ = ("_lock", "_moves", "_register", "_replies", "_report", "_send_lock", "_sock", "_stop", "_thread",
                 "interval", "path", "token", "worker_id")

    def __init__(self, report: Callable[[float], dict[str, Any]], *, path: str | None = None,
                 worker_id: str | None = None, token: str | None = None, interval: float | None = None,
                 moves: MoveHandler | None = None,
                 register: Callable[[float], list[dict[str, Any]]] | None = None) -> None:
        channel: str = path or os.environ.get("ELASTIC_CHANNEL") or ""
        self.path = channel.removeprefix("unix:")
        self.worker_id = worker_id or os.environ.get("ELASTIC_WORKER_ID", "")
        self.token = token or os.environ.get("ELASTIC_TOKEN", "")
        self.interval = interval or float(os.environ.get("ELASTIC_OCCUPANCY_INTERVAL", "5"))
        self._report = report
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards _sock: stop() shuts it down to wake the thread
        self._send_lock = threading.Lock()  # the report thread and the move thread both write to the socket
        self._moves = moves  # None: the worker has no state a move could carry (moved by re-pointing only)
        self._register = register  # the sensor's users, for the population (None: not offered)
        self._sock: socket.socket | None = None
        # The move thread's own handle on the connection (a dup): a socket's timeout is the object's, and the
        # report thread sets short ones for its reads, which would cut a big package's send short.
        self._replies: socket.socket | None = None
        self._thread: threading.Thread | None = None

    @property
    def configured(self) -> bool:
        return bool(self.path and self.worker_id and self.token)

    @property
    def capabilities(self) -> list[str]:
        return (["occupancy"] + (["snapshot", "install"] if self._moves is not None else [])
                + (["monitor"] if self._register is not None else []))

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the reporting thread; a no-op when already running or not configured."""
        if not self.configured or self.running:
            return
        # An event per thread: one that outlived its stop's join (stuck in a report) still sees its own set.
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name="elastic channel", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 0.5) -> None:
        """Signal the thread, wake it from any wait and join it (at most ``timeout``: it is a daemon thread)."""
        self._stop.set()
        if self._moves is not None:
            self._moves.stop()
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.shutdown(socket.SHUT_RDWR)
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------------ the thread

    def _run(self, stop: threading.Event) -> None:
        delay = _FIRST_DELAY
        last_error = ""
        while not stop.is_set():
            sock = None
            try:
                sock, buffer = self._connect(stop)
                delay, last_error = _FIRST_DELAY, ""
                self._push(sock, buffer, stop)
            except (OSError, ValueError) as exc:  # ConnectionError, timeouts, bad JSON, a refused announce
                if not stop.is_set():
                    # Each new kind of failure is worth a line; the same one again while retrying is not.
                    error = str(exc)
                    level = logging.DEBUG if error == last_error else logging.WARNING
                    log.log(level, "channel %s: %s; retrying in %.1fs", self.path, error, delay)
                    last_error = error
            except Exception:  # a bug of ours (or of the report callable): never let the sensor die silently
                log.exception("channel %s: unexpected error; retrying in %.1fs", self.path, delay)
            finally:
                if sock is not None:
                    self._close(sock)
            if stop.wait(delay):
                break
            delay = min(delay * 2, self.interval)

    def _connect(self, stop: threading.Event) -> tuple[socket.socket, FrameReader]:
        """A connection whose announce was accepted, and its reader (holding what came past the answer)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(_ANNOUNCE_TIMEOUT)  # stop() cannot wake a connect: keep it short
            sock.connect(self.path)
            with self._lock:
                if stop.is_set():
                    raise ConnectionAbortedError("stopping")
                self._sock = sock
            self._send(sock, {"type": "announce", "worker": self.worker_id, "token": self.token,
                              "pid": os.getpid(), "capabilities": self.capabilities})
            reader = FrameReader()
            deadline = time.monotonic() + max(self.interval, _ANNOUNCE_TIMEOUT)
            messages: list[tuple[dict[str, Any], bytes | None]] = []
            while not messages:
                if time.monotonic() >= deadline:
                    raise TimeoutError("no answer to the announce")
                messages = _receive(sock, reader, deadline)
            reply = messages[0][0]
            if reply.get("type") != "ok":
                raise ValueError(f"announce refused: {reply.get('reason', reply)}")
            for message, payload in messages[1:]:
                self._handle(sock, message, payload)
            return sock, reader
        except BaseException:
            self._close(sock)
            raise

    def _push(self, sock: socket.socket, reader: FrameReader, stop: threading.Event) -> None:
        """A report now and then every interval at a fixed rate, reading elasticd's lines in between."""
        due = time.monotonic()
        while not stop.is_set():
            sock.settimeout(self.interval)  # a daemon that reads nothing must not hold the thread forever
            self._send(sock, {"type": "occupancy", "report": self._report(time.monotonic())})
            due += self.interval
            now = time.monotonic()
            if due <= now:  # late (the report or the send took an interval): skip the tick, never catch up
                due = now + self.interval
            while not stop.is_set() and time.monotonic() < due:
                for message, payload in _receive(sock, reader, due):
                    self._handle(sock, message, payload)

    def _send(self, sock: socket.socket, message: dict[str, Any], payload: bytes | None = None) -> None:
        data = encode(message, payload)
        with self._send_lock:
            sock.sendall(data)

    def _handle(self, sock: socket.socket, message: dict[str, Any], payload: bytes | None) -> None:
        kind = message.get("type")
        if kind == "error":
            log.warning("elasticd refused a message: %s", message.get("reason"))
        elif kind in MOVE_REQUESTS and self._moves is not None:
            # Answered on this connection: if it is gone by then, elasticd's side has timed the request out.
            with self._lock:
                if self._replies is None:
                    self._replies = sock.dup()
                    self._replies.settimeout(_REPLY_TIMEOUT)
                replies = self._replies
            self._moves.submit(message, payload, lambda answer, data: self._send(replies, answer, data))
        elif kind in MOVE_REQUESTS:
            self._send(sock, {"type": "refused", "id": message.get("id"), "reason": "no state to move here"})
        elif kind == "monitor":
            if self._register is None:
                self._send(sock, {"type": "refused", "id": message.get("id"), "reason": "no register here"})
            else:
                # The users as the frame's payload, not inside its line: a line is bounded (MAX_LINE), and a busy
                # reception's register is not.
                users = json.dumps(self._register(time.monotonic()), separators=(",", ":")).encode()
                self._send(sock, {"type": "register", "id": message.get("id")}, users)
        else:
            log.warning("elasticd sent a message this library does not know: %r", kind)

    def _close(self, sock: socket.socket) -> None:
        with self._lock:
            if self._sock is sock:
                self._sock = None
                replies, self._replies = self._replies, None
                if replies is not None:
                    replies.close()
        sock.close()



def _receive(sock: socket.socket, reader: FrameReader, deadline: float) -> list[tuple[dict[str, Any], bytes | None]]:
    """The whole messages that arrived by ``deadline`` in one read (maybe none); the rest stays in ``reader``.
    A stream that cannot be framed raises (FrameError is a ValueError: the connection is made again)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return []
    sock.settimeout(remaining)
    try:
        data = sock.recv(1 << 20)
    except TimeoutError:
        return []
    if not data:
        raise ConnectionResetError("elasticd closed the channel")
    return reader.feed(data)
