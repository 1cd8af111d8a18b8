"""The keeper's children, and when it gives up on an elasticd that does not come back (pure: events in, records and
decisions out; time is passed in).

The keeper is the parent of every worker (``keeper/__init__``), so only it can read a worker's exit status. It keeps
one row per child: what elasticd labelled it with at the spawn (the worker's id), its start time (its identity
beside the pid), the read end of its output pipe while it has one (so the pipe never breaks while elasticd is away),
and, once it ended, its exit status until elasticd has read it (``forget``). Ended rows nobody forgets are bounded:
past ``MAX_ENDED`` the oldest go (elasticd away that long reads them as "status unknown").

The orphan bound: while no elasticd is connected, the children are orphans. One that connects within
``orphan_bound`` seconds adopts them; past it the keeper stops them all and exits, and systemd stops its unit: a
host whose elasticd systemd gave up on (its start limit), or that was stopped while it was restarting, is left with
nothing running.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_ENDED", "Child", "Children", "orphans_expired"]

MAX_ENDED: Final = 4096


@dataclass(slots=True)
class Child:
    pid: int
    label: str  # elasticd's name for it (a worker id), opaque to the keeper
    started: int  # its start time (/proc/PID/stat's 22nd field): a pid alone may be reused
    output: int | None = None  # the read end of its output pipe, held (None: journald's, or none)
    code: int | None = None  # its exit status once it ended (a negative number: the signal that ended it)


class Children:
    __slots__ = ("_ended", "live")

    def __init__(self) -> None:
        self.live: dict[int, Child] = {}
        self._ended: OrderedDict[int, Child] = OrderedDict()

    def spawned(self, child: Child) -> None:
        self.live[child.pid] = child

    def ended(self, pid: int, code: int) -> tuple[Child | None, list[Child]]:
        """A child was reaped: its row (None: not one of elasticd's — a spawn that failed before its row was made),
        and the rows dropped for the bound (their output descriptors are the caller's to close)."""
        child = self.live.pop(pid, None)
        if child is None:
            return None, []
        child.code = code
        self._ended[pid] = child
        dropped = []
        while len(self._ended) > MAX_ENDED:
            dropped.append(self._ended.popitem(last=False)[1])
        return child, dropped

    def forget(self, pid: int) -> Child | None:
        """elasticd read this ended child's status: its row goes (its output descriptor is the caller's to close)."""
        return self._ended.pop(pid, None)

    def rows(self) -> list[Child]:
        """Every row, live first then ended (oldest first): what a connecting elasticd is told."""
        return [*self.live.values(), *self._ended.values()]


def orphans_expired(now: float, away_since: float | None, bound: float) -> bool:
    """True when the children have had no elasticd for longer than ``bound`` (``away_since`` None: one is connected).
    A bound of 0 never expires (the orphans wait for an elasticd however long)."""
    return away_since is not None and bound > 0 and now - away_since >= bound
