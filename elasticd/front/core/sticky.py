"""Sticky users: the cookie that names a user, and the surface user → worker. Pure: time is passed in.

A user is a browser holding the ``elastic_uid`` cookie (128 random bits, 32 hex digits). The surface keeps,
per user, the worker it sticks to, the name a worker logged it in under, when it was last seen and what it
consumed (requests, seconds of forwarding). It is the commander's surface of the elastic pool: placement
policies read it, moves re-point it.

A user enters the surface when it comes back with the cookie the front gave it (or when a worker logs it
in): clients that keep no cookie (curl, bots, load generators) would otherwise add one entry per request.
Their first request is placed like any new user's, so nothing about where they land changes. The surface is
bounded by the users who keep cookies and were seen within ``ttl``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Final, Protocol

from elasticd.front.core.consumption import Consumption, Newcomers

__all__ = [
    "COOKIE",
    "PlaceFn",
    "RoutableWorker",
    "Surface",
    "SurfaceUser",
    "new_user_id",
    "place",
    "set_cookie_line",
    "user_from_cookie",
]

COOKIE: Final = "elastic_uid"
_NEEDLE: Final = COOKIE.encode() + b"="
_ID_LEN: Final = 32  # hex digits of 128 bits
_HEX_DIGITS: Final = b"0123456789abcdef"
_ALONE: Final = len(_NEEDLE) + _ID_LEN  # a Cookie header carrying our cookie only


class _Random:
    """128-bit ids cut from a 4 KiB block of os.urandom: one getrandom() per 256 new users, not per user."""

    __slots__ = ("block", "pos")

    def __init__(self) -> None:
        self.block = b""
        self.pos = 0

    def take16(self) -> bytes:
        if self.pos >= len(self.block):
            self.block = os.urandom(4096)
            self.pos = 0
        pos = self.pos
        self.pos = pos + 16
        return self.block[pos:pos + 16]

    def reset(self) -> None:
        self.block = b""  # a forked child must not hand out its parent's ids


_random: Final = _Random()
os.register_at_fork(after_in_child=_random.reset)


def new_user_id() -> str:
    return _random.take16().hex()


def user_from_cookie(header: bytes) -> str | None:
    """The user id in a Cookie header's value, or None when absent or not one we could have issued.

    A malformed value is treated as no cookie (the user gets a fresh one); a well-formed id we do not know is
    accepted as is (after a restart or ``ttl`` the user keeps its id, and guessing another user's 128 bits
    is not a way in: the surface only steers where requests go).
    """
    if len(header) == _ALONE and header.startswith(_NEEDLE):  # the common case: our cookie, and only it
        value = header[len(_NEEDLE):]
        return None if value.translate(None, _HEX_DIGITS) else value.decode("ascii")
    start = header.find(_NEEDLE)
    while start >= 0:
        if start == 0 or header[start - 1] in b" ;":
            begin = start + len(_NEEDLE)
            value = header[begin:begin + _ID_LEN]
            end = begin + _ID_LEN
            if (len(value) == _ID_LEN and (end == len(header) or header[end] in b"; ")
                    and not value.translate(None, _HEX_DIGITS)):
                return value.decode("ascii")
        start = header.find(_NEEDLE, start + 1)
    return None


_SET: Final = f"Set-Cookie: {COOKIE}=".encode()
_ATTRIBUTES: Final = b"; Path=/; HttpOnly; SameSite=Lax\r\n"
_ATTRIBUTES_SECURE: Final = b"; Path=/; HttpOnly; SameSite=Lax; Secure\r\n"


def set_cookie_line(user: str, secure: bool) -> bytes:
    """The Set-Cookie header line for a new user: a session cookie, never readable by scripts, sent on
    top-level navigation from other sites (Lax) so a followed link keeps the user where it was."""
    return _SET + user.encode("ascii") + (_ATTRIBUTES_SECURE if secure else _ATTRIBUTES)


class SurfaceUser(Consumption):
    """One user on the surface, and what the forward path consumed for it (a ``Consumption`` itself rather than
    holding one: the surface is sized by its users, and one object per user is what keeps it small); ``moving``:
    a live move of it is under way (its new requests are held, not forwarded: ``Surface.flag``); ``pinned``: its
    worker is being emptied and it waits its turn to be moved off: it is served there meanwhile, though that
    worker takes no one new."""

    __slots__ = ("app", "group", "login", "moving", "pinned", "seen", "worker")

    def __init__(self, worker: str, seen: float, first: tuple[float, float, str] | None = None,
                 group: str = "", app: str = "") -> None:
        super().__init__()
        self.worker = worker
        self.group = group  # the app's group it was placed in ("": none yet): it stays there (groups.py)
        self.app = app  # "tenant/app" of that group (its route's label): users are counted per group with it
        self.login: str | None = None
        self.seen = seen
        self.moving = False
        self.pinned = False
        if first is not None:  # its first request (seconds, when, group), made before it had a cookie
            self.add(first[0], first[1])
            if not group:
                self.group = first[2]

    def __repr__(self) -> str:
        return f"SurfaceUser(worker={self.worker!r}, login={self.login!r}, seen={self.seen}, {self.totals()})"


class Surface:
    """user id → SurfaceUser; and the newcomers, users given a cookie whose first request is credited to them
    until they come back with it (``consumption.Newcomers``)."""

    __slots__ = ("changes", "moving", "newcomers", "ttl", "users")

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.changes = 0  # bumped as users are placed, log in or out, are released or forgotten (the crash state's cue)
        self.users: dict[str, SurfaceUser] = {}
        self.newcomers = Newcomers()
        self.moving = 0  # users flagged moving: while none is, the request path asks nothing about moves

    def __len__(self) -> int:
        return len(self.users)

    def __contains__(self, user: object) -> bool:
        return user in self.users

    def get(self, user: str) -> SurfaceUser | None:
        return self.users.get(user)

    def assign(self, user: str, worker: str, now: float, group: str | None = None, app: str = "") -> SurfaceUser:
        """Point ``user`` at ``worker`` (placing a new user, re-placing one whose worker went, a move), in
        ``group`` of ``app`` when given (a move stays within its group)."""
        self.changes += 1
        entry = self.users.get(user)
        if entry is None:
            entry = self.users[user] = SurfaceUser(worker, now, self.newcomers.claim(user), group or "", app)
        else:
            entry.worker = worker
            entry.seen = now
            entry.pinned = False
            if group is not None:
                entry.group = group
                entry.app = app or entry.app
        return entry

    def pin(self, user: str, pinned: bool = True) -> None:
        """Keep ``user`` on its worker while that worker is emptied (until moved, or the emptying ends)."""
        entry = self.users.get(user)
        if entry is not None:
            entry.pinned = pinned

    def login(self, user: str, name: str | None, worker: str, now: float, group: str = "",
              app: str = "") -> SurfaceUser:
        """A worker (of ``group``) said ``X-Elastic-Login: name`` (None for ``-``, logged out) answering ``user``.
        A user who logs out is chosen a group again at its next request: after a blue/green switch, that is
        where it leaves the old group (its worker is kept when the choice is the same group)."""
        self.changes += 1
        entry = self.users.get(user)
        if entry is None:
            entry = self.users[user] = SurfaceUser(worker, now, self.newcomers.claim(user), group, app)
        entry.login = name
        if name is None:
            entry.group = ""
        return entry

    def release(self, worker: str) -> int:
        """The worker is gone (its process and its users' state with it): its users are re-placed at their
        next request, wherever placement says, even if a new process comes back under the same id."""
        self.changes += 1
        released = 0
        for entry in list(self.users.values()):
            if entry.worker == worker:
                entry.worker = ""
                entry.pinned = False
                released += 1
        return released

    def forget(self, user: str) -> SurfaceUser | None:
        self.changes += 1
        entry = self.users.pop(user, None)
        if entry is not None and entry.moving:
            self.moving -= 1
        return entry

    def flag(self, user: str) -> bool:
        """Mark ``user`` moving (the move's FLAG): False when it is not on the surface or is moving already."""
        entry = self.users.get(user)
        if entry is None or entry.moving:
            return False
        entry.moving = True
        self.moving += 1
        return True

    def unflag(self, user: str) -> None:
        """The move ended (switched or aborted): the user's requests are forwarded again."""
        entry = self.users.get(user)
        if entry is not None and entry.moving:
            entry.moving = False
            self.moving -= 1

    def expire(self, now: float) -> list[str]:
        """Forget users idle longer than ``ttl``; returns who went (their consumption goes with them). Newcomers
        that did not come back within ``ttl`` go too."""
        horizon = now - self.ttl
        self.newcomers.expire(horizon)
        gone = [user for user, entry in self.users.items() if entry.seen < horizon and not entry.moving]
        for user in gone:
            del self.users[user]
        return gone

    def count_by_group(self) -> dict[tuple[str, str], int]:
        """How many users each group holds, by ("tenant/app", group): its users whose worker went too (they are
        placed again in it at their next request)."""
        counts: dict[tuple[str, str], int] = {}
        for entry in list(self.users.values()):
            key = (entry.app, entry.group)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def on(self, worker: str) -> Iterator[tuple[str, SurfaceUser]]:
        """The users a worker holds."""
        return ((user, entry) for user, entry in list(self.users.items()) if entry.worker == worker)


class RoutableWorker(Protocol):
    """What placement sees of a routable worker (``front.Upstream`` is one)."""

    @property
    def worker_id(self) -> str: ...


# (user or None for a brand-new one, the surface, the group's routable workers in their stable order) → the
# chosen worker's id
PlaceFn = Callable[[str | None, Surface, Sequence[RoutableWorker]], str]


def place(user: str | None, surface: Surface, routable: Sequence[RoutableWorker]) -> str:
    """Where a user goes that the surface has no routable worker for: the reception, the group's first
    routable worker (seed 000: every user is born there; the pool's admission policy replaces this)."""
    if not routable:
        raise ValueError("no routable worker to place a user on")
    return routable[0].worker_id
