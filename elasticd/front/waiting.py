"""Requests that wait in the front, unforwarded: of a user being moved (until the move ends), for a group at zero
workers (until one comes up), for room (until a worker's capacity reading has some), or in the group's queue (for
a free slot: ``queueing.FrontQueue``, which this part holds). The parking lot is ``core/parking.py``; this part
parks what dispatch says must wait, lets it go when its reason ends (``release``, ``woke``, ``room``, the tick), and
answers it when its patience runs out.

A request let go is dispatched again from its client connection (``ClientConn.released``), as if it had just come:
it is decided anew under the routes, workers and readings of that moment, never sent where it was decided to go
before it waited. Its client may have left meanwhile: such a request is skipped, never answered twice.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

from elasticd.front.client import ClientConn
from elasticd.front.core.counters import QUEUE_NO_WORKER, ForwardCounters
from elasticd.front.core.dispatch import Moving, NoRoom, Queued, Target, Wake, has_room
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.parking import PARKED_FULL, PARKED_MOVE, PARKED_QUEUE, PARKED_WAKE, Parked, ParkingLot
from elasticd.front.core.relay import EVENT_PARK, EVENT_RELEASE, PHASE_PARKED
from elasticd.front.core.sticky import Surface
from elasticd.front.links import FrontSide
from elasticd.front.queueing import FrontQueue
from elasticd.front.upstream import Upstream

__all__ = ["WaitingRequests"]

log = logging.getLogger("elasticd.front")

_WAKE_RETRY_AFTER: Final = 5  # seconds a client is told to wait after a cold start that did not come up
_TICKED: Final = (PARKED_WAKE, PARKED_FULL)  # the reasons the tick may end (a move's end is the move's to say)


def _group_name(key: tuple[str, str, str]) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}"


class WaitingRequests:
    __slots__ = ("_workers", "clock", "forwarding", "forwards", "full", "on_queued", "parked", "queue", "surface",
                 "unroutable")

    # The request path (``forwarding.Forwarding``: the routes in force, a Host's target), given by the front once
    # both exist (each needs the other).
    forwarding: FrontSide

    def __init__(self, workers: Callable[[str, str, str], Sequence[Upstream]], forwards: ForwardCounters,
                 surface: Surface, unroutable: set[str], full: dict[str, tuple[float, int, float]],
                 clock: Callable[[], float]) -> None:
        self._workers = workers
        self.forwards = forwards
        self.surface = surface
        self.unroutable = unroutable  # (worker_health's, read here: whether a group has a worker to go to)
        self.full = full  # (worker_health's too: whether a worker has room)
        self.clock = clock
        self.parked: ParkingLot[ClientConn] = ParkingLot()
        self.queue = FrontQueue(self)  # the group queues' bounds, hand-overs and timeouts
        forwards.on_free = self.queue.slot_free
        # A request was queued for a group (every routable worker at its concurrency): the pool's burst check.
        self.on_queued: Callable[[tuple[str, str, str]], None] | None = None

    def workers_of(self, tenant: str, app: str, group: str) -> Sequence[Upstream]:
        return self._workers(tenant, app, group)

    # ------------------------------------------------------------------ in

    def hold(self, decision: Moving | Wake | NoRoom | Queued, target: Target | None, client: ClientConn,
             ex: Exchange, now: float) -> None:
        """Dispatch said ``ex`` waits: parked by its reason (or answered 503 here, its group's queue full)."""
        if isinstance(decision, Queued):
            assert target is not None
            self.queue.enqueue(decision, target, client, ex, now)
            return
        if isinstance(decision, Wake):
            name = _group_name(decision.key)
            assert target is not None
            if self.queue.admits(name, target, decision.key[2], client, ex):
                ex.advance(EVENT_PARK)
                ex.ts = now  # (its wait is counted from here; a forward sets ts anew)
                self.parked.park(PARKED_WAKE, name, client, ex, now)
            return
        ex.advance(EVENT_PARK)
        if isinstance(decision, Moving):
            self.parked.park(PARKED_MOVE, decision.user, client, ex, now)
        else:
            self.parked.park(PARKED_FULL, decision.key, client, ex, now, retry_after=decision.retry_after,
                             wait=decision.wait)

    # ------------------------------------------------------------------ out: a reason ended

    def release(self, user: str) -> int:
        """A move of ``user`` ended: it is forwarded again, and its parked requests are dispatched, oldest first,
        to wherever it is now (its new worker, or its old one after an abort). Returns how many went."""
        self.surface.unflag(user)
        return self._dispatch_parked(self.parked.release(PARKED_MOVE, user), user)

    def woke(self, key: tuple[str, str, str]) -> int:
        """A worker of the group became routable: the requests waiting for one (a cold start, a restart) are
        dispatched, oldest first, and the group's queue gets the new worker's slots."""
        name = _group_name(key)
        woken = self.parked.release(PARKED_WAKE, name)
        if woken:
            stats, now = self.forwards.queue(name), self.clock()
            for _, ex in woken:
                stats.waited(now - ex.ts)
        went = self._dispatch_parked(woken, name)
        if self.parked.holds(PARKED_QUEUE, name):
            went += self.queue.drain(name)
        return went

    def wake_failed(self, key: tuple[str, str, str], why: str) -> int:
        """The group's worker did not come up (its start failed, or not within ``request_timeout``): each
        request waiting for it is answered 503 with a Retry-After."""
        name = _group_name(key)
        waited = self.parked.release(PARKED_WAKE, name)
        if waited:
            stats, now = self.forwards.queue(name), self.clock()
            for _, ex in waited:
                stats.waited(now - ex.ts)
                stats.refuse(QUEUE_NO_WORKER)
        return self.answer_parked(waited, name, 503, f"{key[0]}/{key[1]}: group {key[2]}: {why}", _WAKE_RETRY_AFTER)

    def room(self, worker_id: str, group: tuple[str, str, str]) -> int:
        """A worker (or node) of ``group`` takes requests again: its waiting users' requests, and those of new
        users waiting for any worker of the group, are dispatched, oldest first."""
        released = 0
        for key in (worker_id, _group_name(group)):
            if self.parked.holds(PARKED_FULL, key):
                released += self._dispatch_parked(self.parked.release(PARKED_FULL, key), key)
        return released

    def answer_parked(self, parked: list[tuple[ClientConn, Exchange]], what: str, status: int, text: str,
                      retry_after: int) -> int:
        """Parked requests answered by the front (with ``status``), oldest first."""
        answered = 0
        for client, ex in parked:
            if client.transport is None or ex.phase is not PHASE_PARKED:
                continue  # the client left meanwhile
            try:
                ex.advance(EVENT_RELEASE)
                target = self.forwarding.target(ex.head.host)
                if target is not None:
                    target.stats.answered(status)  # (answered now: a parked request was counted nowhere yet)
                client.refuse_released(ex, status, text, retry_after)
            except Exception as exc:  # a bug of ours with one request must not strand the others
                log.exception("front: answering a request waiting for %s failed", what)
                client.fail_closed(exc)
                continue
            answered += 1
        return answered

    def _dispatch_parked(self, parked: list[tuple[ClientConn, Exchange]], what: str) -> int:
        released = 0
        for client, ex in parked:
            if client.transport is None or ex.phase is not PHASE_PARKED:
                continue  # the client left meanwhile
            try:
                ex.advance(EVENT_RELEASE)
                client.released(ex)
            except Exception as exc:  # a bug of ours with one request must not strand the others
                log.exception("front: releasing a parked request of %s failed", what)
                client.fail_closed(exc)
                continue
            released += 1
        return released

    # ------------------------------------------------------------------ the front's tick

    def tick(self, now: float, request_timeout: float, move_timeout: float) -> None:
        """Every parked request whose reason is over goes (a cold start's worker that joined its group after a
        reload's launch, a reading whose time ran out: a release that no event named); one whose patience ran out
        is answered, or released, by its reason's rule."""
        parked = self.parked
        for reason in _TICKED:
            for key in parked.keys(reason):
                if self._may_go(reason, key, now):
                    self._dispatch_parked(parked.release(reason, key), key)
                    continue
                if reason is PARKED_FULL:  # each request after its reading's own wait
                    retry_after, wait = parked.terms(reason, key)
                    overdue = parked.release_older(reason, key, now - wait)
                    if overdue:
                        what = f"group {key}: every worker" if "/" in key else f"{key}"
                        self.answer_parked(overdue, key, 503, f"{what} says it is full (its capacity reading)",
                                           retry_after)
        for name in parked.overdue(PARKED_WAKE, now, request_timeout):
            tenant, app, group = name.split("/")
            log.warning("front: group %s did not get a routable worker within the request timeout (%gs): "
                        "its waiting requests are answered 503", name, request_timeout)
            self.wake_failed((tenant, app, group), f"no worker came up within {request_timeout:g}s")
        for user in parked.overdue(PARKED_MOVE, now, move_timeout + 1.0):
            # The move's own deadline should have released them: whatever became of it, they go on.
            log.warning("front: requests of %s parked past the move timeout (%gs): released", user, move_timeout)
            self.release(user)
        if parked.count(PARKED_QUEUE):
            self.queue.tick(now)
        self.queue.forget_asked(now)

    def _may_go(self, reason: Parked, key: str, now: float) -> bool:
        """Whether the requests parked under (``reason``, ``key``) may be decided again now (a MOVE's end is the
        move's to say, never the tick's)."""
        if reason is PARKED_WAKE:
            tenant, app, group = key.split("/")
            if not any(group in (r.groups or {r.group}) for r in self.forwarding.routes.routes()
                       if (r.tenant, r.app) == (tenant, app)):
                return True  # a reload removed the group: decided again under the table in force
            return any(w.worker_id not in self.unroutable for w in self._workers(tenant, app, group))
        if "/" in key:  # FULL, a new user's: any worker of the group with room
            tenant, app, group = key.split("/")
            return any(w.worker_id not in self.unroutable and has_room(self.full, w.worker_id, now)
                       for w in self._workers(tenant, app, group))
        return has_room(self.full, key, now)
