"""``max_workers``: the one cap on a group's workers, and whether one more may start under it (pure).

What the cap counts is the supervisor's ``counted``: every worker of the group with a process or about to have one
(starting, running, in backoff, draining, stopping, being replaced — ``lifecycle.COUNTED``), in any list. It
caps processes, because processes are what spend the tenant's memory and pids: a worker being retired still
holds its memory until it has stopped. Scale-up, the cold start (``wake``), an operator's drain and the HAProxy
agent's room all ask this module, so the four cannot disagree.

One start may take the place of a worker it replaces (``replacing``): an operator's drain that would leave the
group under ``min_workers`` starts the replacement *before* the drained worker goes, because its users move
to it — one leaving, one coming, for the seconds of the move. Nothing else starts over the cap: a request for a
group whose only workers are being retired waits for them to stop, then its cold start begins (``idle.wake_rule``).
"""

from __future__ import annotations

__all__ = ["may_start", "startable"]


def startable(max_workers: int | None, counted: int, *, replacing: int = 0) -> int | None:
    """How many more workers may start now (None: no cap). ``replacing``: counted workers that the new ones take
    the place of (they are going, and their users move to the new ones)."""
    if max_workers is None:
        return None
    return max(max_workers - (counted - replacing), 0)


def may_start(max_workers: int | None, counted: int, *, replacing: int = 0) -> bool:
    """Whether one more worker may start now."""
    room = startable(max_workers, counted, replacing=replacing)
    return room is None or room > 0
