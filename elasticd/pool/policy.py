"""DECIDE, on the request path: reception-first placement, admission, and the scale-up check (seed 000).

Pure: a group's routable workers in order (the FIRST is the reception) with their occupancies in, a
decision out. Every decision carries its reason and the numbers behind it, for the decision journal.

1. Placement: every user is born on the reception. On login the reception KEEPS the user while its own
   occupancy is under ``reception_threshold``; over it, it PASSES the user to admission. The sole worker of a
   group always keeps (a group of one cannot refuse a login). Placement happens once: a login of a user
   already placed (kept earlier, or living on another worker) decides nothing, and keeping never re-points
   anyone — "re-placing them later is compaction's business, not placement's".
2. Admission: among the routable workers other than the reception, the least occupied under
   ``admission_threshold``; none under → the last one, with a warning (FALLBACK), and let scale-up grow the group.
3. Scale-up: when no non-reception worker is under ``admission_threshold``, or, in a group of one, the
   reception is over its keep threshold. Guards: a spawn in flight (wait for it); ``max_workers`` (``cap.py``: the
   one definition of what it counts, shared with the cold start, the drain and the agent); and the cgroup
   budget: a scale-up a tenant's limit would starve is HELD, with the limit's numbers.
4. The burst (``check_burst``): requests waiting in the front's queue, or in a worker's executor, grow the group at
   once under the same guards; while they wait, and until a whole window of readings has come since, the ledger
   compacts nothing (``ledger.calm_rows``): the window stays the rule for compaction and steady state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from elasticd.config.model import PoolSettings
from elasticd.pool.budget import LimitBinding
from elasticd.pool.cap import may_start

__all__ = ["PoolDecision", "WorkerView", "admit", "check_burst", "check_scale_up", "next_hold", "place_login"]


@dataclass(frozen=True, slots=True)
class WorkerView:
    id: str
    occupancy: float


@dataclass(frozen=True, slots=True)
class PoolDecision:
    kind: str  # keep | pass | admit | fallback | scale-up | held | compaction | retire | hung | recycle
    worker: str | None
    reason: str
    numbers: Mapping[str, Any] = field(default_factory=dict)


def _occupancies(workers: Sequence[WorkerView]) -> dict[str, float]:
    return {w.id: round(w.occupancy, 4) for w in workers}


def admit(workers: Sequence[WorkerView], pool: PoolSettings) -> PoolDecision:
    """Rule 2 over the routable workers; the reception (``workers[0]``) is never a candidate."""
    others = list(workers[1:])
    if not others:
        raise ValueError("admission needs a worker other than the reception")
    numbers = {"occupancies": _occupancies(others), "admission_threshold": pool.admission_threshold}
    under = [w for w in others if w.occupancy < pool.admission_threshold]
    if under:
        best = min(under, key=lambda w: w.occupancy)
        return PoolDecision("admit", best.id, f"least occupied worker under {pool.admission_threshold:g}", numbers)
    return PoolDecision("fallback", others[-1].id,
                    f"no worker under {pool.admission_threshold:g}: placed on the last one, the group must grow",
                    numbers)


def place_login(workers: Sequence[WorkerView], pool: PoolSettings, *, current: str | None = None,
                placed: bool = False) -> list[PoolDecision]:
    """Rule 1 (then rule 2 when the reception passes). The last decision names the worker the user lives on.

    ``current``: the worker the user is on now; ``placed``: it was logged in before this login. A user
    already placed (``placed``, or living on a worker other than the reception) gets no decision at all."""
    if not workers:
        raise ValueError("placement needs at least one routable worker")
    reception = workers[0]
    if placed or (current is not None and current != reception.id):
        return []
    numbers = {"reception": reception.id, "occupancy": round(reception.occupancy, 4),
               "reception_threshold": pool.reception_threshold, "workers": len(workers)}
    if len(workers) == 1:
        return [PoolDecision("keep", reception.id, "a group of one always keeps", numbers)]
    if reception.occupancy < pool.reception_threshold:
        return [PoolDecision("keep", reception.id, f"reception under {pool.reception_threshold:g}", numbers)]
    passed = PoolDecision("pass", None, f"reception at or over {pool.reception_threshold:g}", numbers)
    return [passed, admit(workers, pool)]


def check_scale_up(workers: Sequence[WorkerView], pool: PoolSettings, *, spawning: int, counted: int | None = None,
                   holds: Sequence[LimitBinding] = (), measuring: bool = False) -> PoolDecision | None:
    """Rule 3: a scale-up (or ``held``) decision, or None when the group places well or a guard holds.

    ``workers``: the routable ones; ``counted``: every worker the supervisor holds for the group and has not
    stopped (what the cap counts, ``cap.py``; default: the routable ones); ``holds``: the cgroup limits that bind;
    ``measuring``: the tenant's cgroup has no reading yet (wait for one rather than grow blind)."""
    if not workers:
        return None
    counted = len(workers) if counted is None else counted
    numbers: dict[str, Any] = {"occupancies": _occupancies(workers), "workers": len(workers), "counted": counted,
                               "spawning": spawning, "max_workers": pool.max_workers}
    if len(workers) == 1:
        if workers[0].occupancy < pool.reception_threshold:
            return None
        reason = f"a group of one whose reception is at or over {pool.reception_threshold:g}"
    else:
        if any(w.occupancy < pool.admission_threshold for w in workers[1:]):
            return None
        reason = f"no worker other than the reception under {pool.admission_threshold:g}"
    if spawning:
        return None  # a spawn in flight: wait for it to become routable and be measured
    if not may_start(pool.max_workers, counted):
        return None
    if measuring:
        return None
    if holds:
        limits = {hold.resource: dict(hold.numbers) for hold in holds}
        because = "; ".join(hold.reason for hold in holds)
        return PoolDecision("held", None, f"{reason}, but held by the tenant's limit: {because}",
                        {**numbers, "limits": limits})
    return PoolDecision("scale-up", None, reason, numbers)


def check_burst(workers: Sequence[WorkerView], pool: PoolSettings, *, waiting: int, executor_waiting: int,
                starting: int, counted: int, holds: Sequence[LimitBinding] = (),
                measuring: bool = False) -> PoolDecision | None:
    """The short signal, beside rule 3's window: requests wait in the front's queue for the group (``waiting``: its
    every routable worker is at its concurrency), or a worker's executor says requests wait for it
    (``executor_waiting``, from the latest reports): the group grows now, rather than after the window's average has
    climbed (Knative's panic mode, uWSGI's cheaper-busyness on a listen-queue alert). One start at a time
    (``starting``: started, not yet routable), under ``max_workers``, held by a binding limit as rule 3 is. A group
    with no routable worker is the cold start's (``idle.wake_rule``), not this."""
    if not workers or (waiting <= 0 and executor_waiting <= 0):
        return None
    if starting or not may_start(pool.max_workers, counted) or measuring:
        return None
    numbers: dict[str, Any] = {"occupancies": _occupancies(workers), "workers": len(workers), "counted": counted,
                               "waiting": waiting, "executor_waiting": executor_waiting,
                               "max_workers": pool.max_workers}
    reason = (f"burst: {waiting} requests wait in the front for a free slot" if waiting > 0 else
              f"burst: {executor_waiting} requests wait in its workers' executors")
    if holds:
        limits = {hold.resource: dict(hold.numbers) for hold in holds}
        because = "; ".join(hold.reason for hold in holds)
        return PoolDecision("held", None, f"{reason}, but held by the tenant's limit: {because}",
                            {**numbers, "limits": limits})
    return PoolDecision("scale-up", None, reason, numbers)


def next_hold(bound: frozenset[str], binding: Sequence[LimitBinding], decision: PoolDecision | None, *,
              measuring: bool) -> tuple[frozenset[str], bool]:
    """The resources holding a group after this check, and whether that is a new hold (for the journal).

    A hold lasts while its limit binds, not only while a scale-up is being asked for: a load that dips between
    two reports neither ends it nor, coming back, starts a second one in the journal. It ends when its limit
    no longer binds or a scale-up is made; a check without a reading (``measuring``) changes nothing."""
    if measuring:
        return bound, False
    if decision is not None and decision.kind == "held":
        resources = frozenset(hold.resource for hold in binding)
        return resources, resources != bound
    if decision is not None or not binding:
        return frozenset(), False
    return bound, False
