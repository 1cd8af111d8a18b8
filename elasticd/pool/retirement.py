"""ACT: taking workers out of a group — compaction's, the idle retire's, an operator's drain and a recycle. The
decisions were made before (``ledger``, ``idle``, ``drain``, ``recycling``); this carries them out, over time:

- a worker taken out gets no new requests at once (``Flight.drain``: the routable lists leave it out);
- its users move off, one at a time, idle ones first (live moves, ``evacuate``), or are re-pointed when there is
  no live mover; the first move that fails stops the emptying and the worker serves again;
- then it is retired: whatever is open on it (requests, WebSocket tunnels) may finish, up to the group's
  ``drain_timeout``, then the supervisor stops it;
- a cold start owed to a request that arrived meanwhile (``cap.py``: its room was a retiring worker's) begins
  once the worker has stopped (``after_retire``).

Every step runs as one of the pool's tasks (``spawn``): an admin client that gave up does not stop a drain half
way; elasticd stopping does, and a worker one of them was stopping stays in the supervisor's registry until its
stop_all finishes it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from elasticd.pool.drain import drain_verdict, refused_while_stopping, replacement_for_drain
from elasticd.pool.emptying import Evacuation, PoolMover, evacuate
from elasticd.pool.group_record import GroupRecord
from elasticd.pool.ledger import CompactionSteps, plan_evacuation
from elasticd.pool.policy import PoolDecision, WorkerView
from elasticd.pool.ports import GroupKey, PoolForwards, PoolSupervisor, PoolSurface
from elasticd.pool.recycling import recycle_reason, requests_limit
from elasticd.pool.user_loads import user_loads

__all__ = ["Retirement"]

log = logging.getLogger("elasticd.pool")

_DRAIN_POLL = 0.1  # seconds between two looks at what is still open on a draining worker
# Seconds a drain's replacement has to become routable. A replacement starts under its tenant's cpu.max, beside the
# worker it replaces: in the VM, under a 30 % cpu.max on a slow day, one took 55 s to listen, and a give-up at 30 s
# left the recycled worker serving on past its max_rss, beside its replacement, for good.
_ROUTABLE_TIMEOUT = 120.0


class Retirement:
    __slots__ = ("_after_retire", "_clock", "_forwards", "_spawn", "_supervisor", "_surface", "_tunnels",
                 "_user_tunnels", "_views", "move_timeout", "mover")

    def __init__(self, supervisor: PoolSupervisor, surface: PoolSurface, forwards: PoolForwards, *,
                 tunnels: Callable[[], Mapping[str, int]], user_tunnels: Callable[[str], int],
                 views: Callable[[GroupKey, GroupRecord], list[WorkerView]],
                 spawn: Callable[[Coroutine[Any, Any, Any], str | None], asyncio.Task[Any]],
                 after_retire: Callable[[GroupKey, GroupRecord], None], clock: Callable[[], float],
                 move_timeout: float) -> None:
        self._supervisor = supervisor
        self._surface = surface
        self._forwards = forwards
        self._tunnels = tunnels
        self._user_tunnels = user_tunnels  # a user's open tunnels: it is moved once they closed
        self._views = views  # the group's routable workers less those being drained, the reception first
        self._spawn = spawn
        self._after_retire = after_retire
        self._clock = clock
        self.move_timeout = move_timeout
        # Live moves (pool/mover.py), set by the daemon once the channel exists; without one, compaction
        # re-points users (their in-process state is then lost).
        self.mover: PoolMover | None = None

    # ------------------------------------------------------------------ compaction and the idle retire

    def compact(self, key: GroupKey, record: GroupRecord, retire: str, steps: CompactionSteps) -> None:
        if steps.repoint is not None:
            record.flight.drain({retire})
            now = self._clock()
            for user, target in steps.repoint.items():
                self._surface.assign(user, target, now)
            log.info("pool %s: compaction: draining %s (%d users re-pointed)", "/".join(key), retire,
                     len(steps.repoint))
            self._spawn(self.retire(key, record, retire), None)
            return
        self._begin_emptying(record, retire, [user for user, _ in steps.moves])
        log.info("pool %s: compaction: draining %s (%d users to move)", "/".join(key), retire, len(steps.moves))
        self._spawn(self._empty_then_retire(key, record, retire, steps.moves), None)

    def retire_all(self, key: GroupKey, record: GroupRecord, worker_ids: Sequence[str], why: str) -> None:
        """The idle retire: every worker of a group at a floor of zero that nobody uses."""
        log.info("pool %s: %s; retiring %s", "/".join(key), why, ", ".join(worker_ids))
        record.flight.drain(set(worker_ids))
        for worker_id in worker_ids:
            self._spawn(self.retire(key, record, worker_id, why), None)

    # ------------------------------------------------------------------ an operator's drain

    def drain(self, key: GroupKey, record: GroupRecord, worker_id: str,
              recycled: str | None = None) -> asyncio.Task[Evacuation]:
        """Begin ``elasticctl drain`` (or a recycle: ``recycled`` says why): reserved before anything is awaited (a
        second drain of it is refused)."""
        views = self._views(key, record)
        loads = self.user_loads(record, views).get(worker_id, {})
        users = [user for user, _ in self._surface.on(worker_id)]
        self._begin_emptying(record, worker_id, users)
        what = f"recycle {worker_id}" if recycled is not None else f"drain {worker_id}"
        return self._spawn(self._drain(key, record, worker_id, users, loads, recycled), what)

    # ------------------------------------------------------------------ recycling

    def check_recycle(self, key: GroupKey, record: GroupRecord, worker_id: str, requests: int,
                      rss: int | None) -> None:
        """At a report: the worker's process past ``max_requests`` served or ``max_rss`` is replaced as a drain
        replaces one (``recycling``: pure), once — a refused recycle is not asked again until it restarts."""
        pool, flight = record.pool, record.flight
        if pool.max_requests is None and pool.max_rss is None:
            return
        since = record.readings.served_from.get(worker_id)
        if since is None or worker_id in flight.recycled or worker_id in flight.draining:
            return  # not routable yet in this process, or recycled (or drained) already
        reason = recycle_reason(served=requests - since, rss=rss, limit=requests_limit(pool.max_requests, worker_id),
                                max_rss=pool.max_rss, changing=bool(flight.draining or flight.spawning))
        if reason is None:
            return
        flight.recycled.add(worker_id)
        record.book.record(PoolDecision("recycle", worker_id, reason,
                                        {"served": requests - since, "rss": rss, "max_requests": pool.max_requests,
                                         "max_rss": pool.max_rss}))
        log.info("pool %s: recycling %s: %s", "/".join(key), worker_id, reason)
        self.drain(key, record, worker_id, recycled=reason)

    async def _drain(self, key: GroupKey, record: GroupRecord, worker_id: str, users: Sequence[str],
                     loads: Mapping[str, float], recycled: str | None = None) -> Evacuation:
        try:
            staying = sum(1 for w in self._supervisor.workers_of(key) if w.id != worker_id)
            why = replacement_for_drain(worker_id, staying=staying, floor=record.settings.floor,
                                        counted=self._supervisor.counted(key), max_workers=record.pool.max_workers,
                                        recycled=recycled)
            if why is not None:
                replacement = self._supervisor.add_worker(key)
                if replacement is None:  # elasticd is stopping (or the group going): the worker stays as it is
                    raise ValueError(refused_while_stopping(worker_id))
                record.flight.spawning.add(replacement.id)
                record.book.record(PoolDecision("scale-up", replacement.id, why))
                await self._routable_soon(key, replacement.id)
            plan = plan_evacuation(worker_id, self._views(key, record), loads, users)  # (the drained one is out)
            if users and not plan:
                return Evacuation(worker_id, failed=[(users[0], "no other routable worker to move to")],
                                  left=list(users[1:]))
            if self.mover is None:
                now = self._clock()
                for user, target in plan:
                    self._surface.assign(user, target, now)
                await self.retire(key, record, worker_id)
                return Evacuation(worker_id, moved=list(users))
            return await self._empty_then_retire(key, record, worker_id, plan)
        finally:
            self._end_emptying(record, worker_id, users)

    async def _routable_soon(self, key: GroupKey, worker_id: str) -> None:
        started = self._clock()
        while not any(w.id == worker_id and w.routable for w in self._supervisor.workers_of(key)):
            if self._clock() - started > _ROUTABLE_TIMEOUT:
                raise TimeoutError(f"the replacement {worker_id} did not become routable in {_ROUTABLE_TIMEOUT:g}s")
            await asyncio.sleep(_DRAIN_POLL)

    # ------------------------------------------------------------------ emptying: live moves off a worker

    def _begin_emptying(self, record: GroupRecord, worker_id: str, users: Sequence[str]) -> None:
        """The worker takes no one new (draining); the users to be moved off stay on it until their turn
        (pinned: the front still serves them there)."""
        for user in users:
            self._surface.pin(user)
        record.flight.drain({worker_id})

    def _end_emptying(self, record: GroupRecord, worker_id: str, users: Sequence[str]) -> None:
        """The emptying ended without a retire (a move failed, something broke): the worker serves again."""
        for user in users:
            self._surface.pin(user, False)
        record.flight.undrain(worker_id)

    async def _empty_then_retire(self, key: GroupKey, record: GroupRecord, worker_id: str,
                                 moves: Sequence[tuple[str, str]]) -> Evacuation:
        """Move the users off (one at a time); retire the worker once empty, else keep it (draining ends)."""
        assert self.mover is not None
        users = [user for user, _ in moves]
        try:
            result = await evacuate(self.mover, worker_id, moves, move_timeout=self.move_timeout,
                                    tunnels_of=self._user_tunnels, drain_timeout=record.pool.drain_timeout,
                                    clock=self._clock)
            if result.empty:
                await self.retire(key, record, worker_id)  # (its own cleanup ends the draining)
                return result
            user, why = result.failed[0]
            log.warning("pool %s: draining %s stopped, the worker is kept: the move of %s failed (%s); %d moved, "
                        "%d left on it", "/".join(key), worker_id, user, why, len(result.moved),
                        len(result.left) + 1)
            return result
        finally:
            self._end_emptying(record, worker_id, users)

    # ------------------------------------------------------------------ the retire itself

    async def retire(self, key: GroupKey, record: GroupRecord, worker_id: str, why: str | None = None) -> None:
        """Graceful: no new requests (draining), let what is open finish (requests and tunnels, up to the
        group's drain_timeout), then stop the worker."""
        started = self._clock()
        try:
            cut = await self.wait_drained([worker_id], record.pool.drain_timeout)
            reason = f"drain timeout: cut {cut[worker_id]}" if cut else "drained: nothing open on it"
            if why is not None:
                reason = f"{why}; {reason}"
            record.book.record(PoolDecision("retire", worker_id, reason,
                                            {"waited_seconds": round(self._clock() - started, 3)}))
            await self._supervisor.retire(worker_id)
        finally:
            # (in this order: the worker is out of the draining set and forgotten before an owed cold start asks
            # the cap, which no longer counts it)
            record.flight.undrain(worker_id)
            record.forget(worker_id)
            self._after_retire(key, record)

    async def wait_drained(self, worker_ids: Sequence[str], drain_timeout: float) -> dict[str, str]:
        """Return once nothing is open on these workers (no request, no tunnel), or at ``drain_timeout``;
        what stopping them then cuts, by worker, each named in a warning."""
        started = self._clock()
        waiting = list(worker_ids)
        cut: dict[str, str] = {}
        while waiting:
            open_requests, tunnels = self._forwards.open_by_worker(), self._tunnels()
            now = self._clock()
            for worker_id in list(waiting):
                decided = drain_verdict(now, started, open_requests=open_requests.get(worker_id, 0),
                                        tunnels=tunnels.get(worker_id, 0), drain_timeout=drain_timeout)
                if decided.stop:
                    waiting.remove(worker_id)
                    if decided.cut:
                        cut[worker_id] = decided.cut
                        log.warning("worker %s: still busy after the drain timeout (%gs): stopping it cuts %s",
                                    worker_id, drain_timeout, decided.cut)
            if waiting:
                await asyncio.sleep(_DRAIN_POLL)
        return cut

    def user_loads(self, record: GroupRecord, views: Sequence[WorkerView]) -> dict[str, dict[str, float]]:
        loads, record.readings.user_seconds = user_loads(views, self._surface.on, record.readings.user_seconds)
        return loads
