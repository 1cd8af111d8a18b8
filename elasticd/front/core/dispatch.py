"""Where a request goes, decided with no I/O: route → (a user being moved: hold) → quota → sticky lookup →
placement, giving a ``Forward`` (the worker, the user, its surface entry, a Set-Cookie line for a new user), a
``Hold`` (the user is being moved: the request waits in the front until the move ends) or a ``Refuse``
(status, text, Retry-After). Time is passed in. It changes only the core's own books: the quota's gate and
bucket (an admitted request is counted in flight), the surface (a new or re-placed user), the refusal counts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple, TypeVar

from elasticd.front.core.counters import ForwardCounters, RouteStats
from elasticd.front.core.http1 import RequestHead
from elasticd.front.core.quota import CONCURRENCY, TenantQuota
from elasticd.front.core.routing import AppRoute
from elasticd.front.core.sticky import (
    PlaceFn,
    RoutableWorker,
    Surface,
    SurfaceUser,
    new_user_id,
    set_cookie_line,
    user_from_cookie,
)

__all__ = ["Forward", "Hold", "Refuse", "Target", "decide"]


class Target:
    """What a Host header resolved to: the route, its stats and its tenant's quota (the shell caches these
    per Host value)."""

    __slots__ = ("quota", "route", "stats")

    def __init__(self, route: AppRoute, stats: RouteStats, quota: TenantQuota | None) -> None:
        self.route = route
        self.stats = stats
        self.quota = quota


# (worker, user, its surface entry — None for a new user, put on the surface by its cookie later —, the
# Set-Cookie line for a new user else b"", the quota admitted into — one in flight until the exchange settles).
# A plain tuple: this is made for every request, and a NamedTuple's __new__ is a Python call (~0.2 µs).
W = TypeVar("W", bound=RoutableWorker)
Forward = tuple[W, str, SurfaceUser | None, bytes, TenantQuota | None]


class Refuse(NamedTuple):
    status: int
    text: str
    retry_after: int | None


class Hold(NamedTuple):
    """The request's user is being moved: hold it, unforwarded, until the move ends (then decide again). Held
    before the quota is asked: a request waiting for a move takes no concurrency slot."""

    user: str


def decide(target: Target | None, head: RequestHead, now: float, workers: Sequence[W], unroutable: Collection[str],
           surface: Surface, place: PlaceFn, forwards: ForwardCounters,
           kept: Callable[[str], W | None] | None = None) -> Forward[W] | Hold | Refuse:
    """``workers``: the group's routable workers (reception first); ``unroutable``: those the front found
    dead since; ``kept``: a worker being emptied (not in ``workers``: it takes no one new) by its id, while it
    still serves the users pinned to it. A refusal after admission gives its quota slot back."""
    if target is None:
        host = head.host.decode("latin-1") if head.host is not None else "(none)"
        return Refuse(404, f"no app for host {host}", None)
    if surface.moving and head.cookie is not None:
        moving = user_from_cookie(head.cookie)
        entry = surface.users.get(moving) if moving is not None else None
        if entry is not None and entry.moving:
            assert moving is not None
            return Hold(moving)
    route, stats, quota = target.route, target.stats, target.quota
    if quota is not None:
        refusal = quota.admit(now)
        if refusal is not None:
            forwards.refused(route.tenant, refusal.reason)
            stats.answered(refusal.status)
            why = "too many requests at once" if refusal.reason == CONCURRENCY else "request rate over quota"
            return Refuse(refusal.status, f"{route}: {why}", refusal.retry_after)
    if unroutable:
        workers = [w for w in workers if w.worker_id not in unroutable]
    if not workers:
        if quota is not None:
            quota.leave()
        stats.answered(503)
        return Refuse(503, f"{route}: no worker available", 1)
    cookie = head.cookie
    user = user_from_cookie(cookie) if cookie is not None else None
    if user is None:
        user = new_user_id()
        chosen = place(None, surface, workers)
        first = workers[0]  # the reception, nearly always placement's choice for a new user: no search
        worker = first if chosen == first.worker_id else _placed(chosen, workers)
        return (worker, user, None, set_cookie_line(user, head.secure), quota)
    entry = surface.users.get(user)
    if entry is not None:
        wanted = entry.worker
        for candidate in workers:
            if candidate.worker_id == wanted:
                entry.seen = now
                return (candidate, user, entry, b"", quota)
        if entry.pinned and kept is not None and wanted not in unroutable:
            keeping = kept(wanted)  # its worker is being emptied: it waits its turn to be moved off, there
            if keeping is not None:
                entry.seen = now
                return (keeping, user, entry, b"", quota)
    # New on the surface, or its worker went: (re-)placed.
    worker = _placed(place(user, surface, workers), workers)
    return (worker, user, surface.assign(user, worker.worker_id, now), b"", quota)


def _placed(chosen: str, workers: Sequence[W]) -> W:
    """Placement's choice among ``workers``; the reception when it names none of them (a policy that
    answered with a worker that is not routable, or a bug of its own: never a request sent nowhere)."""
    for worker in workers:
        if worker.worker_id == chosen:
            return worker
    return workers[0]
