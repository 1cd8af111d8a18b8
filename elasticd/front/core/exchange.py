"""One request and its answer, as the front carries it: parsed head, routing, counters and its ``Phase``.

The phase moves only through ``advance`` (the relay's table, ``relay.TRANSITIONS``); the counters entry is
opened by ``forward`` and closed once, by the shell's ``Forwarding.settle``. The same object is the
open-requests entry of the forward counters (``user``, ``worker``, ``ts``): nothing is copied per request.
"""

from __future__ import annotations

from typing import Final, Protocol

from elasticd.front.core import http1
from elasticd.front.core.counters import ForwardCounters, RouteStats, WorkerCounters
from elasticd.front.core.quota import TenantQuota
from elasticd.front.core.relay import (
    EVENT_ANSWER_HEAD,
    EVENT_ATTACH,
    EVENT_CUT,
    EVENT_FAIL,
    EVENT_FORWARD,
    EVENT_RETRY,
    EVENTS,
    NEXT,
    PHASE_ANSWERING,
    PHASE_DONE,
    PHASE_FORWARDING,
    PHASE_QUEUED,
    PHASES,
    Event,
    Phase,
    RelayError,
    illegal,
    step,
)
from elasticd.front.core.routing import AppRoute
from elasticd.front.core.sticky import Surface, SurfaceUser

__all__ = ["NO_HEAD", "Exchange", "Link"]


class Link(Protocol):
    """The shell's connection to a worker, as the exchange holds it (the core never imports the shell)."""

    @property
    def transport(self) -> object | None: ...

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...




class Exchange:
    """One request and its answer. Also the open-requests entry (``user``, ``worker``, ``ts``)."""

    __slots__ = ("backoff", "body", "body_done", "conn", "cookie_line", "counters", "entry", "error", "group", "head",
                 "head_began", "http11", "login", "method", "phase", "quota", "retried", "rid", "route", "sent",
                 "stats", "status", "ts", "url", "user", "worker")

    def __init__(self) -> None:
        self.phase: Phase = PHASE_QUEUED
        self.method = b""
        self.url = b""
        self.head: http1.RequestHead = NO_HEAD
        self.http11 = True
        self.body: list[bytes] = []
        self.body_done = False  # the client's request ended (its body read whole)
        self.sent = False  # the request went whole to the worker (head, body and its end)
        self.error: tuple[int, str] | None = None  # refused at parse time: answered in its turn
        self.status = 0
        self.conn: Link | None = None
        self.quota: TenantQuota | None = None
        self.route: AppRoute | None = None
        self.stats: RouteStats | None = None
        self.counters: WorkerCounters | None = None
        self.entry: SurfaceUser | None = None
        self.user: str | None = None
        self.worker: str | None = None
        self.group = ""  # the app's group it was routed to
        self.cookie_line = b""
        self.login: bytes | None = None
        self.backoff: bytes | None = None  # a 429's Retry-After value (b"" when it had none), else None
        self.retried = False
        # When the first byte of the worker's answer head came (0.0: none yet; after an interim head, the read that
        # completed it): the head must be whole within the request timeout of it, however its bytes trickle
        # (ClientRelay.head_overdue).
        self.head_began = 0.0
        self.rid = 0  # the open-requests id while FORWARDING or ANSWERING, else 0
        self.ts = 0.0

    def end(self, event: Event, status: int, now: float, forwards: ForwardCounters,
            surface: Surface | None = None) -> None:
        """A forwarded exchange ends (``event``: answered, failed, cut, upgraded, the client left): its phase
        moves first (an illegal end raises before anything is counted), then its counters entry closes and its
        quota slot is given back — the one place that does either (with ``abandon``), so nothing is closed
        twice or left open. The user is credited with the forward unless it failed in transport (the front's
        own 502/504, an answer the worker cut): that is the worker's, not the user's; a new user's first
        request goes to the surface's newcomers, until its cookie comes back."""
        to = NEXT[self.phase * EVENTS + event]  # step(), inlined: every forwarded request ends through here
        if to < 0 or not self.rid:  # no entry open (QUEUED, or DONE already): nothing a forward can end
            raise illegal(self.phase, event)
        self.phase = PHASES[to]
        rid, self.rid = self.rid, 0
        counters, stats = self.counters, self.stats
        assert counters is not None and stats is not None  # set by the shell with FORWARD
        seconds = now - self.ts
        forwards.closed(rid, status, seconds, counters, stats)
        if event is not EVENT_FAIL and event is not EVENT_CUT:
            entry = self.entry
            if entry is not None:
                entry.add(seconds, now)
            elif surface is not None and self.cookie_line and self.user is not None:
                # The cookie may have come back while this first answer was still streaming (a browser keeps
                # it from the answer's head: the page's assets bring it): the user is on the surface already.
                entered = surface.users.get(self.user)
                if entered is not None:
                    entered.add(seconds, now)
                else:
                    surface.newcomers.credit(self.user, seconds, now, self.group)
        quota = self.quota
        if quota is not None:
            if quota.gate.in_flight > 0:  # quota.leave(), inlined
                quota.gate.in_flight -= 1
            self.quota = None

    def abandon(self, now: float, forwards: ForwardCounters) -> None:
        """Fail closed: whatever the phase (the table was found broken), the exchange is over, its counters
        entry closed as a 502 if it was open, and its quota slot given back. Idempotent."""
        self.conn = None
        if self.rid:
            self.phase = PHASE_FORWARDING  # whatever it was: from here the table's FAIL ends it, through end()
            self.end(EVENT_FAIL, 502, now, forwards)
        self.phase = PHASE_DONE

    def advance(self, event: Event) -> None:
        """A step that opens or closes nothing (REFUSE: answered by the front before forwarding)."""
        to = NEXT[self.phase * EVENTS + event]
        if to < 0:
            raise illegal(self.phase, event)
        self.phase = PHASES[to]

    def forward(self, forwards: ForwardCounters, conn: Link | None = None) -> None:
        """FORWARD: checked first, then opened in the counters; with ``conn`` (a pooled connection taken at
        once) also its ATTACH, in the same call (the row exists: a forwarding exchange takes a connection)."""
        to = NEXT[self.phase * EVENTS + EVENT_FORWARD]
        if to < 0:
            raise illegal(self.phase, EVENT_FORWARD)
        self.phase = PHASES[to]
        self.rid = forwards.opened(self)
        counters = self.counters
        if counters is not None:  # forwards.forwarded(counters), inlined
            counters.in_flight += 1
            if counters.in_flight >= counters.concurrency:
                forwards.saturated.add(counters.worker)
        if conn is not None:
            self.conn = conn  # FORWARDING --ATTACH--> FORWARDING

    def attach(self, conn: Link) -> None:
        to = NEXT[self.phase * EVENTS + EVENT_ATTACH]
        if to < 0:
            raise illegal(self.phase, EVENT_ATTACH)
        self.phase = PHASES[to]
        self.conn = conn

    def retry(self, forwards: ForwardCounters) -> None:
        """RETRY: the worker cannot have read the request (its connection was refused, or a kept-alive one was
        closed before a byte of the answer, for a request safe to send twice): the forward is undone — its counters
        entry dropped uncounted, its worker's in-flight count and its quota slot given back — and it is dispatched
        again, at most once, to wherever dispatch says now (not a worker found dead meanwhile)."""
        if self.retried:
            raise RelayError("a request is sent again at most once")
        self.phase = step(self.phase, EVENT_RETRY)
        self.retried = True
        self.conn = None
        forwards.open.pop(self.rid, None)
        self.rid = 0
        counters = self.counters
        if counters is not None:
            forwards.ended(counters)
            self.counters = None
        quota = self.quota
        if quota is not None:
            quota.leave()
            self.quota = None

    def answer_head(self, status: int, login: bytes | None) -> None:
        to = NEXT[self.phase * EVENTS + EVENT_ANSWER_HEAD]
        if to < 0:
            raise illegal(self.phase, EVENT_ANSWER_HEAD)
        self.phase = PHASES[to]
        self.status = status
        self.login = login

    @property
    def finished(self) -> bool:
        return self.phase is PHASE_DONE

    @property
    def started(self) -> bool:
        """The worker's answer head went to the client (the counters' liveness rule reads it)."""
        return self.phase is PHASE_ANSWERING

    @property
    def in_flight(self) -> bool:
        phase = self.phase
        return phase is PHASE_FORWARDING or phase is PHASE_ANSWERING

    @property
    def live(self) -> bool:
        """Still relaying to or from a worker: an open-requests entry the sweep must not take, however old."""
        return self.conn is not None and self.phase is not PHASE_DONE


NO_HEAD: Final = http1.RequestHead()
