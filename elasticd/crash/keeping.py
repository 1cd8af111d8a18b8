"""The running state kept in systemd's store as it changes, for the instance that starts after a crash.

What is written is a re-exec's state without its descriptors (``upgrade.reexec.running_state``): the workers (pid,
start time, token, the digest of their definition), the users and where they are, the overrides, the quota buckets,
the worker numbers. It is written when it changed (a worker started, stopped or became routable; a user placed,
logged in, moved or forgotten; an override), at most once a ``MIN_INTERVAL``, and never more often than keeps its
cost under a twentieth of the time (``next_interval``: a state of 100,000 users that takes 80 ms to write is written
at most every 1.6 s). A state over ``BOUND`` is not written, and that is said once: the record before it stays.

How the descriptor is had: from systemd's store at a start after a crash or a restart (``LISTEN_FDNAMES`` ``state``),
from the previous image after a re-exec in place (``SavedState.state_store``), or made now and handed to the store
(``FDSTORE=1``, ``FDNAME=state``). A clean stop removes it from the store: the next start is a start, not a crash.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Hashable
from typing import Final

from elasticd.crash.stored_state import StoredState
from elasticd.systemd import store_state
from elasticd.upgrade.state import SavedState, StateError, load

__all__ = ["BOUND", "MIN_INTERVAL", "StateKeeping", "next_interval"]

log = logging.getLogger("elasticd.crash")

MIN_INTERVAL: Final = 1.0
COST_SHARE: Final = 20  # a write costs at most a twentieth of the time between two
BOUND: Final = 64 << 20


def next_interval(cost: float) -> float:
    """Seconds until the next write may be, after one that took ``cost`` seconds."""
    return max(MIN_INTERVAL, COST_SHARE * cost)


class StateKeeping:
    __slots__ = ("_fingerprint", "_over", "_seen", "_snapshot", "interval", "stored", "writes")

    def __init__(self, stored: StoredState, snapshot: Callable[[], bytes], fingerprint: Callable[[], Hashable]) -> None:
        self.stored = stored
        self._snapshot = snapshot  # the state's document, as bytes
        self._fingerprint = fingerprint  # what changes when the state does (counters: cheaper than the document)
        self._seen: Hashable = None
        self._over = False  # said once that the state is over the bound
        self.interval = MIN_INTERVAL
        self.writes = 0

    @classmethod
    def opened(cls, carried: int | None, stored: list[int], snapshot: Callable[[], bytes],
               fingerprint: Callable[[], Hashable]) -> tuple[StateKeeping, SavedState | None]:
        """The memfd a re-exec ``carried``, the one systemd's store kept (``stored``: after a crash or a restart), or a
        new one handed to the store; and the state a crashed instance left in it, when it is whole (None: nothing to
        adopt by, said when it was torn or unreadable)."""
        crashed = None
        if carried is not None:
            memfd = StoredState(carried)
            memfd.read()  # (where the next record goes)
            for extra in stored:
                os.close(extra)
        elif stored:
            memfd = StoredState(stored[0])
            for extra in stored[1:]:
                os.close(extra)
            chosen = memfd.read()
            if chosen.body is not None:
                try:
                    crashed = load(chosen.body)
                except StateError as exc:
                    log.error("the running state an elasticd before this one left in systemd's store cannot be taken "
                              "(%s): its workers are stopped, not adopted", exc)
            elif chosen.torn:
                log.error("the running state in systemd's store is torn (%s): its workers are stopped, not adopted",
                          "; ".join(chosen.seen))
        else:
            memfd = StoredState.made()
            store_state(memfd.fd)
        return cls(memfd, snapshot, fingerprint), crashed

    def write(self, *, force: bool = False) -> bool:
        """Write the state if it changed since the last write (or ``force``). True when written."""
        mark = self._fingerprint()
        if not force and mark == self._seen:
            return False
        began = time.perf_counter()
        body = self._snapshot()
        if len(body) > BOUND:
            if not self._over:
                log.error("the running state is %d bytes, over the %d kept for a crash: the last one under it stays "
                          "(a crash now adopts what it names)", len(body), BOUND)
                self._over = True
            return False
        self._over = False
        self.stored.write(body)
        self._seen = mark
        self.writes += 1
        self.interval = next_interval(time.perf_counter() - began)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.write()
            except OSError as exc:  # (memory: ENOMEM, ENOSPC of the memfd's tmpfs accounting)
                log.error("the running state cannot be kept for a crash: %s", exc)
