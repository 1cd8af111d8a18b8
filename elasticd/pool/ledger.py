"""DECIDE, when a report arrives: compaction by the capacity ledger (seed 000, "Compaction").

Each worker contributes its threshold as useful capacity: the reception ``reception_threshold``, every
other worker ``admission_threshold``. For N workers C = rt + (N-1)·at, O = Σ occupancy, H = C - O; compact
while H > compaction_margin · at, never below ``min_workers``, never the reception: drain the least-occupied
other worker by re-pointing its users to the survivors through admission, then retire it.

The margin makes the two policies unable to chase each other: retiring costs ``at`` of headroom, so H stays
over (margin - 1)·at. The seed's arithmetic counts the reception's spare capacity too, which admission never
uses; so before it decides, the plan places every drained user (heaviest first, each on the least-occupied
survivor as projected after the previous moves) and compacts only if every one lands under its threshold
and the group it leaves would not itself trigger a scale-up. Those guards make "a compaction never leads
straight into a scale-up" hold for every distribution of load, not just on average.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from elasticd.config.model import PoolSettings
from elasticd.pool.evaluator import SMOOTHING_ROWS
from elasticd.pool.policy import PoolDecision, WorkerView, check_scale_up

__all__ = ["Compaction", "CompactionSteps", "Ledger", "calm_rows", "compaction_steps", "ledger", "may_compact",
           "plan_compaction", "plan_evacuation"]


@dataclass(frozen=True, slots=True)
class Ledger:
    workers: int
    capacity: float  # C
    occupied: float  # O
    headroom: float  # H
    trigger: float  # compact while H is over this

    def numbers(self) -> dict[str, float]:
        return {"N": self.workers, "C": round(self.capacity, 4), "O": round(self.occupied, 4),
                "H": round(self.headroom, 4), "trigger": round(self.trigger, 4)}


def ledger(occupancies: Sequence[float], pool: PoolSettings) -> Ledger:
    n = len(occupancies)
    capacity = pool.reception_threshold + (n - 1) * pool.admission_threshold if n else 0.0
    occupied = sum(occupancies)
    return Ledger(n, capacity, occupied, capacity - occupied, pool.compaction_margin * pool.admission_threshold)


@dataclass(frozen=True, slots=True)
class Compaction:
    retire: str
    moves: Mapping[str, str]  # user → survivor
    decision: PoolDecision


def plan_compaction(workers: Sequence[WorkerView], loads: Mapping[str, Mapping[str, float]],
                    pool: PoolSettings, tunnels: Mapping[str, int] | None = None) -> Compaction | None:
    """``workers``: routable, in order, reception first. ``loads``: per worker, each logged-in user's share of
    its occupancy (guests never move: they are re-placed on the reception when their worker goes, so the rest
    of the drained worker's occupancy is projected onto the reception).
    ``tunnels``: open WebSocket tunnels per worker — a worker holding one is drained only when every other
    candidate holds one too (its drain waits for the tunnel to close)."""
    book = ledger([w.occupancy for w in workers], pool)
    if len(workers) <= max(pool.min_workers, 1) or book.headroom <= book.trigger:
        return None
    others = workers[1:]
    open_tunnels = tunnels or {}
    candidates = [w for w in others if not open_tunnels.get(w.id)] or list(others)
    drained = min(candidates, key=lambda w: w.occupancy)
    survivors = [w for w in workers if w.id != drained.id]
    projected = {w.id: w.occupancy for w in survivors}
    moves: dict[str, str] = {}
    users = loads.get(drained.id, {})
    # What the drained worker carries beyond its logged-in users (guests, clients without a cookie) lands on
    # the reception, where the front re-places them.
    projected[workers[0].id] += max(drained.occupancy - sum(users.values()), 0.0)
    for user, load in sorted(users.items(), key=lambda item: (-item[1], item[0])):
        target = _admit_projected(survivors, projected, load, pool)
        if target is None:
            return None  # it would not fit: a compaction now would only invite a scale-up
        projected[target] += load
        moves[user] = target
    # The same rule that grows the group, asked of the group as it would be: a compaction it would answer with
    # a scale-up is not made (e.g. an idle worker drained while the remaining one is over its threshold).
    if check_scale_up([WorkerView(w.id, projected[w.id]) for w in survivors], replace(pool, max_workers=None),
                      spawning=0) is not None:
        return None
    after = ledger(list(projected.values()), pool)
    numbers = {**book.numbers(), "drained": drained.id, "drained_occupancy": round(drained.occupancy, 4),
               "users": len(moves), "tunnels": open_tunnels.get(drained.id, 0), "after": after.numbers()}
    reason = f"H = {book.headroom:.2f} over {book.trigger:.2f}: drain the least-occupied worker and retire it"
    return Compaction(drained.id, moves, PoolDecision("compaction", drained.id, reason, numbers))


def _admit_projected(survivors: Sequence[WorkerView], projected: Mapping[str, float], load: float,
                     pool: PoolSettings) -> str | None:
    if len(survivors) == 1:  # only the reception is left: a group of one keeps, while under its threshold
        only = survivors[0].id
        return only if projected[only] + load < pool.reception_threshold else None
    candidates = [w.id for w in survivors[1:] if projected[w.id] + load < pool.admission_threshold]
    return min(candidates, key=lambda wid: projected[wid]) if candidates else None


def plan_evacuation(worker: str, survivors: Sequence[WorkerView], loads: Mapping[str, float],
                    users: Sequence[str]) -> list[tuple[str, str]]:
    """Where each of ``users`` goes when an operator empties ``worker`` (``elasticctl drain``): idle users
    first (they move fastest, and a failure then leaves the busy ones where they are), each to the survivor
    least occupied as projected after the moves before it. ``survivors``: routable, the reception first; it
    takes users only when it is the only one. No threshold is asked: the operator takes the worker out."""
    outer = [w for w in survivors if w.id != worker][1:] or [w for w in survivors if w.id != worker]
    if not outer:
        return []
    projected = {w.id: w.occupancy for w in outer}
    plan: list[tuple[str, str]] = []
    for user in sorted(users, key=lambda u: (loads.get(u, 0.0), u)):
        target = min(projected, key=lambda wid: (projected[wid], wid))
        projected[target] += loads.get(user, 0.0)
        plan.append((user, target))
    return plan



def may_compact(*, draining: bool, spawning: bool, rows: Sequence[int]) -> bool:
    """Whether the ledger may be asked at all: one change at a time (nothing being drained or started: let the
    group settle and be measured again), and every routable worker (``rows``: each one's readings) measured over a
    full smoothing window. A newborn reads 0 so that it admits, but that 0 is not headroom: compacting on it
    retired workers seconds after a scale-up, under the very load that caused it (seen in the VM)."""
    return not draining and not spawning and all(n >= SMOOTHING_ROWS for n in rows)


def calm_rows(row_times: Sequence[float], burst_at: float) -> int:
    """A worker's readings that count for ``may_compact``: those since the group's short signal was last high
    (``policy.check_burst``). No compaction while a burst lasts, nor until a whole window has been read after it:
    Knative's "no scale-down in panic", measured in the seed's own window."""
    return sum(1 for ts in row_times if ts > burst_at)


@dataclass(frozen=True, slots=True)
class CompactionSteps:
    """How a compaction empties its worker: live moves one user at a time (``moves``, the idlest first: they move
    fastest, and a failure then leaves the busy ones where they are), or — with no live mover — every user
    re-pointed at once (``repoint``: their in-process state is lost), the worker retired after its drain."""

    moves: tuple[tuple[str, str], ...] = ()
    repoint: Mapping[str, str] | None = None


def compaction_steps(plan: Compaction, loads: Mapping[str, float], *, live: bool) -> CompactionSteps:
    """``loads``: each user's share of the retired worker's occupancy; ``live``: a mover carries users' state."""
    if not live:
        return CompactionSteps(repoint=dict(plan.moves))
    return CompactionSteps(moves=tuple(sorted(plan.moves.items(), key=lambda item: (loads.get(item[0], 0.0),
                                                                                    item[0]))))
