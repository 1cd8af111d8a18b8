"""MOVE: the live move of one user U from worker A (the source) to worker B (the target), seed 000, "Moving a
live user". Pure: time is passed in, and every input is one method of ``Move`` returning the effects the shell
carries out (as ints, like the front's relay cores).

    QUIESCING ── QUIESCED (stateful) ──► SNAPSHOTTING ── SNAPSHOT ──► INSTALLING ── INSTALLED ──► SWITCHED
        │  └──── QUIESCED (no package: re-point only) ───────────────────────────────────────────►─┘
        └─────────── TIMEOUT, REFUSED, SOURCE_DIED, TARGET_DIED (from any of the three) ──────► ABORTED

- FLAG (the move begins in QUIESCING): U is moving; the front holds U's new requests, not forwarded, with a
  hard deadline ``deadline`` (``server.move_timeout`` after the flag).
- QUIESCE: the shell reports ``quiesced`` once U has no open request in the front's open-requests dict and no
  WebSocket tunnel (stale entries are swept by their timestamp elsewhere, so a lost one cannot block a move
  past its deadline; in-flight requests are never cancelled).
- SNAPSHOT: A is asked for U's package (``ASK_SNAPSHOT``); ``snapshot(package)`` is its answer.
- INSTALL: the package goes to B (``SEND_INSTALL``); ``installed`` is B's ok.
- SWITCH: the surface re-points U to B (``SWITCH``) and the held requests are released toward B (``RELEASE``).

A worker without the library has no package: its move is QUIESCING → SWITCHED (re-pointed after the quiesce,
so no request of U's races one still open on A). Every abort leaves U on A with its state and releases the held
requests to A — except when A died: then U's state died with it, and U is placed anew (``REPLACE``).

An input that is not legal in the step (a snapshot while installing, anything after the move ended) raises
``MoveError``: the shell treats it as a bug of ours and aborts the move (``abort``), never ignores it. Answers
that arrive for a move that has ended are the shell's to drop: it finds moves by ``move_id`` in the
``MoveBook``, and an ended move is no longer there.
"""

from __future__ import annotations

import enum
from bisect import bisect_left
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ASK_SNAPSHOT",
    "DURATION_BOUNDS",
    "RELEASE",
    "REPLACE",
    "SEND_INSTALL",
    "SWITCH",
    "TRANSITIONS",
    "Move",
    "MoveBook",
    "MoveError",
    "MoveEvent",
    "MoveStats",
    "MoveSummary",
    "Outcome",
    "Step",
]


class Step(enum.Enum):
    QUIESCING = "quiescing"  # flagged: U's new requests are held; waiting until U has nothing open
    SNAPSHOTTING = "snapshotting"  # A was asked for U's package
    INSTALLING = "installing"  # the package went to B; waiting for B's ok
    SWITCHED = "switched"  # U is B's; its held requests went to B
    ABORTED = "aborted"  # U stays on A (or is placed anew when A died); its held requests went there


class MoveEvent(enum.Enum):
    QUIESCED = "quiesced"
    SNAPSHOT = "snapshot"  # A's package came
    INSTALLED = "installed"  # B's ok came
    REFUSED = "refused"  # A would not give the package, or B would not install it
    SOURCE_DIED = "source-died"
    TARGET_DIED = "target-died"
    TIMEOUT = "timeout"  # the deadline passed


class Outcome(enum.Enum):
    """How a move ended: the ``outcome`` label of ``elasticd_moves_total`` and the journal's word."""

    MOVED = "moved"
    QUIESCE_TIMEOUT = "quiesce-timeout"  # U still had a request open at the deadline
    SOURCE_REFUSED = "source-refused"
    SOURCE_TIMEOUT = "source-timeout"
    TARGET_REFUSED = "target-refused"
    TARGET_TIMEOUT = "target-timeout"
    SOURCE_DIED = "source-died"  # U's state died with A: U is placed anew
    TARGET_DIED = "target-died"
    FAILED = "failed"  # an illegal step (a bug of ours): aborted, failing closed


# Effects (a bitmask) for the shell.
ASK_SNAPSHOT: Final = 1  # ask the source for U's package (the channel's snapshot request, with ``move_id``)
SEND_INSTALL: Final = 2  # send ``package`` to the target (the channel's install request), then drop it here
SWITCH: Final = 4  # re-point U to the target on the surface
RELEASE: Final = 8  # the move is over: release U's held requests, in order, toward ``release_to``
REPLACE: Final = 16  # with RELEASE: U has no worker any more (the source died); place it anew


_LIVE: Final = (Step.QUIESCING, Step.SNAPSHOTTING, Step.INSTALLING)
_ABORTS: Final = (MoveEvent.TIMEOUT, MoveEvent.REFUSED, MoveEvent.SOURCE_DIED, MoveEvent.TARGET_DIED)

TRANSITIONS: Final[dict[tuple[Step, MoveEvent], Step]] = {
    (Step.QUIESCING, MoveEvent.QUIESCED): Step.SNAPSHOTTING,  # or SWITCHED for a move without a package
    (Step.SNAPSHOTTING, MoveEvent.SNAPSHOT): Step.INSTALLING,
    (Step.INSTALLING, MoveEvent.INSTALLED): Step.SWITCHED,
    **{(step, event): Step.ABORTED for step in _LIVE for event in _ABORTS
       if not (step is Step.QUIESCING and event is MoveEvent.REFUSED)},  # nobody was asked anything yet
}

# What each abort is called, by the step it came in and why.
_ABORTED_AS: Final[dict[tuple[Step, MoveEvent], Outcome]] = {
    (Step.QUIESCING, MoveEvent.TIMEOUT): Outcome.QUIESCE_TIMEOUT,
    (Step.SNAPSHOTTING, MoveEvent.TIMEOUT): Outcome.SOURCE_TIMEOUT,
    (Step.INSTALLING, MoveEvent.TIMEOUT): Outcome.TARGET_TIMEOUT,
    (Step.SNAPSHOTTING, MoveEvent.REFUSED): Outcome.SOURCE_REFUSED,
    (Step.INSTALLING, MoveEvent.REFUSED): Outcome.TARGET_REFUSED,
    **{(step, MoveEvent.SOURCE_DIED): Outcome.SOURCE_DIED for step in _LIVE},
    **{(step, MoveEvent.TARGET_DIED): Outcome.TARGET_DIED for step in _LIVE},
}


class MoveError(Exception):
    """An input that is not legal in the move's step: a bug of the shell's, handled by aborting the move."""


@dataclass(frozen=True, slots=True)
class MoveSummary:
    """A move that ended, for the journal and the metrics."""

    user: str
    source: str
    target: str
    outcome: Outcome
    seconds: float  # from the flag to the switch or the abort
    package_bytes: int | None  # None: no package (a move without the library, or none came)
    why: str  # for an abort, what was wrong ("" when moved)


class Move:
    """One user's move. Built at the flag; the shell feeds it what happens and carries out what it returns."""

    __slots__ = ("deadline", "ended", "move_id", "outcome", "package", "package_bytes", "release_to", "source",
                 "started", "stateful", "step", "target", "user", "why")

    def __init__(self, move_id: int, user: str, source: str, target: str, now: float, timeout: float, *,
                 stateful: bool) -> None:
        if source == target:
            raise ValueError(f"a move of {user} from {source} to itself")
        if timeout <= 0:
            raise ValueError(f"a move's timeout must be positive, not {timeout}")
        self.move_id = move_id
        self.user = user
        self.source = source
        self.target = target
        self.stateful = stateful  # both workers carry packages (the library's snapshot/install capabilities)
        self.started = now
        self.deadline = now + timeout  # also the hard deadline of every request held for the move
        self.step = Step.QUIESCING
        self.package: bytes | None = None  # held between SNAPSHOT and SEND_INSTALL only
        self.package_bytes: int | None = None
        self.release_to: str | None = None  # where the held requests go once it ended (None: placed anew)
        self.outcome: Outcome | None = None
        self.why = ""
        self.ended: float | None = None

    @property
    def over(self) -> bool:
        return self.step is Step.SWITCHED or self.step is Step.ABORTED

    def _step(self, event: MoveEvent) -> Step:
        to = TRANSITIONS.get((self.step, event))
        if to is None:
            raise MoveError(f"{event.value} is not legal while {self.step.value} (move {self.move_id} of "
                            f"{self.user} from {self.source} to {self.target})")
        return to

    # ------------------------------------------------------------------ inputs

    def quiesced(self, now: float) -> int:
        """U has nothing open any more (no request in the open-requests dict, no tunnel)."""
        self._step(MoveEvent.QUIESCED)
        if not self.stateful:
            return self._switch(now)
        self.step = Step.SNAPSHOTTING
        return ASK_SNAPSHOT

    def snapshot(self, package: bytes, now: float) -> int:
        """A's package for U (it may be empty: a user with no state is still moved with its package)."""
        self.step = self._step(MoveEvent.SNAPSHOT)
        self.package = package
        self.package_bytes = len(package)
        return SEND_INSTALL

    def sent(self) -> bytes:
        """The package, handed over to be sent to B; not kept here afterwards."""
        package = self.package
        if self.step is not Step.INSTALLING or package is None:
            raise MoveError(f"no package to send while {self.step.value} (move {self.move_id})")
        self.package = None
        return package

    def installed(self, now: float) -> int:
        """B's ok: the package is installed."""
        self._step(MoveEvent.INSTALLED)
        return self._switch(now)

    def refused(self, why: str, now: float) -> int:
        """A would not snapshot, or B would not install (``why``: what it said)."""
        return self._abort(MoveEvent.REFUSED, why, now)

    def worker_died(self, worker: str, now: float) -> int:
        """A worker exited; a move neither of whose workers it is goes on (0)."""
        if worker == self.source:
            return self._abort(MoveEvent.SOURCE_DIED, f"{worker} exited", now)
        if worker == self.target:
            return self._abort(MoveEvent.TARGET_DIED, f"{worker} exited", now)
        return 0

    def tick(self, now: float) -> int:
        """Time passed: past the deadline the move aborts (0 while there is time)."""
        if now < self.deadline or self.over:
            return 0
        waited = {Step.QUIESCING: f"{self.user} still had a request open",
                  Step.SNAPSHOTTING: f"{self.source} did not answer the snapshot",
                  Step.INSTALLING: f"{self.target} did not answer the install"}[self.step]
        return self._abort(MoveEvent.TIMEOUT, f"{waited} after {self.deadline - self.started:g}s", now)

    def abort(self, error: BaseException, now: float) -> int:
        """Fail closed (an illegal step, a bug of ours): U stays on A, its held requests go there."""
        if self.over:
            return 0
        self.step = Step.ABORTED
        return self._ended(Outcome.FAILED, str(error), self.source, now)

    # ------------------------------------------------------------------ how it ends

    def _switch(self, now: float) -> int:
        self.step = Step.SWITCHED
        self._ended(Outcome.MOVED, "", self.target, now)
        return SWITCH | RELEASE

    def _abort(self, event: MoveEvent, why: str, now: float) -> int:
        before = self.step
        self.step = self._step(event)  # ABORTED, or MoveError when the move cannot abort so (e.g. it ended)
        outcome = _ABORTED_AS[(before, event)]
        self.package = None
        if outcome is Outcome.SOURCE_DIED:
            self._ended(outcome, why, None, now)
            return RELEASE | REPLACE
        return self._ended(outcome, why, self.source, now)

    def _ended(self, outcome: Outcome, why: str, release_to: str | None, now: float) -> int:
        self.outcome = outcome
        self.why = why
        self.release_to = release_to
        self.ended = now
        return RELEASE

    def summary(self) -> MoveSummary:
        if self.outcome is None or self.ended is None:
            raise MoveError(f"move {self.move_id} of {self.user} has not ended")
        return MoveSummary(self.user, self.source, self.target, self.outcome, self.ended - self.started,
                           self.package_bytes, self.why)


class MoveBook:
    """The moves under way, at most one per user: what the front asks (is U moving? then hold) and where the
    shell finds a move again by its id (a channel answer) or by a worker (one died)."""

    __slots__ = ("_by_id", "_by_user", "_next_id")

    def __init__(self) -> None:
        self._by_user: dict[str, Move] = {}
        self._by_id: dict[int, Move] = {}
        self._next_id = 0

    def __len__(self) -> int:
        return len(self._by_user)

    def begin(self, user: str, source: str, target: str, now: float, timeout: float, *,
              stateful: bool) -> Move | str:
        """Flag a move of ``user``; the reason as a string when it cannot begin."""
        if user in self._by_user:
            under_way = self._by_user[user]
            return f"{user} is already being moved ({under_way.source} to {under_way.target})"
        if source == target:
            return f"{user} is on {target} already"
        self._next_id += 1
        move = Move(self._next_id, user, source, target, now, timeout, stateful=stateful)
        self._by_user[user] = move
        self._by_id[move.move_id] = move
        return move

    def moving(self, user: str) -> Move | None:
        return self._by_user.get(user)

    def get(self, move_id: int) -> Move | None:
        return self._by_id.get(move_id)

    def moves(self) -> list[Move]:
        return list(self._by_user.values())

    def involving(self, worker: str) -> list[Move]:
        """The moves from or to ``worker``."""
        return [m for m in self._by_user.values() if worker in (m.source, m.target)]

    def due(self, now: float) -> list[Move]:
        """The moves whose deadline passed."""
        return [m for m in self._by_user.values() if now >= m.deadline and not m.over]

    def end(self, move: Move) -> None:
        """Forget a move that is over (answers still on their way for it are then dropped)."""
        if not move.over:
            raise MoveError(f"move {move.move_id} of {move.user} is still {move.step.value}")
        if self._by_user.get(move.user) is move:
            del self._by_user[move.user]
        self._by_id.pop(move.move_id, None)


# Seconds from the flag to the end: a move of an idle user takes milliseconds, one that waits for a long request
# or a silent worker up to the move timeout.
DURATION_BOUNDS: Final[tuple[float, ...]] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class MoveStats:
    """What ``elasticd_moves_total{tenant,app,outcome}`` and ``elasticd_move_duration_seconds`` expose."""

    __slots__ = ("buckets", "count", "outcomes", "sum")

    def __init__(self) -> None:
        self.outcomes: dict[tuple[str, str, str], int] = {}
        self.buckets = [0] * (len(DURATION_BOUNDS) + 1)  # per bucket, not cumulated
        self.count = 0
        self.sum = 0.0

    def add(self, tenant: str, app: str, summary: MoveSummary) -> None:
        key = (tenant, app, summary.outcome.value)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        self.buckets[bisect_left(DURATION_BOUNDS, summary.seconds)] += 1
        self.count += 1
        self.sum += summary.seconds

