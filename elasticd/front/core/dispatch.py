"""Where a request goes, decided with no I/O: route → (a user being moved: hold) → quota → sticky lookup → the user's
group (``groups``) → admission by capacity readings → placement, giving a ``Forward`` (the worker, the user, its
surface entry, a Set-Cookie line for a new user, the group), a ``Moving`` (the user is being moved: the request waits
in the front until the move ends), a ``Wake`` (the group is at zero workers and one is starting: the request waits
for it), a ``NoRoom`` (every worker the request may go to says it is full — a capacity reading, seed 001: it waits
briefly for room, then is answered 503) or a ``Refuse`` (status, text, Retry-After). Time is passed in. It changes
only the core's own books: the quota's gate and bucket (an admitted request is counted in flight), the surface (a
new or re-placed user), the refusal and routing counts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import NamedTuple, TypeVar

from elasticd.front.core.counters import ForwardCounters, RouteStats
from elasticd.front.core.groups import DEFAULT, STICKY, choose_group
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

__all__ = ["Forward", "Full", "Moving", "NoRoom", "Queued", "Refuse", "Target", "Wake", "WorkersOf", "decide",
           "has_room"]


class Target:
    """What a Host header resolved to: the route, its stats and its tenant's quota (the shell caches these
    per Host value)."""

    __slots__ = ("quota", "route", "stats")

    def __init__(self, route: AppRoute, stats: RouteStats, quota: TenantQuota | None) -> None:
        self.route = route
        self.stats = stats
        self.quota = quota


# (worker, user, its surface entry — None for a new user, put on the surface by its cookie later —, the
# Set-Cookie line for a new user else b"", the quota admitted into — one in flight until the exchange settles —,
# the group). A plain tuple: this is made for every request, and a NamedTuple's __new__ is a Python call.
W = TypeVar("W", bound=RoutableWorker)
Forward = tuple[W, str, SurfaceUser | None, bytes, TenantQuota | None, str]

# (tenant, app, group) → the group's routable workers, the reception first (the front's WorkersFn)
WorkersOf = Callable[[str, str, str], Sequence[W]]


class Refuse(NamedTuple):
    status: int
    text: str
    retry_after: int | None


class Moving(NamedTuple):
    """The request's user is being moved: park it, unforwarded, until the move ends (then decide again). Parked
    before the quota is asked: a request waiting for a move takes no concurrency slot."""

    user: str


# worker or node id → (until when it takes nothing, the Retry-After a refused client is told, how long a request
# may wait for room): the capacity readings that say full, kept by the probes' shell; empty in the common case.
Full = Mapping[str, tuple[float, int, float]]


class NoRoom(NamedTuple):
    """Admission: the worker a sticky user lives on (``key``: its id) or every worker of the group a new user may
    go to (``key``: "tenant/app/group") says it is full. Park the request until one has room, at most ``wait``
    seconds, then answer 503 with ``retry_after``. Its quota slot was given back."""

    key: str
    retry_after: int
    wait: float


class Queued:
    """Every worker the request may go to has as many requests in flight as its group's ``concurrency``: it waits
    in the group's queue (``key``: "tenant/app/group") for a slot on ``wants`` (a sticky user's worker: its state
    lives there) or, "", on any worker of the group; within the group's ``queue`` bounds, else 503. Its quota slot
    was given back.

    (A class, not a NamedTuple as the other outcomes: with the group's concurrency reached, every request is
    ``Queued`` once, and a NamedTuple's ``__new__`` is a Python function where this one, compiled, is a C call.)"""

    __slots__ = ("key", "wants")

    def __init__(self, key: str, wants: str) -> None:
        self.key = key
        self.wants = wants

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Queued) and (self.key, self.wants) == (other.key, other.wants)

    def __hash__(self) -> int:
        return hash((self.key, self.wants))

    def __repr__(self) -> str:
        return f"Queued(key={self.key!r}, wants={self.wants!r})"


class Wake(NamedTuple):
    """The request's group has no worker (scaled to zero) and one is starting for it: hold the request until
    that worker is routable (then decide again), at most ``request_timeout``. Its quota slot was given back."""

    key: tuple[str, str, str]


def decide(target: Target | None, head: RequestHead, now: float, workers_of: WorkersOf[W],
           unroutable: Collection[str], surface: Surface, place: PlaceFn, forwards: ForwardCounters,
           kept: Callable[[str], W | None] | None = None,
           wake: Callable[[tuple[str, str, str]], bool] | None = None,
           full: Full | None = None,
           saturated: Collection[str] = ()) -> Forward[W] | Moving | Refuse | Wake | NoRoom | Queued:
    """``workers_of``: a group's routable workers (reception first); ``unroutable``: those the front found dead
    since; ``kept``: a worker being emptied (not routable: it takes no one new) by its id, while it still
    serves the users pinned to it; ``wake``: asked when the user's group has no worker (True: one is starting:
    wait for it); ``full``: the workers whose capacity reading refuses (``Full``); ``saturated``: the workers with
    as many requests in flight as their concurrency (the request waits in the group's queue rather than go there).

    The steps, in order: the app (404); the user and a move under way (``Moving``, before the quota: a request
    waiting for a move takes no slot); the quota (429/503); then ``_route``. Whatever ``_route`` answers other
    than a forward gives the quota slot back, here and only here: a refusal added later cannot leak one."""
    if target is None:
        host = head.host.decode("latin-1") if head.host is not None else "(none)"
        return Refuse(404, f"no app for host {host}", None)
    cookie = head.cookie
    user = user_from_cookie(cookie) if cookie is not None else None
    entry = surface.users.get(user) if user is not None else None
    if entry is not None and entry.moving:
        assert user is not None
        return Moving(user)
    quota = target.quota
    if quota is not None:
        refusal = quota.admit(now)
        if refusal is not None:
            route = target.route
            forwards.refused(route.tenant, refusal.reason)
            target.stats.answered(refusal.status)
            why = "too many requests at once" if refusal.reason == CONCURRENCY else "request rate over quota"
            return Refuse(refusal.status, f"{route}: {why}", refusal.retry_after)
    outcome = _route(target, head, now, user, entry, workers_of, unroutable, surface, place, forwards, kept, wake,
                     full, saturated)
    if quota is not None and type(outcome) is not tuple:  # (a forward is a plain tuple; the others are named)
        quota.leave()
    return outcome


def _route(target: Target, head: RequestHead, now: float, user: str | None, entry: SurfaceUser | None,
           workers_of: WorkersOf[W], unroutable: Collection[str], surface: Surface, place: PlaceFn,
           forwards: ForwardCounters, kept: Callable[[str], W | None] | None,
           wake: Callable[[tuple[str, str, str]], bool] | None,
           full: Full | None, saturated: Collection[str]) -> Forward[W] | Refuse | Wake | NoRoom | Queued:
    """An admitted request: its user's group, the group's workers, admission by capacity readings, the queue, and
    placement — a new user on the reception (placement's choice), a returning one on its worker, the rest
    ``_place_again``."""
    route, quota = target.route, target.quota
    fresh = user is None  # (a new user's id is made when it is needed: a request that waits is decided again)
    # The user's group. The two common cases inline (a request pays no call for them): a returning user on the
    # app's default group, a new user of an app without a canary.
    if entry is not None and entry.group and entry.group == route.group:
        group, counted = entry.group, ""
    elif fresh and route.canary is None:
        group, counted = route.group, DEFAULT
    else:
        if user is None:
            user = new_user_id()  # (a canary's share is chosen by it)
        group, counted = _group_of(route, surface, user, entry, fresh)
    workers = workers_of(route.tenant, route.app, group)
    if unroutable:
        workers = [w for w in workers if w.worker_id not in unroutable]
    if not workers:
        return _no_worker(route, target.stats, now, user or "", entry, group, quota, kept, wake, unroutable)
    if full:
        admitted = _admission(full, now, workers, route, group, entry)
        if isinstance(admitted, NoRoom):
            return admitted
        workers = admitted
    if saturated:
        roomy = _unsaturated(saturated, workers, route, group, entry)
        if isinstance(roomy, Queued):
            return roomy
        workers = roomy
    if counted:
        if counted is DEFAULT:  # (most of them, every cookieless request: counted per app, no tuple made)
            defaults = target.stats.defaults
            defaults[group] = defaults.get(group, 0) + 1
        else:
            forwards.routed(route.tenant, route.app, group, counted)
    if user is None:
        user = new_user_id()
    if fresh:
        chosen = place(None, surface, workers)
        first = workers[0]  # the reception, nearly always placement's choice for a new user: no search
        worker = first if chosen == first.worker_id else _placed(chosen, workers)
        return (worker, user, None, set_cookie_line(user, head.secure), quota, group)
    if entry is not None:
        if entry.group != group:
            entry.group = group  # chosen again (after a logout, or its group went): it stays there from now on
            entry.app = route.label
        wanted = entry.worker
        for candidate in workers:
            if candidate.worker_id == wanted:
                entry.seen = now
                return (candidate, user, entry, b"", quota, group)
    return _place_again(target, now, user, entry, group, workers, surface, place, kept, unroutable, full)


def _place_again(target: Target, now: float, user: str, entry: SurfaceUser | None, group: str,
                 workers: Sequence[W], surface: Surface, place: PlaceFn, kept: Callable[[str], W | None] | None,
                 unroutable: Collection[str], full: Full | None) -> Forward[W] | NoRoom:
    """A user new on the surface (its cookie from before a restart, or expired), or whose worker went: still served
    where it waits to be moved off (pinned), else (re-)placed in its group, among the workers with room."""
    route, quota = target.route, target.quota
    keeping = _kept(entry, kept, unroutable)
    if keeping is not None:
        assert entry is not None
        entry.seen = now
        return (keeping, user, entry, b"", quota, group)
    if full:
        roomy = _roomy(full, now, workers, route, group)
        if isinstance(roomy, NoRoom):  # (its group choice, counted before, is counted again when it goes: rare)
            return roomy
        workers = roomy
    worker = _placed(place(user, surface, workers), workers)
    return (worker, user, surface.assign(user, worker.worker_id, now, group, route.label), b"", quota, group)


def _group_of(route: AppRoute, surface: Surface, user: str, entry: SurfaceUser | None, fresh: bool) -> tuple[str, str]:
    """The user's group, and the reason to count when its choice is one ("" when not). Where the surface placed it
    (the common case: the default group, one comparison), else the canary's share or the default; a new placement
    and a user kept on an old group are counted (once the request is forwarded: a request that waits for a cold
    start is decided, and counted, when it goes)."""
    if entry is not None:
        placed = entry.group
    elif not fresh and surface.newcomers:
        placed = surface.newcomers.group_of(user)  # back with the cookie of its first request: it stays there
    else:
        placed = ""
    if placed and placed == route.group:
        return placed, ""
    if not placed and route.canary is None:
        return route.group, DEFAULT  # a new user of an app without a canary: no choice to make
    group, reason = choose_group(route, user, placed)
    return group, reason if reason is STICKY or placed != group else ""


def _no_worker(route: AppRoute, stats: RouteStats, now: float, user: str, entry: SurfaceUser | None, group: str,
               quota: TenantQuota | None, kept: Callable[[str], W | None] | None,
               wake: Callable[[tuple[str, str, str]], bool] | None,
               unroutable: Collection[str]) -> Forward[W] | Refuse | Wake:
    """The group has no routable worker: a pinned user still goes to the worker it waits on; else wait for a
    worker that is starting (``Wake``), or 503."""
    keeping = _kept(entry, kept, unroutable)
    if keeping is not None:
        assert entry is not None
        entry.seen = now
        return (keeping, user, entry, b"", quota, entry.group or group)
    key = (route.tenant, route.app, group)
    if wake is not None and wake(key):
        return Wake(key)
    stats.answered(503)
    return Refuse(503, f"{route}: no worker available", 1)


def _admission(full: Full, now: float, workers: Sequence[W], route: AppRoute, group: str,
               entry: SurfaceUser | None) -> Sequence[W] | NoRoom:
    """Admission (seed 001): a worker whose own reading says it is full takes nothing, whatever the front counts
    open on it. A user stuck to a full one waits for room there (its state lives there); a user to be placed is
    placed among those with room (``_roomy``). A reading never admits what was refused otherwise: only the
    routable are looked at. A returning user whose worker has room pays one dict lookup."""
    if entry is not None and entry.worker:
        refused = full.get(entry.worker)
        if refused is not None and refused[0] > now and any(w.worker_id == entry.worker for w in workers):
            return NoRoom(entry.worker, refused[1], refused[2])
        return workers
    if entry is None:
        return _roomy(full, now, workers, route, group)
    return workers


def _roomy(full: Full, now: float, workers: Sequence[W], route: AppRoute, group: str) -> Sequence[W] | NoRoom:
    """The workers a user may be placed on: those with room; a ``NoRoom`` for the group when none has."""
    roomy = [w for w in workers if (refused := full.get(w.worker_id)) is None or refused[0] <= now]  # (has_room)
    if roomy:
        return roomy if len(roomy) != len(workers) else workers
    refusals = [full[w.worker_id] for w in workers]
    return NoRoom(f"{route.tenant}/{route.app}/{group}", min(r[1] for r in refusals), max(r[2] for r in refusals))


def _unsaturated(saturated: Collection[str], workers: Sequence[W], route: AppRoute, group: str,
                 entry: SurfaceUser | None) -> Sequence[W] | Queued:
    """The queue: a user whose worker is saturated waits for a slot there (its state lives there); another is
    placed among the workers that are not, and waits for any when every one is."""
    if entry is not None and entry.pinned:
        return workers  # it waits where it is emptied from, in its turn to be moved off (``_kept``)
    wanted = entry.worker if entry is not None else ""
    if wanted and wanted in saturated and any(w.worker_id == wanted for w in workers):
        return Queued(f"{route.tenant}/{route.app}/{group}", wanted)
    roomy = [w for w in workers if w.worker_id not in saturated]
    if not roomy:
        return Queued(f"{route.tenant}/{route.app}/{group}", "")
    return roomy if len(roomy) != len(workers) else workers


def has_room(full: Full, worker: str, now: float) -> bool:
    """The worker takes requests: no reading says it is full, or that reading's time is over."""
    refused = full.get(worker)
    return refused is None or refused[0] <= now


def _kept(entry: SurfaceUser | None, kept: Callable[[str], W | None] | None, unroutable: Collection[str]) -> W | None:
    """The worker a pinned user waits on while it is emptied (it waits its turn to be moved off, there), or None:
    not pinned, no such worker kept, or that worker found dead."""
    if entry is None or not entry.pinned or kept is None or entry.worker in unroutable:
        return None
    return kept(entry.worker)


def _placed(chosen: str, workers: Sequence[W]) -> W:
    """Placement's choice among ``workers``; the reception when it names none of them (a policy that
    answered with a worker that is not routable, or a bug of its own: never a request sent nowhere)."""
    for worker in workers:
        if worker.worker_id == chosen:
            return worker
    return workers[0]
