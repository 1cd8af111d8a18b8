"""The pool as ``GET /v1/apps/{tenant}/{app}/pool`` (and ``elasticctl pool``, the monitor page) shows it: per group,
its thresholds, its ledger, its hold, its cold starts, its journal, and per worker its occupancy, the components and
history behind it, its rates and its users. A view only: it reads the records and decides nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from elasticd.pool.evaluator import components_of, history_of, rates_of
from elasticd.pool.group_record import GroupRecord
from elasticd.pool.ledger import ledger
from elasticd.pool.move_machine import Move
from elasticd.pool.ports import PoolWorker
from elasticd.pool.report import Report

__all__ = ["describe_group", "describe_moves"]


def describe_group(record: GroupRecord, workers: Sequence[PoolWorker], routable: Sequence[str], *,
                   announced: set[str], counted: int, moves: list[dict[str, Any]],
                   users_of: Callable[[str], list[dict[str, Any]]]) -> dict[str, Any]:
    """``workers``: the supervisor's for the group; ``routable``: what the front may send to, the reception first;
    ``counted``: what the cap counts (cap.py)."""
    readings, flight, book, pool = record.readings, record.flight, record.book, record.pool
    rows_of = {w.id: list(window.rows) if (window := readings.windows.get(w.id)) else [] for w in workers}
    shown = []
    for worker in workers:
        rows = rows_of[worker.id]
        rates = rates_of(rows)
        components = {k: round(v, 4) for k, v in components_of(rows, pool.memory_limit, cpu_wall=readings.wall).items()}
        if worker.id in readings.capacity:
            components["capacity"] = round(readings.capacity[worker.id], 4)
        shown.append({
            "id": worker.id, "pid": worker.pid, "state": worker.state,
            "reception": bool(routable) and worker.id == routable[0],
            "draining": worker.id in flight.draining, "spawning": worker.id in flight.spawning,
            "announced": worker.id in announced,
            "occupancy": round(readings.occupancy_of(worker.id), 4),
            "components": components,
            "history": [round(v, 3) for v in history_of(rows, pool.memory_limit, readings.wall)],
            "rates": None if rates is None else {"rps": round(rates.rps, 3), "latency": rates.latency,
                                                 "error_rate": round(rates.error_rate, 3)},
            "sticky_users": users_of(worker.id),
            # Its latest reading as reported (or sensed): what is not measured is absent or None.
            "last_report": _report_json(rows[-1].report) if rows else None,
        })
    hold = book.hold if book.bound else None
    cold = book.cold_starts
    return {
        "active": record.settings.active, "floor": record.settings.floor,
        "cold_starts": {"count": cold.count, "last_seconds": None if cold.last is None else round(cold.last, 3),
                        "starting": sorted(flight.cold)},
        "thresholds": {"reception": pool.reception_threshold, "admission": pool.admission_threshold,
                       "compaction_margin": pool.compaction_margin, "min_workers": pool.min_workers,
                       "max_workers": pool.max_workers, "memory_limit": pool.memory_limit,
                       "drain_timeout": pool.drain_timeout, "idle_timeout": pool.idle_timeout,
                       "cpu_held_at": pool.cpu_held_at,
                       "throttled_held_at": pool.throttled_held_at, "memory_held_at": pool.memory_held_at,
                       "pids_held_at": pool.pids_held_at},
        "cpu_wall": round(readings.wall, 4),
        "held": None if hold is None else {"resources": sorted(book.bound), "reason": hold.reason,
                                           "limits": hold.numbers.get("limits", {})},
        "counted_workers": counted,
        "ledger": ledger([readings.occupancy_of(wid) for wid in routable], pool).numbers(),
        "workers": shown,
        "decisions": book.journal.last(),
        "decision_counts": dict(book.journal.counts),
        "moves": moves,
    }


def describe_moves(moves: Sequence[Move], now: float) -> list[dict[str, Any]]:
    """The users being moved in a group now."""
    return [{"user": m.user, "from": m.source, "to": m.target, "step": m.step.value,
             "seconds": round(now - m.started, 3)} for m in moves]


def _report_json(report: Report) -> dict[str, Any]:
    data = dataclasses.asdict(report)
    if data["executor"] is not None and data["executor"]["queue_depth"] is None:
        del data["executor"]["queue_depth"]
    return data
