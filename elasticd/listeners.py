"""The daemon's listening sockets, by name ("front", "metrics", "admin", "agent", "channel:<tenant>"): bound here, or
taken from the image before a re-exec in place (``elasticd upgrade``), and kept so that the next image can take them.

Why each is held here and each server serves on a duplicate: a server that stops (to stop accepting, at the start of
a re-exec) closes the socket it was given, and a listening socket closed is gone — a client's connect is refused.
Closing one descriptor of two leaves the socket listening: connections that come meanwhile wait in its backlog,
and the next image accepts them. So the accept gap of a re-exec costs a client a wait, never a refusal.

A socket taken from the previous image is used only when it is what the configuration asks for now (the same
address; for a port 0, any): otherwise it is closed and the new address bound, as a reload would.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence

__all__ = ["Listeners", "bind_tcp"]

log = logging.getLogger("elasticd.listeners")


class Listeners:
    __slots__ = ("_held", "_inherited", "on_discard")

    def __init__(self, inherited: Mapping[str, Sequence[int]] | None = None) -> None:
        self._held: dict[str, list[socket.socket]] = {}
        self._inherited: dict[str, list[socket.socket]] = {}
        # Called with the name of an inherited socket that listens where the configuration no longer says: a copy of it
        # may be held elsewhere too (systemd's store), which must let go of it before its address can be bound again.
        self.on_discard: Callable[[str], None] | None = None
        for name, fds in (inherited or {}).items():
            sockets = []
            for fd in fds:
                try:
                    sockets.append(socket.socket(fileno=fd))  # (its family and type are read from the descriptor)
                except OSError as exc:
                    log.warning("the previous image's %s socket (descriptor %d) cannot be taken: %s", name, fd, exc)
            for sock in sockets:
                os.set_inheritable(sock.fileno(), False)
                sock.setblocking(False)
            self._inherited[name] = sockets

    # ------------------------------------------------------------------ taking and binding

    def tcp(self, name: str, host: str, port: int, backlog: int) -> list[socket.socket]:
        """Sockets listening on host:port for a server to serve on (duplicates of the held ones): the previous
        image's when they listen there (or anywhere, for port 0), else bound now (OSError: the port is in use)."""
        discarded = name in self._inherited
        taken = self._take(name, lambda sock: _listens_on(sock, host, port))
        if taken is None and discarded and self.on_discard is not None:
            self.on_discard(name)
        self._held[name] = taken if taken is not None else _bind_retrying(host, port, backlog, discarded)
        return [_dup(sock) for sock in self._held[name]]

    def take_unix(self, name: str, path: str, bound_at: str | None = None, *,
                  shared: bool = False) -> socket.socket | None:
        """The previous image's socket that serves at ``path``, held again, and a duplicate for the server; None when
        there is none (the caller binds one and ``hold``s it). ``bound_at``: the path it was bound at, when its file
        was renamed to ``path`` afterwards (the kernel's name for the socket stays the one it was bound at).
        ``shared``: the held socket itself, as ``hold``'s."""
        taken = self._take(name, lambda sock: sock.family == socket.AF_UNIX and _sockname(sock) == (bound_at or path)
                           and os.path.exists(path))
        if taken is None or len(taken) != 1:
            for sock in taken or ():
                sock.close()
            return None
        self._held[name] = taken
        return taken[0] if shared else _dup(taken[0])

    def hold(self, name: str, sock: socket.socket, *, shared: bool = False) -> socket.socket:
        """Keep ``sock`` (bound and listening) under ``name``; the duplicate returned is the server's. ``shared``: the
        server is given the held socket itself, for one that never stops but for good (``release``): a tenant's
        channel keeps accepting through a re-exec, and one descriptor a tenant instead of two is 2,000 fewer on a
        host of 2,000 tenants."""
        self.release(name)
        self._held[name] = [sock]
        return sock if shared else _dup(sock)

    def release(self, name: str) -> None:
        """The server of ``name`` stopped for good (a tenant removed, the daemon stopping): its socket closes."""
        for sock in self._held.pop(name, ()):
            sock.close()

    def held_sockets(self, name: str) -> list[socket.socket]:
        return list(self._held.get(name, ()))

    def dups(self, name: str) -> list[socket.socket]:
        """Duplicates of the held sockets of ``name``, for a server to serve on again."""
        return [_dup(sock) for sock in self._held.get(name, ())]

    def _take(self, name: str, fits: Callable[[socket.socket], bool]) -> list[socket.socket] | None:
        sockets = self._inherited.pop(name, None)
        if not sockets:
            return None
        if all(fits(sock) for sock in sockets):
            return sockets
        log.info("the previous image's %s socket listens elsewhere than the configuration says now: closed", name)
        for sock in sockets:
            sock.close()
        return None

    # ------------------------------------------------------------------ a re-exec

    def handover(self) -> dict[str, tuple[int, ...]]:
        """Every held socket's descriptor, made inheritable: the exec keeps them open, the next image takes them."""
        fds = {}
        for name, sockets in self._held.items():
            for sock in sockets:
                os.set_inheritable(sock.fileno(), True)
            fds[name] = tuple(sock.fileno() for sock in sockets)
        return fds

    def handover_failed(self) -> None:
        """The exec failed: this image keeps serving, and no descriptor of its leaks into a worker it starts."""
        for sockets in self._held.values():
            for sock in sockets:
                with contextlib.suppress(OSError):
                    os.set_inheritable(sock.fileno(), False)

    def close_unclaimed(self) -> list[str]:
        """The previous image's sockets that no server of this configuration took (an agent no longer configured, a
        tenant removed): closed. Their names, for the journal."""
        names = sorted(self._inherited)
        for sockets in self._inherited.values():
            for sock in sockets:
                sock.close()
        self._inherited.clear()
        return names

    def close_all(self) -> None:
        for name in list(self._held):
            self.release(name)
        self.close_unclaimed()


def _dup(sock: socket.socket) -> socket.socket:
    copy = sock.dup()  # (close-on-exec, as every descriptor Python makes)
    copy.setblocking(False)
    return copy


def _sockname(sock: socket.socket) -> object:
    try:
        return sock.getsockname()
    except OSError:
        return None


def _listens_on(sock: socket.socket, host: str, port: int) -> bool:
    name = _sockname(sock)
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or not isinstance(name, tuple):
        return False
    if port and name[1] != port:
        return False
    try:
        wanted = {ipaddress.ip_address(str(info[4][0]).split("%")[0])
                  for info in socket.getaddrinfo(host or None, port or None, type=socket.SOCK_STREAM,
                                                 flags=socket.AI_PASSIVE)}
    except (OSError, ValueError):
        return False
    return ipaddress.ip_address(str(name[0]).split("%")[0]) in wanted


def _bind_retrying(host: str, port: int, backlog: int, retry: bool) -> list[socket.socket]:
    """bind_tcp; after a socket was discarded, for up to a second while its other copy (systemd's) goes."""
    for _ in range(20 if retry else 0):
        try:
            return bind_tcp(host, port, backlog)
        except OSError:
            time.sleep(0.05)
    return bind_tcp(host, port, backlog)


def bind_tcp(host: str, port: int, backlog: int) -> list[socket.socket]:
    """As asyncio's create_server binds: every address the host resolves to, SO_REUSEADDR, an IPv6 socket for IPv6
    only (its IPv4 twin, if any, is bound beside it)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys((i[0], i[1], i[2], i[3], i[4]) for i in infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
