"""How much of a worker's channel elasticd reads, and when it stops reading: the channel's bounds (issue 27).

Pure: time is passed in. The channel's shell (``pool/channel_server.py``) asks, per line a peer sends, what to do with
it; the answers are allowances (token buckets), kept per worker and not per connection, so a worker that
reconnects gets no fresh allowance.

Why pacing and not parsing-then-discarding: a worker that writes reports flat out (30,000 a second, measured)
cost elasticd a whole core when each was read, parsed and refused — every tenant's front ran on what was left.
Here a report over the allowance is the last line read for a while: the shell sleeps until the next one is due,
its stream buffer fills, the kernel's socket buffer fills behind it, and the sender blocks in its own
``write``: the flood costs its own CPU, not elasticd's. A line that cannot be used at all (not JSON, an unknown
type, an answer nobody asked for) is a strike; a connection that keeps striking is closed. Reconnecting does not
refill anything: the next announce of the same worker is itself paced.
"""

from __future__ import annotations

from typing import Final

from elasticd.front.core.quota import TokenBucket

__all__ = ["ACCEPT_BURST", "ACCEPT_RATE", "ANNOUNCE_DEADLINE", "MAX_UNANNOUNCED", "MAX_UNANNOUNCED_PER_UID",
           "REPLY_BUFFER_BOUND", "ConnectionBudget", "Pacing", "Unannounced"]

# A worker reports once an interval (the library at a fixed rate, skipping ticks it is late for). Twice that,
# with a burst of three, leaves room for a report sent right after a reconnect and for a clock's jitter; more than
# that is no sensor's need.
REPORT_SLACK: Final = 2.0
REPORT_BURST: Final = 3
# Unusable lines: a bug of a worker's own library shows in the first few; ten, then one an interval, is ample.
STRIKE_BURST: Final = 10
# Announces of one worker (each one runs the process-tree walk of its authentication): its library reconnects
# after an error with a backoff that reaches the interval; five at once, then one an interval.
ANNOUNCE_BURST: Final = 5
# A connection must announce itself within this; the library does at once (its own announce timeout is 1 s).
ANNOUNCE_DEADLINE: Final = 2.0
# New connections to one tenant's channel socket: a tenant's workers all reconnect after a restart of elasticd
# (32 at once), and then one each now and then. Past it accepting pauses: the next wait in the kernel's backlog.
ACCEPT_BURST: Final = 32
ACCEPT_RATE: Final = 8.0
# Connections that have not announced yet, held open at once: per tenant socket and peer uid, and in all. Per socket
# too, not per uid alone: every tenant without a `user:` connects as root, and one of them holding root's allowance
# would have shut the others out (found by the hostile tenants' test). A tenant can hold at most its own
# allowance (a whole accept burst may wait for its announces at once: the tasks that read them run after the
# accepts), so the total is reached only by 32 tenants attacking at once.
MAX_UNANNOUNCED_PER_UID: Final = ACCEPT_BURST
MAX_UNANNOUNCED: Final = 1024
# What elasticd may have queued for a peer that it sent on its own (ok, error replies) before the peer is taken
# for one that does not read: an honest one reads them as they come, so a few lines are ever queued.
REPLY_BUFFER_BOUND: Final = 64 << 10


class Pacing:
    """One worker's allowances: reports, unusable lines (strikes) and announces."""

    __slots__ = ("_announces", "_interval", "_reports", "_strikes")

    def __init__(self, interval: float, now: float) -> None:
        if interval <= 0:
            raise ValueError(f"a report interval must be > 0, not {interval}")
        self._interval = interval
        self._reports = TokenBucket(REPORT_SLACK / interval, REPORT_BURST, now)
        self._strikes = TokenBucket(1.0 / interval, STRIKE_BURST, now)
        self._announces = TokenBucket(1.0 / interval, ANNOUNCE_BURST, now)

    @property
    def interval(self) -> float:
        return self._interval

    def report(self, now: float) -> float:
        """0.0: take this report. Otherwise it is refused, and the seconds to read nothing more of this peer."""
        return self._reports.take(now)

    def strike(self, now: float) -> bool:
        """An unusable line was read: True when the connection has struck out and is to be closed."""
        return self._strikes.take(now) > 0.0

    def announce(self, now: float) -> bool:
        """True when this worker may announce (again) now."""
        return self._announces.take(now) == 0.0

    def reconfigure(self, interval: float, now: float) -> None:
        """A reload changed the interval: the new rates hold from ``now``."""
        if interval <= 0:
            raise ValueError(f"a report interval must be > 0, not {interval}")
        self._interval = interval
        self._reports.reconfigure(REPORT_SLACK / interval, REPORT_BURST, now)
        self._strikes.reconfigure(1.0 / interval, STRIKE_BURST, now)
        self._announces.reconfigure(1.0 / interval, ANNOUNCE_BURST, now)


class ConnectionBudget:
    """New connections to one tenant's socket (a token bucket): past it, accepting pauses (they wait unaccepted)."""

    __slots__ = ("_bucket",)

    def __init__(self, now: float) -> None:
        self._bucket = TokenBucket(ACCEPT_RATE, ACCEPT_BURST, now)

    def accept(self, now: float) -> float:
        """0.0: accept one now; else the seconds until the next may be accepted."""
        return self._bucket.take(now)

    def unused(self) -> None:
        """The connection a token was taken for was not there after all (the accept found none): give it back."""
        bucket = self._bucket
        bucket.tokens = min(bucket.cap, bucket.tokens + 1.0)


class Unannounced:
    """Connections open that have not announced yet, per (tenant socket, peer uid) and in all."""

    __slots__ = ("_per_uid", "_per_uid_bound", "_total", "_total_bound")

    def __init__(self, per_uid: int = MAX_UNANNOUNCED_PER_UID, total: int = MAX_UNANNOUNCED) -> None:
        self._per_uid: dict[tuple[str, int], int] = {}
        self._per_uid_bound = per_uid
        self._total = 0
        self._total_bound = total

    def enter(self, tenant: str, uid: int) -> str | None:
        """None when this new connection may wait for its announce; else why it is closed at once."""
        held = self._per_uid.get((tenant, uid), 0)
        if held >= self._per_uid_bound:
            return f"uid {uid} already holds {held} connections to tenant {tenant}'s channel that have not announced"
        if self._total >= self._total_bound:
            return f"{self._total} connections have not announced yet"
        self._per_uid[tenant, uid] = held + 1
        self._total += 1
        return None

    def leave(self, tenant: str, uid: int) -> None:
        held = self._per_uid.get((tenant, uid), 0)
        if held <= 0:
            return
        if held == 1:
            del self._per_uid[tenant, uid]
        else:
            self._per_uid[tenant, uid] = held - 1
        self._total -= 1

    @property
    def total(self) -> int:
        return self._total
