"""What HAProxy's agent-check reads from a host: one line, derived from what the pool knows. Pure: data in, a line
out, no clock.

HAProxy connects to ``agent-port`` every ``agent-inter``, sends its ``agent-send`` string if it has one (here: an
app's domain or ``tenant/app``; nothing: the whole host), and reads one line of keywords separated by spaces —
``up``/``down`` (the operational state), ``ready``/``drain``/``maint`` (the administrative state), a weight
``N%`` of the server's configured weight, ``maxconn:N`` — and an optional description after ``#`` (shown in its
stats and logs). A keyword it does not get leaves that state as it was, so every answer names both states:
``up ready 75%`` undoes an earlier ``drain`` or ``maint`` by itself.

The weight is the room a group has over the most it could hold:

- its headroom now, from the capacity ledger (``H = C - O``: each routable worker's threshold less its
  occupancy — a capacity reading that says full counts as full), never below 0;
- plus the workers it may still start before ``max_workers``, each worth ``admission_threshold``;
- over its capacity at ``max_workers`` (``reception_threshold + (max - 1) * admission_threshold``).

A group whose scale-up is held by the tenant's cgroup limit is full (0 %), whatever its workers say: another
worker would get nothing, and HAProxy should send new users to a host that can take them; so is a group whose
workers failed and none serves. An app's weight is that of its active groups, each by the share of new users it
gets (the default ``1 - share``, the canary ``share``); the host's, that of its apps. ``drain`` while elasticd is
stopping (``server.stop_drain``: the front still serves the users HAProxy keeps sending by their cookie) or while
every worker of the app is being emptied; ``maint`` when the app cannot serve — its workers failed, or a reload
removed it (the front answers its users 404 at once: HAProxy must send them elsewhere, which ``drain`` would
not); ``up`` again, with its weight, once it can. ``maxconn`` is sent in every answer (0: none), because HAProxy
keeps the last one it was told.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from elasticd.pool import cap

__all__ = ["MAX_HINT", "AppRoom", "GroupRoom", "Hint", "app_line", "host_line", "parse_hint", "weight_of"]

MAX_HINT: Final = 256  # bytes: an agent-send string is a domain or tenant/app; anything longer is not ours


@dataclass(frozen=True, slots=True)
class GroupRoom:
    """One active group, as the pool sees it: its routable workers' occupancies (reception first), the workers
    the supervisor holds for it (the cap counts those), its thresholds and cap, and whether a cgroup limit holds
    its scale-up."""

    occupancies: tuple[float, ...]
    counted_workers: int
    max_workers: int | None
    reception_threshold: float
    admission_threshold: float
    held: bool = False
    failed: bool = False  # its workers failed and none serves: it takes no one
    share: float = 1.0  # the share of the app's new users it gets (the canary's, or the rest)

    @property
    def room(self) -> float:
        if self.held or self.failed:
            return 0.0
        n = len(self.occupancies)
        capacity = self.reception_threshold + (n - 1) * self.admission_threshold if n else 0.0
        headroom = max(capacity - sum(self.occupancies), 0.0)
        if self.max_workers is None:
            return math.inf
        # (the routable ones count even when the supervisor's count lags: a worker just launched by a reload)
        startable = cap.startable(self.max_workers, max(self.counted_workers, n)) or 0
        if startable and not n and not self.counted_workers:
            # at zero: the first to start is the reception, worth its own threshold
            return headroom + self.reception_threshold + (startable - 1) * self.admission_threshold
        return headroom + startable * self.admission_threshold

    @property
    def potential(self) -> float:
        """Its capacity at max_workers (inf when unbounded)."""
        if self.max_workers is None:
            return math.inf
        return self.reception_threshold + (self.max_workers - 1) * self.admission_threshold


@dataclass(frozen=True, slots=True)
class AppRoom:
    name: str  # "tenant/app"
    groups: tuple[GroupRoom, ...]
    draining: bool = False  # every worker of it is being emptied (moved off, retired)
    failed: bool = False  # it cannot serve: no routable worker and one that failed
    removed: bool = False  # a reload removed it (its workers finish; its users get 404)
    remote: bool = False  # its active groups are nodes: (another host's room: that host's agent says it)
    maxconn: int | None = None  # its tenant's max_concurrent_requests (HAProxy queues beyond it)


def weight_of(groups: Sequence[GroupRoom]) -> int:
    """The weight in percent (0 to 100) of these groups together: each one's room over its potential, weighed by
    the share of new users it gets."""
    shares = sum(g.share for g in groups)
    if shares <= 0:
        return 0
    return max(0, min(100, math.floor(100 * sum(g.share * _ratio(g) for g in groups) / shares)))


def _ratio(group: GroupRoom) -> float:
    if group.held or group.failed:
        return 0.0
    if group.max_workers is None:
        return 1.0  # unbounded and not held: it can always start another worker
    return min(group.room / group.potential, 1.0) if group.potential > 0 else 0.0


def app_line(app: AppRoom | None, hint: str, stopping: bool = False) -> str:
    """The answer to a check that named an app (``hint``); ``app`` None: the hint names no app of this host."""
    if app is None:
        return f"down #no app {_safe(hint)} here\n"
    if app.removed:
        return f"maint #{app.name}: removed from this host\n"
    if stopping:
        return f"drain #{app.name}: elasticd is stopping\n"
    if app.failed:
        return f"maint #{app.name}: its workers failed\n"
    if app.draining:
        return f"drain #{app.name}: its workers are being emptied\n"
    maxconn = f" maxconn:{app.maxconn or 0}"
    if app.remote:
        return f"up ready 100%{maxconn} #{app.name}: served by nodes (their own agents say their room)\n"
    weight = weight_of(app.groups)
    held = " (held by a cgroup limit)" if any(g.held for g in app.groups) else ""
    return f"up ready {weight}%{maxconn} #{app.name}: room {_room_text(app.groups)}{held}\n"


def host_line(apps: Sequence[AppRoom], stopping: bool = False) -> str:
    """The answer with no hint: the whole host, its apps that can serve together."""
    if stopping:
        return "drain #elasticd is stopping\n"
    serving = [a for a in apps if not a.draining and not a.failed and not a.removed and not a.remote]
    if not serving:
        if any(a.remote for a in apps):
            return "up ready 100% #served by nodes (their own agents say their room)\n"
        return "maint #no app can serve\n" if apps else "up ready 100% #no app configured\n"
    groups = [g for a in serving for g in a.groups]
    return f"up ready {weight_of(groups)}% #{len(serving)} app{'s' if len(serving) != 1 else ''}: room " \
           f"{_room_text(groups)}\n"


def _room_text(groups: Sequence[GroupRoom]) -> str:
    room = sum(g.room for g in groups)
    potential = sum(g.potential for g in groups)
    return f"{_num(room)} of {_num(potential)}"


def _num(value: float) -> str:
    return "unbounded" if math.isinf(value) else f"{value:.2f}"


@dataclass(frozen=True, slots=True)
class Hint:
    """What HAProxy sent: nothing (``text`` ""), a domain or ``tenant/app``; ``error``: why it is not one."""

    text: str
    error: str | None = None


def parse_hint(data: bytes) -> Hint:
    """HAProxy's ``agent-send`` bytes, as received (its newline or not): one line of printable ASCII, a host name
    (case and a trailing dot ignored, a port stripped) or ``tenant/app``."""
    if len(data) > MAX_HINT:
        return Hint("", f"a hint of over {MAX_HINT} bytes")
    line = data.split(b"\n", 1)[0].strip()
    if not line:
        return Hint("")
    if not all(33 <= byte < 127 for byte in line):
        return Hint("", "a hint that is not one word of printable ASCII")
    text = line.decode("ascii")
    if "/" not in text:
        text = text.lower()
        if text.count(":") == 1:
            text = text.partition(":")[0]
        text = text.rstrip(".")
    return Hint(text)


def _safe(text: str) -> str:
    return "".join(c for c in text if c.isprintable() and c not in "\r\n#")[:80]
