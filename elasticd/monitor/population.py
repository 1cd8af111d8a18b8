"""The population of an app: every user, where it lives, what it consumed and what its worker says of it.
Pure: the answers, the surface and the time are passed in.

Seed 000, "Per-user consumption and the monitor": elasticd asks every routable worker that runs the library
for its register (the ``monitor`` request over the channel: its users with their pages, connections and
last activity) and fuses the front's consumption of each user into the user's row. A worker that did not
answer in time is an error row ``{worker, group, error}``, never an exception; the rows of a worker without
the library (any language) come from the surface alone: where its users are and what they consumed, with
nothing about pages or connections (None, not 0: unmeasured is not zero).

User ids are session secrets: a row shows the first eight hex digits (enough to tell users apart, as the
pool API does), and the login name a worker gave the user.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from elasticd.front.core.consumption import EPOCHS, epoch_of

__all__ = ["ID_SHOWN", "RegisterError", "RegisterRow", "SurfaceView", "WorkerAnswer", "fuse", "parse_register",
           "population_counts"]

ID_SHOWN = 8  # hex digits of a user id a row shows


class RegisterError(ValueError):
    """A register that is not of the shape the library sends (a worker's bug, or not our library)."""


@dataclass(frozen=True, slots=True)
class RegisterRow:
    user: str
    connections: int
    pages: int | None
    idle: float  # seconds since the worker last saw the user active


@dataclass(frozen=True, slots=True)
class WorkerAnswer:
    """What became of asking one worker: its register, or why there is none. ``asked`` False: a worker
    without the library (sensed from outside), whose rows come from the surface alone."""

    worker: str
    group: str
    register: tuple[RegisterRow, ...] = ()
    error: str | None = None
    asked: bool = True


class UsedView(Protocol):
    """What the fusion reads of a user's consumption (``front.core.consumption.Consumption``)."""

    requests: int
    seconds: float

    def recent(self, now: float) -> tuple[int, float]: ...


class SurfaceView(UsedView, Protocol):
    """What the fusion reads of a surface entry (``front.core.sticky.SurfaceUser``)."""

    worker: str
    login: str | None
    seen: float


_USER_ID = re.compile(r"[0-9a-f]{32}")  # what the front's cookie carries (sticky.new_user_id)


def _count(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63:
        return value
    raise RegisterError(f"{where}: {str(value)[:40]} is not a count")


def _seconds(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RegisterError(f"{where}: {str(value)[:40]} is not a number of seconds")
    try:
        seconds = float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise RegisterError(f"{where}: {str(value)[:40]}... is not a number of seconds") from None
    if not 0 <= seconds < float("inf"):
        raise RegisterError(f"{where}: {value} is not a number of seconds")
    return seconds


def parse_register(users: Any) -> tuple[RegisterRow, ...]:
    """The ``users`` of a worker's ``register`` answer, checked: RegisterError names the first thing wrong."""
    if not isinstance(users, list):
        raise RegisterError("users: not a list")
    rows = []
    for i, raw in enumerate(users):
        where = f"users[{i}]"
        if not isinstance(raw, dict):
            raise RegisterError(f"{where}: not an object")
        user = raw.get("user")
        if not isinstance(user, str) or not _USER_ID.fullmatch(user):
            raise RegisterError(f"{where}.user: {str(user)[:40]!r} is not a user id (32 hex digits)")
        pages = raw.get("pages")
        rows.append(RegisterRow(user, _count(raw.get("connections", 0), f"{where}.connections"),
                                None if pages is None else _count(pages, f"{where}.pages"),
                                _seconds(raw.get("idle"), f"{where}.idle")))
    return tuple(rows)


def fuse(answers: Sequence[WorkerAnswer], surface: Iterable[tuple[str, SurfaceView]], now: float,
         newcomers: Mapping[str, tuple[float, float, str]] | None = None) -> list[dict[str, Any]]:
    """One row per user of these workers (and one error row per worker that did not answer), grouped by group
    and worker in the order of ``answers``, the most recently active user first within a worker.

    A user the surface places on a worker is that worker's row, with the worker's register fused in when it
    answered (pages, connections, its own idea of the last activity); a user the worker knows and the surface
    does not is a row too: one that has not come back with its cookie yet (its first request is in
    ``newcomers``: (seconds, when, group)), or one the front forgot (no consumption): the worker holds state for it
    all the same."""
    newcomers = newcomers or {}
    groups = {answer.worker: answer.group for answer in answers}
    on_worker: dict[str, list[tuple[str, SurfaceView]]] = {answer.worker: [] for answer in answers}
    placed: set[str] = set()  # users the surface places on a worker (this app's or another's)
    for user, entry in surface:
        if entry.worker:
            placed.add(user)
        if entry.worker in on_worker:
            on_worker[entry.worker].append((user, entry))
    rows: list[dict[str, Any]] = []
    for answer in answers:
        if answer.error is not None:
            rows.append({"worker": answer.worker, "group": answer.group, "error": answer.error})
        known = {row.user: row for row in answer.register}
        worker_rows: list[dict[str, Any]] = []
        for user, entry in on_worker[answer.worker]:
            register = known.pop(user, None)
            recent_requests, recent_seconds = entry.recent(now)
            worker_rows.append({
                "user": user[:ID_SHOWN], "login": entry.login, "worker": answer.worker,
                "group": groups[answer.worker],
                "pages": register.pages if register is not None else None,
                "connections": register.connections if register is not None else None,
                # The worker's own last sight of the user when it has one (a stream open is activity the front's
                # per-request stamp does not see), else the front's.
                "idle": round(register.idle if register is not None else max(now - entry.seen, 0.0), 3),
                "requests": entry.requests, "seconds": round(entry.seconds, 6),
                "recent_requests": recent_requests, "recent_seconds": round(recent_seconds, 6),
                "on_surface": True, "in_register": register is not None,
            })
        for register in known.values():
            if register.user in placed:
                continue  # the surface has it on another worker now (moved): this register's entry is stale
            first = newcomers.get(register.user)
            seconds = first[0] if first is not None else 0.0
            recent = first is not None and epoch_of(first[1]) > epoch_of(now) - EPOCHS
            worker_rows.append({
                "user": register.user[:ID_SHOWN], "login": None, "worker": answer.worker,
                "group": groups[answer.worker], "pages": register.pages, "connections": register.connections,
                "idle": round(register.idle, 3), "requests": 1 if first is not None else 0,
                "seconds": round(seconds, 6), "recent_requests": 1 if recent else 0,
                "recent_seconds": round(seconds if recent else 0.0, 6), "on_surface": False, "in_register": True,
            })
        worker_rows.sort(key=lambda row: float(row["idle"]))
        rows.extend(worker_rows)
    return rows


def population_counts(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The population's counts, each named for what it counts (a bare "users" meant two things: the front's sticky
    users in ``status`` and ``pool``, every row here). ``population``: every user a worker holds or the front
    routes; ``sticky_users``: of them, those the front routes by their cookie (what ``status`` counts per group);
    ``register_only_users``: those only a worker's register knows, newcomers that have not come back with their
    cookie yet (a client without a cookie jar is one per request) or users the front forgot; ``errors``: workers
    that did not answer."""
    users = [row for row in rows if "error" not in row]
    sticky = sum(1 for row in users if row["on_surface"])
    return {"population": len(users), "sticky_users": sticky, "register_only_users": len(users) - sticky,
            "errors": len(rows) - len(users)}
