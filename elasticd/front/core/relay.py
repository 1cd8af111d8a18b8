"""The relay's state machine: one owner for every request's state, its transitions as a table (h11-style).

A request the front has read is an ``Exchange`` in one ``Phase``; only the table moves it, and only along
``TRANSITIONS``. An event that is not legal in the current phase raises ``RelayError``: the shell treats that
as a bug of ours and fails closed (the exchange is abandoned — its counters entry and quota slot given back —
and the client connection and the worker's are closed), never as a silent "already done, ignore". Whether
something comes too late for its exchange (a connection made after the client left) is asked of the phase
(``upstream_lost`` answers LATE; the shell's connect callback reads ``phase``), never stepped.

     PARKED ◄── PARK ──┐ (it waits in the front, unforwarded: its user moving, its group waking, no room)
         └── RELEASE ──►│     REFUSE
        QUEUED ───────────────────────────────────────────────┐
          │ ▲ FORWARD (routed, admitted, placed: open in the counters)
          ▼ │ RETRY (the worker cannot have read it: undone, dispatched once more)
      FORWARDING ── ATTACH (itself) ──────────── FAIL, CLIENT_LEFT ──────► DONE
          │ ANSWER_HEAD (the worker's head went to the client)           ▲
          ▼                                                              │
      ANSWERING ─────────────── ANSWER_END, CUT, CLIENT_LEFT, UPGRADE ────┘

What happens *at* each failure (send once more, answer 502/504, cut the connection, account 499) is decided
by the pure functions below, from the facts the shell reports; the shell then carries it out.
"""

from __future__ import annotations

import enum
from typing import Final

# Every member is also a module constant, ``PHASE_DONE`` for ``Phase.DONE``, and the code reads those. The front
# is compiled with mypyc (setup.py), where a constant is a C static while a member is read through the enum
# class; and Debian bookworm's mypyc (1.0.1) cannot compile a read of an IntEnum member at all (its C names a
# static it never defines), hence also the lookups by name below.

__all__ = ["CLOSEMODE_CLOSE", "CLOSEMODE_KEEP", "CLOSEMODE_LINGER", "EVENTS", "EVENT_ANSWER_END", "EVENT_ANSWER_HEAD",
           "EVENT_ATTACH", "EVENT_CLIENT_LEFT", "EVENT_CUT", "EVENT_FAIL", "EVENT_FORWARD", "EVENT_PARK",
           "EVENT_REFUSE", "EVENT_RELEASE", "EVENT_RETRY", "EVENT_UPGRADE", "FAILURE_BAD_GATEWAY", "FAILURE_CUT",
           "FAILURE_LATE", "FAILURE_RETRY", "IDEMPOTENT", "NEXT", "PHASES", "PHASE_ANSWERING", "PHASE_DONE",
           "PHASE_FORWARDING", "PHASE_PARKED", "PHASE_QUEUED", "TIMEOUT_CLOSE", "TIMEOUT_CUT",
           "TIMEOUT_GATEWAY_TIMEOUT",
           "TRANSITIONS", "CloseMode", "Event", "Failure", "Phase", "RelayError", "Timeout", "after_own_answer",
           "client_left", "illegal", "step", "timed_out", "upstream_lost"]


class Phase(enum.IntEnum):
    QUEUED = 0  # read (head, maybe body), waiting for its turn on the client connection
    FORWARDING = 1  # open in the counters, bound for one worker; its answer has not begun
    ANSWERING = 2  # the worker's answer head went to the client; its body is streaming
    DONE = 3  # answered (by the worker or by the front), its counters entry closed
    PARKED = 4  # it waits in the front (core/parking.py: a move, a cold start, room) until released, then QUEUED


PHASE_QUEUED: Final[Phase] = Phase["QUEUED"]
PHASE_FORWARDING: Final[Phase] = Phase["FORWARDING"]
PHASE_ANSWERING: Final[Phase] = Phase["ANSWERING"]
PHASE_DONE: Final[Phase] = Phase["DONE"]
PHASE_PARKED: Final[Phase] = Phase["PARKED"]


class Event(enum.IntEnum):
    REFUSE = 0  # the front answers it itself before forwarding (400, 404, 429, 503...)
    FORWARD = 1  # dispatched to a worker
    ATTACH = 2  # a connection to the worker is attached (new or reused)
    RETRY = 3  # the worker cannot have read it (refused; a reused connection closed first): dispatched once more
    ANSWER_HEAD = 4
    ANSWER_END = 5
    UPGRADE = 6  # 101 went through: the exchange ends, both connections become a tunnel
    FAIL = 7  # forwarded but not answered: the front answers (502, 504)
    CUT = 8  # the answer began and cannot complete: the client connection is cut
    CLIENT_LEFT = 9
    PARK = 10  # dispatch said wait: its user is being moved, its group is waking, or no worker has room
    RELEASE = 11  # the move ended: dispatched again (to the user's worker now)


EVENT_REFUSE: Final[Event] = Event["REFUSE"]
EVENT_FORWARD: Final[Event] = Event["FORWARD"]
EVENT_ATTACH: Final[Event] = Event["ATTACH"]
EVENT_RETRY: Final[Event] = Event["RETRY"]
EVENT_ANSWER_HEAD: Final[Event] = Event["ANSWER_HEAD"]
EVENT_ANSWER_END: Final[Event] = Event["ANSWER_END"]
EVENT_UPGRADE: Final[Event] = Event["UPGRADE"]
EVENT_FAIL: Final[Event] = Event["FAIL"]
EVENT_CUT: Final[Event] = Event["CUT"]
EVENT_CLIENT_LEFT: Final[Event] = Event["CLIENT_LEFT"]
EVENT_PARK: Final[Event] = Event["PARK"]
EVENT_RELEASE: Final[Event] = Event["RELEASE"]


class RelayError(Exception):
    """An event that is not legal in the exchange's phase: a bug of the front, handled by failing closed."""


TRANSITIONS: Final[dict[tuple[Phase, Event], Phase]] = {
    (PHASE_QUEUED, EVENT_REFUSE): PHASE_DONE,
    (PHASE_QUEUED, EVENT_FORWARD): PHASE_FORWARDING,
    (PHASE_QUEUED, EVENT_PARK): PHASE_PARKED,
    (PHASE_PARKED, EVENT_RELEASE): PHASE_QUEUED,
    (PHASE_FORWARDING, EVENT_ATTACH): PHASE_FORWARDING,
    (PHASE_FORWARDING, EVENT_RETRY): PHASE_QUEUED,  # (the forward undone: dispatched again)
    # (a 101 too: its head goes to the client, then UPGRADE ends the exchange)
    (PHASE_FORWARDING, EVENT_ANSWER_HEAD): PHASE_ANSWERING,
    (PHASE_FORWARDING, EVENT_FAIL): PHASE_DONE,
    (PHASE_FORWARDING, EVENT_CLIENT_LEFT): PHASE_DONE,
    (PHASE_ANSWERING, EVENT_ANSWER_END): PHASE_DONE,
    (PHASE_ANSWERING, EVENT_UPGRADE): PHASE_DONE,
    (PHASE_ANSWERING, EVENT_CUT): PHASE_DONE,
    (PHASE_ANSWERING, EVENT_CLIENT_LEFT): PHASE_DONE,
}


# The table flattened for the hot path: a list indexed by phase * len(Event) + event, -1 where there is no row.
# (A dict keyed by (Phase, Event) pairs would hash two enums per step, each through Enum.__hash__, a Python
# call: about 0.2 µs a step, four steps a request.)
_EVENTS: Final = len(Event)
_NEXT: Final[list[int]] = [-1] * (len(Phase) * _EVENTS)
for (_phase, _event), _to in TRANSITIONS.items():
    _NEXT[_phase * _EVENTS + _event] = _to
_PHASES: Final = tuple(Phase)


def step(phase: int, event: int) -> Phase:
    """The phase after ``event``; RelayError when the table has no such row (fail closed)."""
    to = _NEXT[phase * _EVENTS + event]
    if to < 0:
        raise illegal(phase, event)
    return _PHASES[to]


def illegal(phase: int, event: int) -> RelayError:
    return RelayError(f"{Event(event).name} is not legal while {Phase(phase).name}")


# For the hot path's own inlined steps (exchange.py).
NEXT: Final = _NEXT
EVENTS: Final = _EVENTS
PHASES: Final = _PHASES


# ------------------------------------------------------------------ decisions at the edges

IDEMPOTENT: Final = frozenset({b"GET", b"HEAD", b"OPTIONS", b"TRACE", b"PUT", b"DELETE"})


class Failure(enum.IntEnum):
    RETRY = 0  # send the request once more on a new connection
    BAD_GATEWAY = 1  # answer 502 in its turn; the worker is unroutable until its socket accepts again
    CUT = 2  # the answer had begun: only a cut connection tells the client (a truncated answer)
    LATE = 3  # the exchange is over already: nothing to do


FAILURE_RETRY: Final[Failure] = Failure["RETRY"]
FAILURE_BAD_GATEWAY: Final[Failure] = Failure["BAD_GATEWAY"]
FAILURE_CUT: Final[Failure] = Failure["CUT"]
FAILURE_LATE: Final[Failure] = Failure["LATE"]


def upstream_lost(phase: Phase, *, reused: bool, received: bool, retried: bool, has_body: bool, method: bytes,
                  upgrading: bool) -> Failure:
    """The worker's connection ended before the answer did. Retry once only when nothing can have happened
    twice: a kept-alive connection the worker closed while idle (nothing received), an idempotent method, no
    body, no upgrade, not retried already (RFC 9110 §9.2.2)."""
    if phase in (PHASE_DONE, PHASE_QUEUED, PHASE_PARKED):
        return FAILURE_LATE
    if phase == PHASE_ANSWERING:
        return FAILURE_CUT
    if reused and not received and not retried and not has_body and method in IDEMPOTENT and not upgrading:
        return FAILURE_RETRY
    return FAILURE_BAD_GATEWAY


class Timeout(enum.IntEnum):
    CLOSE = 0  # an idle keep-alive connection, or a head that never completed: just close
    GATEWAY_TIMEOUT = 1  # forwarded, the answer never began: 504, then close
    CUT = 2  # the answer began and stalled: cut


TIMEOUT_CLOSE: Final[Timeout] = Timeout["CLOSE"]
TIMEOUT_GATEWAY_TIMEOUT: Final[Timeout] = Timeout["GATEWAY_TIMEOUT"]
TIMEOUT_CUT: Final[Timeout] = Timeout["CUT"]


def timed_out(phase: Phase | None) -> Timeout:
    """No byte moved either way for the timeout; ``phase``: the first request's, None when there is none."""
    if phase == PHASE_FORWARDING:
        return TIMEOUT_GATEWAY_TIMEOUT
    if phase == PHASE_ANSWERING:
        return TIMEOUT_CUT
    return TIMEOUT_CLOSE


def client_left(phase: Phase, status: int) -> int | None:
    """The status to close the counters entry with when the client goes away (as nginx: 499 while nothing of
    the answer was sent, else the answer's own status); None when nothing is open."""
    if phase == PHASE_FORWARDING:
        return 499
    if phase == PHASE_ANSWERING:
        return status
    return None


class CloseMode(enum.IntEnum):
    KEEP = 0  # serve the next request on the connection
    CLOSE = 1  # close now: everything the client sent was read
    LINGER = 2  # end our side, read and drop what still comes for a moment, then close


CLOSEMODE_KEEP: Final[CloseMode] = CloseMode["KEEP"]
CLOSEMODE_CLOSE: Final[CloseMode] = CloseMode["CLOSE"]
CLOSEMODE_LINGER: Final[CloseMode] = CloseMode["LINGER"]


def after_own_answer(*, close: bool, keep_alive: bool, client_eof: bool, stopping: bool, upgrading: bool,
                     body_done: bool, expect: bool, parse_error: bool) -> CloseMode:
    """How the connection goes on after an answer of the front's own. Closing at once while the client may
    still be sending would reset the connection, and a reset can destroy the answer in the client's receive
    buffer before it is read: then the close lingers (nginx's lingering close)."""
    if not (close or not keep_alive or client_eof or stopping or upgrading or (not body_done and expect)):
        return CLOSEMODE_KEEP
    return CLOSEMODE_CLOSE if body_done and not parse_error else CLOSEMODE_LINGER

