"""The shell that carries out live moves (pool/move_machine.py decides each step): it flags the user on the front's
surface, waits for the quiesce, asks the source for the package and the target to install it over the
channel, and re-points the user and releases its held requests — or, when anything fails, leaves the user
where it was and releases them there.

One task per move; a move is also ended from outside when one of its workers dies (``worker_died``: the
supervisor saw it exit). Whichever ends it carries out its end (``_finish``), once: the other sees the move
over and stops. Every move that ends is journaled (``move`` or ``move-aborted``) and counted.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from elasticd.frames import MAX_PAYLOAD
from elasticd.pool.move_machine import (
    ASK_SNAPSHOT,
    RELEASE,
    REPLACE,
    SEND_INSTALL,
    SWITCH,
    Move,
    MoveBook,
    MoveStats,
    MoveSummary,
    Outcome,
    Step,
)
from elasticd.worker_ids import parse_worker_id

__all__ = ["MoveChannel", "MoveFront", "MoveSurface", "Mover"]

log = logging.getLogger("elasticd.pool")

_QUIESCE_POLL = 0.005  # seconds between two looks at the user's open requests while quiescing
_ANNOUNCE_POLL = 0.05  # seconds between two looks for a new target's announce
_DEATH_GRACE = 0.2  # seconds a closed channel waits for its worker's exit to be seen
_MOVES = frozenset({"snapshot", "install"})
_MAYBE_INSTALLED = frozenset({Outcome.TARGET_TIMEOUT, Outcome.FAILED})


class MoveSurface(Protocol):
    def flag(self, user: str) -> bool: ...
    def unflag(self, user: str) -> None: ...
    def assign(self, user: str, worker: str, now: float) -> Any: ...
    def get(self, user: str) -> Any: ...


class MoveFront(Protocol):
    """What a move needs of the front: its surface, the user's open requests and tunnels, the release."""

    @property
    def surface(self) -> MoveSurface: ...
    def open_requests_of(self, user: str) -> int: ...
    def tunnels_of(self, user: str) -> int: ...
    def release(self, user: str) -> int: ...


class MoveChannel(Protocol):
    def capabilities(self, worker_id: str) -> frozenset[str]: ...
    async def request(self, worker_id: str, message: dict[str, Any], timeout: float,
                      payload: bytes | None = None, *, answer_limit: int = ...,
                      ) -> tuple[dict[str, Any], bytes | None]: ...
    def tell(self, worker_id: str, message: dict[str, Any]) -> bool: ...


class Mover:
    __slots__ = ("_channel", "_clock", "_front", "_on_end", "_package_limit", "book", "stats")

    def __init__(self, front: MoveFront, channel: MoveChannel, *,
                 on_end: Callable[[Move, MoveSummary], None] | None = None,
                 package_limit: Callable[[str], int] = lambda worker_id: MAX_PAYLOAD,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._front = front
        self._channel = channel
        # The most bytes a source worker's package may have (its group's pool.max_package): a worker's answer,
        # so a tenant's own bytes, read into elasticd's memory before it goes on to the target.
        self._package_limit = package_limit
        self._on_end = on_end  # the journal and the metrics
        self._clock = clock
        self.book = MoveBook()
        self.stats = MoveStats()

    def carries_state(self, worker_id: str) -> bool:
        """The worker's library announced move support (remembered while its channel reconnects)."""
        return self._channel.capabilities(worker_id) >= _MOVES

    async def move(self, user: str, source: str, target: str, timeout: float) -> Move | str:
        """Move ``user`` from ``source`` to ``target``; the move once it ended (``outcome`` says how), or why it
        could not begin (then nothing was done: the user is where it was)."""
        entry = self._front.surface.get(user)
        if entry is None:
            return f"{user} is not on the surface"
        if entry.worker != source:
            return f"{user} is on {entry.worker or '(no worker)'}, not on {source}"
        stateful = self.carries_state(source)
        if stateful and not self.carries_state(target):
            # A new worker (a drain's replacement) whose library has not announced yet: its state would be lost
            # by re-pointing, so wait for it (the user is not held meanwhile).
            deadline = self._clock() + timeout
            while not self.carries_state(target):
                if self._clock() >= deadline:
                    return f"{target} has not announced its library (its state could not be installed there)"
                await asyncio.sleep(_ANNOUNCE_POLL)
        began = self.book.begin(user, source, target, self._clock(), timeout, stateful=stateful)
        if isinstance(began, str):
            return began
        move = began
        self._front.surface.flag(user)  # FLAG: from here its new requests are held
        try:
            await self._run(move)
        except asyncio.CancelledError:
            self._finish(move, move.abort(RuntimeError("the move was cancelled (elasticd is stopping)"),
                                          self._clock()))
            raise
        except Exception as exc:  # a bug of ours: fail closed, the user stays where it was
            log.exception("pool: the move of %s from %s to %s failed", user, source, target)
            self._finish(move, move.abort(exc, self._clock()))
        return move

    def worker_died(self, worker_id: str) -> None:
        """A worker exited: the moves from or to it end now (the source's users are placed anew)."""
        for move in self.book.involving(worker_id):
            self._finish(move, move.worker_died(worker_id, self._clock()))

    def abort_all(self, why: str) -> None:
        for move in self.book.moves():
            self._finish(move, move.abort(RuntimeError(why), self._clock()))

    # ------------------------------------------------------------------ the steps

    async def _run(self, move: Move) -> None:
        front = self._front
        while not move.over:
            now = self._clock()
            remaining = move.deadline - now
            if move.step is Step.QUIESCING:
                if front.open_requests_of(move.user) == 0 and front.tunnels_of(move.user) == 0:
                    effects = move.quiesced(now)
                else:
                    effects = move.tick(now)
                    if not effects:
                        await asyncio.sleep(min(_QUIESCE_POLL, max(remaining, 0.0)))
                        continue
            elif move.step is Step.SNAPSHOTTING:
                effects = await self._ask(move, move.source, {"type": "snapshot", "user": move.user}, remaining,
                                          None, "package")
            elif move.step is Step.INSTALLING:
                effects = await self._ask(move, move.target, {"type": "install", "user": move.user}, remaining,
                                          move.sent(), "installed")
            else:  # pragma: no cover - over: the loop ends
                return
            if effects & ASK_SNAPSHOT or effects & SEND_INSTALL:
                continue  # the next step is the next turn of the loop
            if effects:
                self._finish(move, effects)

    async def _ask(self, move: Move, worker: str, message: dict[str, Any], remaining: float, payload: bytes | None,
                   expected: str) -> int:
        """One request of the move's; its answer as the move's next input (or its abort)."""
        try:
            answer, data = await self._channel.request(
                worker, message, max(remaining, 0.001), payload,
                answer_limit=self._package_limit(worker) if expected == "package" else 0)
        except TimeoutError:
            return move.tick(max(self._clock(), move.deadline)) if not move.over else 0
        except Exception as exc:  # the worker has no channel (any more): it cannot carry this step
            # A worker that died closes its channel a moment before the supervisor sees it exit: give that a
            # moment, so its death ends the move as a death (the source's user is then placed anew, its held
            # requests with it, rather than sent to a dead worker).
            await asyncio.sleep(_DEATH_GRACE)
            return move.refused(f"{worker}: {exc}", self._clock()) if not move.over else 0
        if move.over:
            return 0  # ended meanwhile (a worker died): this answer comes too late
        now = self._clock()
        if answer.get("type") != expected:
            return move.refused(f"{worker}: {answer.get('reason') or answer}", now)
        if expected == "package":
            return move.snapshot(data or b"", now)
        return move.installed(now)

    def _finish(self, move: Move, effects: int) -> None:
        """Carry out how the move ended: re-point the user (a switch) or place it anew (its source died), then
        release its held requests and forget the move."""
        if not effects & RELEASE:
            return
        self.book.end(move)  # first: whatever fails below, the move is over and nothing can end it again
        surface, now = self._front.surface, self._clock()
        released = 0
        try:
            if effects & SWITCH:
                surface.assign(move.user, move.target, now)
                if move.stateful:  # the old worker's copy of the state is nobody's now
                    self._channel.tell(move.source, {"type": "forget", "user": move.user})
            else:
                if effects & REPLACE:
                    entry = surface.get(move.user)
                    if entry is not None:
                        entry.worker = ""  # placed anew at its next request, as after any worker's death
                if move.stateful and move.outcome in _MAYBE_INSTALLED:
                    # The install was sent and not answered in time: a copy the target may hold is nobody's.
                    self._channel.tell(move.target, {"type": "forget", "user": move.user})
        finally:
            released = self._front.release(move.user)  # unflags the user whatever happened above
        summary = move.summary()
        parts = parse_worker_id(move.source)
        if parts is not None:
            self.stats.add(parts.tenant, parts.app, summary)
        if summary.outcome.value == "moved":
            log.info("pool: moved %s from %s to %s in %.1f ms (package %s, %d held requests released)",
                     move.user, move.source, move.target, summary.seconds * 1000,
                     "none" if summary.package_bytes is None else f"{summary.package_bytes} bytes", released)
        else:
            log.warning("pool: the move of %s from %s to %s aborted (%s): %s; %d held requests released to %s",
                        move.user, move.source, move.target, summary.outcome.value, summary.why, released,
                        move.release_to or "a new placement")
        if self._on_end is not None:
            try:
                self._on_end(move, summary)
            except Exception:  # the journal or metrics must not undo a move that is done
                log.exception("pool: recording the end of a move failed")
