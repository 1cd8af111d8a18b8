"""elasticd's side of the keeper's socket (asyncio): connect and read the keeper's table, spawn through it, learn
each exit.

A worker spawned through the keeper is not elasticd's child, so it is watched as ``KeptProcess``: its exit status
comes in the keeper's ``exited`` message, and signals go through a pidfd (``pidfd_open`` works on any process for
root), which names the process and not a number the kernel may give another once the keeper has reaped it.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from elasticd.keeper.wire import MAX_MESSAGE, WireError, decode, encode

__all__ = ["KeeperLink", "KeeperLost", "KeptProcess", "KeptRow"]

_FDS_PER_MESSAGE: Final = 4
_EARLY_BOUND: Final = 4096


class KeeperLost(ConnectionError):
    """The keeper's connection ended (the keeper stopped, or closed it on what it could not take)."""


@dataclass(frozen=True, slots=True)
class KeptRow:
    """A child the keeper had when elasticd connected: a worker of a previous instance, to adopt or stop."""

    pid: int
    label: str
    started: int
    code: int | None  # its exit status, if it ended meanwhile
    output: int | None  # a descriptor of its output pipe's read end (this process's to close)


class KeptProcess:
    """The part of ``asyncio.subprocess.Process`` a worker uses: ``pid``, ``returncode``, ``wait()``,
    ``send_signal()``."""

    __slots__ = ("_ended", "_link", "_pidfd", "pid", "returncode", "started")

    def __init__(self, link: KeeperLink, pid: int, started: int) -> None:
        self.pid = pid
        self.started = started  # its start time, as the keeper read it (its identity with the pid)
        self.returncode: int | None = None
        self._link = link
        self._ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._pidfd = -1  # ended already (its exit message follows)

    def _exited(self, code: int) -> None:
        self.returncode = code
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        if not self._ended.done():
            self._ended.set_result(code)
        self._link.forget(self.pid)

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    def send_signal(self, signum: int) -> None:
        if self.returncode is None and self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signum)


class KeeperLink:
    __slots__ = ("_closed", "_early", "_kept", "_pending", "_seq", "_sock", "base", "base_refused", "keeper_pid",
                 "on_lost")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._seq = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._kept: dict[int, KeptProcess] = {}
        # Exits of children not watched yet: one that ends at once can be told before its spawn's caller resumes.
        self._early: dict[int, int] = {}
        self._closed = False
        self.keeper_pid = 0
        self.base: str | None = None  # the tenants' cgroup base, when the keeper's unit gives one
        self.base_refused: str | None = None  # why the keeper could not take that base (it cannot place workers)
        self.on_lost: Callable[[], None] | None = None  # the keeper's connection ended, unasked

    @classmethod
    async def connect(cls, path: str) -> tuple[KeeperLink, list[KeptRow]]:
        """Connect, and read the keeper's table (its children, with their held output descriptors)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, path)
        except OSError:
            sock.close()
            raise
        link = cls(sock)
        rows = []
        try:
            await link._send({"op": "hello"})
            while True:
                message, fds = await link._receive()
                if message["op"] == "ready":
                    break
                if message["op"] != "child":
                    raise WireError(f"{message['op']} before the keeper's table was whole")
                rows.append(_row(message, fds))
            link.keeper_pid = _int(message, "pid")
            base, refused = message.get("base"), message.get("base_refused")
            link.base = base if isinstance(base, str) else None
            link.base_refused = refused if isinstance(refused, str) else None
        except BaseException:
            for row in rows:
                if row.output is not None:
                    os.close(row.output)
            sock.close()
            raise
        loop.add_reader(sock.fileno(), link._readable)
        return link, rows

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, label: str,
                    stdio: tuple[int, int, int], hold: int | None = None) -> KeptProcess:  # (a Spawner)
        """Start ``argv`` as the keeper's child, in a session of its own, with ``stdio`` as its descriptors 0-2 and,
        with ``hold``, that output pipe's read end kept by the keeper too. OSError when it cannot be started."""
        self._seq += 1
        seq = self._seq
        answered: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[seq] = answered
        try:
            fds = [*stdio] if hold is None else [*stdio, hold]
            await self._send({"op": "spawn", "seq": seq, "argv": list(argv), "env": dict(env), "cwd": cwd,
                              "label": label, "hold": hold is not None}, fds)
            answer = await answered
        finally:
            self._pending.pop(seq, None)
        if answer["op"] == "refused":
            raise OSError(f"the keeper could not start it: {answer.get('error')}")
        return self.watch(_int(answer, "pid"), _int(answer, "started"))

    def watch(self, pid: int, started: int) -> KeptProcess:
        """A child of the keeper's, watched from now on (a spawned one, or an adopted row's)."""
        process = self._kept[pid] = KeptProcess(self, pid, started)
        code = self._early.pop(pid, None)
        if code is not None:
            process._exited(code)
        return process

    def forget(self, pid: int) -> None:
        self._kept.pop(pid, None)
        self._tell({"op": "forget", "pid": pid})

    def stop(self) -> None:
        """elasticd stops for good (its workers stopped first): the keeper stops too."""
        self._tell({"op": "stop"})
        self.close()

    def close(self) -> None:
        """The connection ends. Every child still watched ends with it: a keeper gone took its children along (their
        parent-death signal, or systemd stopping its unit), and one left would be nobody's to read, so it is killed
        (through its pidfd: never another process). Each reads as killed (SIGKILL), and its worker restarts."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ValueError, RuntimeError):
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
        self._sock.close()
        lost = KeeperLost("the keeper's connection ended")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(lost)
        for process in list(self._kept.values()):
            process.send_signal(signal.SIGKILL)
            process._exited(-signal.SIGKILL)
        self._kept.clear()

    # ------------------------------------------------------------------ the socket

    def _tell(self, message: dict[str, Any]) -> None:
        """A message that needs no answer, sent now or not at all (the keeper reads at once; a full socket means it
        is gone or stuck, and then the forget or stop is moot)."""
        if self._closed:
            return
        with contextlib.suppress(OSError):
            self._sock.sendmsg([encode(message)])

    async def _send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        data = encode(message)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        loop = asyncio.get_running_loop()
        while True:
            if self._closed:
                raise KeeperLost("the keeper's connection ended")
            try:
                self._sock.sendmsg([data], ancillary)
                return
            except BlockingIOError:
                await _ready(loop, self._sock.fileno(), write=True)

    async def _receive(self) -> tuple[dict[str, Any], list[int]]:
        loop = asyncio.get_running_loop()
        while True:
            try:
                return self._read_one()
            except BlockingIOError:
                await _ready(loop, self._sock.fileno(), write=False)

    def _read_one(self) -> tuple[dict[str, Any], list[int]]:
        fds = array.array("i")
        data, ancdata, flags, _ = self._sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(_FDS_PER_MESSAGE * fds.itemsize),
                                                     socket.MSG_CMSG_CLOEXEC)
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
        if not data:
            for fd in fds:
                os.close(fd)
            raise KeeperLost("the keeper closed its connection")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                os.close(fd)
            raise WireError("a message of the keeper's or its descriptors were cut")
        return decode(data), list(fds)

    def _readable(self) -> None:
        """Everything the keeper says after its table: answers to spawns, and exits."""
        while not self._closed:
            try:
                message, fds = self._read_one()
            except BlockingIOError:
                return
            except (OSError, WireError):
                self.close()
                if self.on_lost is not None:
                    self.on_lost()
                return
            for fd in fds:  # (none is expected after the table)
                os.close(fd)
            op = message["op"]
            if op in ("spawned", "refused"):
                future = self._pending.get(message.get("seq", -1))
                if future is not None and not future.done():
                    future.set_result(message)
            elif op == "exited":
                process = self._kept.get(message.get("pid", -1))
                code = message.get("code")
                if not isinstance(code, int):
                    continue
                if process is not None:
                    process._exited(code)
                else:
                    self._early[message.get("pid", -1)] = code
                    while len(self._early) > _EARLY_BOUND:  # (a previous instance's children nobody adopts)
                        del self._early[next(iter(self._early))]


async def _ready(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


def _int(message: Mapping[str, Any], name: str) -> int:
    value = message.get(name)
    if not isinstance(value, int) or isinstance(value, bool):
        raise WireError(f"{message.get('op')}: {name} is not a number")
    return value


def _row(message: Mapping[str, Any], fds: list[int]) -> KeptRow:
    code = message.get("code")
    label = message.get("label")
    if not isinstance(label, str) or not (code is None or isinstance(code, int)):
        for fd in fds:
            os.close(fd)
        raise WireError("child: a row without its label or with a status that is not a number")
    return KeptRow(_int(message, "pid"), label, _int(message, "started"), code, fds[0] if fds else None)
