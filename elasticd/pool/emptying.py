"""Emptying a worker with live moves: the worker compaction drains, or the one an operator takes out
(``elasticctl drain``). One user at a time, idle ones first, each to its target; the first move that fails
stops it, and the worker is kept with the users still on it (the next ledger check, or the operator, decides
again). A user with an open WebSocket tunnel is moved once the tunnel closed (moving would cut it), waiting up
to the group's ``drain_timeout``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from elasticd.pool.move_machine import Move, Outcome

__all__ = ["Evacuation", "PoolMover", "evacuate"]

_TUNNEL_POLL = 0.1  # seconds between two looks at a user's open tunnels


class PoolMover(Protocol):
    """What the pool asks of the Mover (pool/mover.py)."""

    async def move(self, user: str, source: str, target: str, timeout: float) -> Move | str: ...


@dataclass(slots=True)
class Evacuation:
    worker: str
    moved: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (user, why): the first failure stops it
    left: list[str] = field(default_factory=list)  # the users not tried after it

    @property
    def empty(self) -> bool:
        return not self.failed and not self.left


async def evacuate(mover: PoolMover, worker: str, moves: Sequence[tuple[str, str]], *, move_timeout: float,
                   tunnels_of: Callable[[str], int], drain_timeout: float,
                   clock: Callable[[], float] = time.monotonic) -> Evacuation:
    """Move each (user, target) of ``moves`` off ``worker``, in order (the caller puts idle users first)."""
    result = Evacuation(worker)
    for n, (user, target) in enumerate(moves):
        started = clock()
        while tunnels_of(user) and clock() - started < drain_timeout:
            await asyncio.sleep(_TUNNEL_POLL)
        move = await mover.move(user, worker, target, move_timeout)
        if isinstance(move, str):
            why = move
        elif move.outcome is Outcome.MOVED:
            result.moved.append(user)
            continue
        else:
            why = f"{move.outcome.value if move.outcome else 'aborted'}: {move.why}"
        result.failed.append((user, why))
        result.left = [u for u, _ in moves[n + 1:]]
        break
    return result
