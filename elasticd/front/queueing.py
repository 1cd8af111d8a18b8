"""The group queue's shell: requests that wait in the front for a slot (core/parking.py's QUEUE) or for a worker
that is coming (its WAKE), under the group's ``queue: {max, timeout}``.

Who decides what: dispatch (pure) says a request is ``Queued`` (every worker it may go to is saturated:
``ForwardCounters.saturated``); this module bounds it (``queue.max`` waiting, WAKE and QUEUE together, else 503
at once), parks it, hands a freed slot to the oldest request that wants that worker or any, answers 503 those that
waited ``queue.timeout``, counts waits and refusals (``QueueStats``), and tells the pool a request queued (its burst
check: at once for a group's first, then at most every ``BURST_ASK_EVERY`` while the group's requests keep queueing).

Why a freed slot is handed over in a later turn of the loop, with the worker kept saturated meanwhile: the slot
comes free inside an exchange's end (an answer relayed, a connection lost), which is no place to dispatch another
client's request; and were the worker unsaturated at once, a request arriving in between would take the slot
ahead of those that waited. So ``slot_free`` keeps the worker in ``saturated`` and schedules ``drain``, which
unsaturates the group's workers that have room and dispatches, oldest first, as many waiting requests as fit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from elasticd.front.core.counters import QUEUE_FULL, QUEUE_TIMEOUT, WorkerCounters
from elasticd.front.core.dispatch import Queued, Target
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.parking import PARKED_QUEUE, PARKED_WAKE
from elasticd.front.core.relay import EVENT_PARK, EVENT_REFUSE, EVENT_RELEASE, PHASE_PARKED, RelayError

if TYPE_CHECKING:
    from elasticd.front.client import ClientConn
    from elasticd.front.core.counters import ForwardCounters
    from elasticd.front.core.parking import ParkingLot
    from elasticd.front.upstream import Upstream


class QueueHost(Protocol):
    """What the queue needs of the part that holds it (waiting.WaitingRequests), named here so the two modules do
    not import each other."""

    parked: ParkingLot[ClientConn]
    forwards: ForwardCounters
    unroutable: set[str]
    on_queued: Callable[[tuple[str, str, str]], None] | None

    def clock(self) -> float: ...

    def workers_of(self, tenant: str, app: str, group: str) -> Sequence[Upstream]: ...

    def answer_parked(self, parked: list[tuple[ClientConn, Exchange]], what: str, status: int, text: str,
                      retry_after: int) -> int: ...

__all__ = ["BURST_ASK_EVERY", "QUEUE_RETRY_AFTER", "FrontQueue", "QueueHost"]

log = logging.getLogger("elasticd.front")

# Seconds between two burst checks asked for one group while its requests keep queueing (the first queued request
# asks at once). The check is the pool's, in Python: asked for every queued request, a tenant flooding a saturated
# group would have the daemon run it at the rate of its requests (4 % of the daemon's CPU at 16,000 requests a second
# through one group of concurrency 4, measured with py-spy), where a new worker takes a second to come up and each
# worker's report asks it again anyway.
BURST_ASK_EVERY: Final = 0.05

# Seconds a client refused by a queue is told to wait: a full queue empties at the group's rate, and the burst
# scale-up has a worker starting already; a longer Retry-After would idle clients that could be served sooner.
QUEUE_RETRY_AFTER: Final = 1


class FrontQueue:
    __slots__ = ("_asked", "_host", "_loop", "_scheduled", "_workers_of", "clock", "forwards", "parked", "unroutable")

    def __init__(self, host: QueueHost) -> None:
        self._host = host
        # What every hand-over reads, bound once (each is changed in place by its owner, never replaced): read
        # through the protocol, each would be an attribute looked up by name (the compiled front's fast path is
        # for its own classes' attributes, and a protocol is not one).
        self.parked = host.parked
        self.forwards = host.forwards
        self.unroutable = host.unroutable
        self.clock = host.clock
        self._workers_of = host.workers_of
        self._scheduled: set[str] = set()  # groups whose drain waits for the loop's next turn
        self._loop: asyncio.AbstractEventLoop | None = None  # the front's, known at the first hand-over
        self._asked: dict[str, float] = {}  # group → when its burst check was last asked (BURST_ASK_EVERY)

    # ------------------------------------------------------------------ in

    def admits(self, key: str, target: Target, group: str, client: ClientConn, ex: Exchange) -> bool:
        """Whether one more request may wait for the group ``key``; if not, it is answered 503 here."""
        most = target.route.queue_of(group)[0]
        depth = self.parked.depth(key)
        if depth < most:
            return True
        self.forwards.queue(key).refuse(QUEUE_FULL)
        target.stats.answered(503)
        ex.advance(EVENT_REFUSE)
        client.answer(ex, 503, f"{target.route}: group {group}: {depth} requests wait already (its queue.max)",
                      retry_after=QUEUE_RETRY_AFTER)
        return False

    def enqueue(self, queued: Queued, target: Target, client: ClientConn, ex: Exchange, now: float) -> None:
        group = queued.key.rsplit("/", 1)[1]
        if not self.admits(queued.key, target, group, client, ex):
            return
        ex.advance(EVENT_PARK)
        ex.ts = now  # (when it came into the queue: its wait is counted from here; a forward sets ts anew)
        self.parked.park(PARKED_QUEUE, queued.key, client, ex, now, wants=queued.wants,
                         wait=target.route.queue_of(group)[1])
        told = self._host.on_queued
        if told is not None:
            key = queued.key
            asked = self._asked.get(key)
            if asked is not None and now - asked < BURST_ASK_EVERY:
                return  # asked for this group a moment ago; the queue's depth is read again at the next ask
            self._asked[key] = now
            route = target.route
            try:
                told((route.tenant, route.app, group))
            except Exception:  # the pool's check must not fail the request: it waits in the queue regardless
                log.exception("front: the burst check for %s failed", key)

    def forget_asked(self, now: float) -> None:
        """The groups whose burst check was asked longer than BURST_ASK_EVERY ago are forgotten (the front's tick):
        the book holds only the groups queueing now, not every group that ever did."""
        if self._asked:
            self._asked = {key: at for key, at in self._asked.items() if now - at < BURST_ASK_EVERY}

    # ------------------------------------------------------------------ out

    def slot_free(self, counters: WorkerCounters) -> bool:
        """ForwardCounters.on_free: True when the worker may leave ``saturated`` now (nothing waits for its group);
        else its group's drain is scheduled and the worker stays saturated until then."""
        key = counters.group
        if not key or not self.parked.holds(PARKED_QUEUE, key):
            return True
        self.schedule(key)
        return False

    def schedule(self, key: str) -> None:
        if key not in self._scheduled:
            self._scheduled.add(key)
            loop = self._loop
            if loop is None:
                # (asked once, not per hand-over: on Python 3.11 get_running_loop() checks the process id with a
                # getpid() system call each time, 0.2 µs)
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._drain_scheduled, key)

    def _drain_scheduled(self, key: str) -> None:
        self._scheduled.discard(key)
        try:
            self.drain(key)
        except Exception:  # a bug of ours with one group must not stop the queue of every other
            log.exception("front: giving the group %s's free slots to its queue failed", key)

    def drain(self, key: str) -> int:
        """The group's workers with room leave ``saturated``; then its waiting requests that can go now are
        dispatched, oldest first (each takes its slot as it is forwarded), until no worker of the group has room.
        Returns how many went."""
        forwards = self.forwards
        saturated = forwards.saturated
        counted = forwards.workers
        routable: list[str] = []
        for worker in self._routable(key):
            worker_id = worker.worker_id
            counters = counted.get(worker_id)
            if counters is not None and counters.in_flight < counters.concurrency:
                saturated.discard(worker_id)
            routable.append(worker_id)
        parked = self.parked
        went = 0
        for _ in range(parked.depth(key)):  # (bounded: a request that parks again is not taken twice)
            # The workers with room now (each forward may fill one): with none, nothing waiting may go. Asked
            # before each take, so a freed slot costs one look at the queue's head, never a scan of the queue.
            free = [worker_id for worker_id in routable if worker_id not in saturated]
            if not free:
                break
            found = parked.take_first(PARKED_QUEUE, key, free, routable)
            if found is None:
                break
            client, ex, _came = found
            if client.transport is None or ex.phase is not PHASE_PARKED:
                continue  # the client left meanwhile
            forwards.queue(key).waited(self.clock() - ex.ts)
            try:
                ex.advance(EVENT_RELEASE)
                client.released(ex)
            except RelayError as exc:
                client.fail_closed(exc)
                continue
            went += 1
        return went

    def _routable(self, key: str) -> Sequence[Upstream]:
        tenant, app, group = key.split("/")
        unroutable = self.unroutable
        return [w for w in self._workers_of(tenant, app, group) if w.worker_id not in unroutable]

    # ------------------------------------------------------------------ the tick

    def tick(self, now: float) -> None:
        """Each group's requests that waited its ``queue.timeout`` are answered 503; then whatever room there is
        goes to the rest (a release no event named: a raised concurrency, a worker that joined)."""
        parked = self.parked
        for key in parked.keys(PARKED_QUEUE):
            timeout = parked.terms(PARKED_QUEUE, key)[1]
            overdue = parked.release_older(PARKED_QUEUE, key, now - timeout)
            if overdue:
                stats = self.forwards.queue(key)
                for _, ex in overdue:
                    stats.waited(now - ex.ts)
                    stats.refuse(QUEUE_TIMEOUT)
                self._host.answer_parked(overdue, key, 503, f"group {key}: no worker had a free slot within its "
                                   f"queue.timeout ({timeout:g}s)", QUEUE_RETRY_AFTER)
            self.drain(key)

    def depths(self) -> dict[str, int]:
        """Requests waiting per group (for the metrics page: a copy, read from its thread)."""
        parked = self.parked
        return {key: parked.depth(key) for key in {*parked.keys(PARKED_QUEUE), *parked.keys(PARKED_WAKE)}}
