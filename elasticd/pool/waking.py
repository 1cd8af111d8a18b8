"""Scale to zero's other half: a request for a group with no routable worker (the front asks ``wake``).

Gather what the group's workers are doing and what the cap counts; decide (``idle.wake_rule``, pure); act — start
a worker now (a cold start, timed until it is routable), owe one to the waiting requests until the workers being
retired have stopped (``after_retire``), or say none will come (the front answers 503).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from elasticd.pool.group_record import GroupRecord
from elasticd.pool.idle import WakeVerdict, wake_rule
from elasticd.pool.policy import PoolDecision
from elasticd.pool.ports import GroupKey, PoolSupervisor

__all__ = ["Waking"]

log = logging.getLogger("elasticd.pool")


class Waking:
    __slots__ = ("_clock", "_supervisor", "on_wake_failed")

    def __init__(self, supervisor: PoolSupervisor, clock: Callable[[], float]) -> None:
        self._supervisor = supervisor
        self._clock = clock
        # Told when a cold start owed to waiting requests cannot begin after all (the daemon: the front answers
        # them 503 at once rather than at their request timeout).
        self.on_wake_failed: Callable[[GroupKey, str], object] | None = None

    def wake(self, key: GroupKey, record: GroupRecord) -> bool:
        """True when a worker is coming for the group (a cold start begins now, or once the workers being retired
        have stopped), so the request waits; False when none will (see ``idle.WakeVerdict``)."""
        now = self._clock()
        record.book.last_active = now  # a request came for it: not idle (it may be going to zero just now)
        draining = record.flight.draining
        supervisor = self._supervisor
        verdict = wake_rule([(w.state, w.routable, w.id in draining) for w in supervisor.workers_of(key)],
                            launching=supervisor.launching(key), counted=supervisor.counted(key),
                            max_workers=record.pool.max_workers)
        if verdict is WakeVerdict.AFTER_RETIRE:
            record.flight.owed = True
        elif verdict is WakeVerdict.START:
            return self._cold_start(key, record, now)
        return verdict.waits

    def _cold_start(self, key: GroupKey, record: GroupRecord, now: float) -> bool:
        worker = self._supervisor.add_worker(key)
        if worker is None:
            return False  # stopping, or the group is going
        record.flight.spawning.add(worker.id)
        record.flight.cold[worker.id] = now
        record.book.record(PoolDecision("scale-up", worker.id, "cold start: a request for a group at zero workers "
                                        "(it waits in the front for this one)", {"workers": 0}))
        log.info("pool %s: cold start of %s for a waiting request", "/".join(key), worker.id)
        return True

    def after_retire(self, key: GroupKey, record: GroupRecord) -> None:
        """A retire ended: a cold start owed to waiting requests may begin now that the cap has room."""
        if not record.flight.owed:
            return
        record.flight.owed = False
        if not self.wake(key, record) and self.on_wake_failed is not None:
            self.on_wake_failed(key, "no worker could start for it after its last ones retired")

    def on_routable(self, key: GroupKey, record: GroupRecord, worker_id: str) -> float | None:
        """A worker became routable; the seconds its cold start took, when it was one."""
        started = record.flight.cold.pop(worker_id, None)
        if started is None:
            return None
        seconds = self._clock() - started
        record.book.cold_starts.observe(seconds)
        log.info("pool %s: %s routable %.2fs after its cold start", "/".join(key), worker_id, seconds)
        return seconds
