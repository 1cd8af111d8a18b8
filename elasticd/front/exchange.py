"""One request and its answer, as the front carries it: parsed head, routing, accounting and progress.

The same object is the open-requests entry of the accounting (``user``, ``worker``, ``ts``): nothing is
copied per request to keep that dict.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elasticd.front.core import http1
from elasticd.front.core.counters import RouteStats, WorkerCounters
from elasticd.front.core.quota import TenantQuota
from elasticd.front.core.routing import AppRoute
from elasticd.front.core.sticky import SurfaceUser

if TYPE_CHECKING:
    from elasticd.front.upstream import UpstreamConn

__all__ = ["NO_HEAD", "Exchange"]


class Exchange:
    """One request and its answer. Also the open-requests entry (``user``, ``worker``, ``ts``)."""

    __slots__ = ("body", "body_done", "conn", "cookie_line", "counters", "entry", "error", "finished", "head",
                 "http11", "login", "method", "quota", "retried", "rid", "route", "sent", "started", "stats",
                 "status", "ts", "url", "user", "worker")

    def __init__(self) -> None:
        self.method = b""
        self.url = b""
        self.head: http1.RequestHead = NO_HEAD
        self.http11 = True
        self.body: list[bytes] = []
        self.body_done = False
        self.error: tuple[int, str] | None = None
        self.finished = False  # answered (the rest of its body, if any, is read and dropped)
        self.sent = False  # the request went whole to the worker (head, body and its end)
        self.started = False  # the answer's head went to the client
        self.status = 0
        self.conn: UpstreamConn | None = None
        self.quota: TenantQuota | None = None
        self.route: AppRoute | None = None
        self.stats: RouteStats | None = None
        self.counters: WorkerCounters | None = None
        self.entry: SurfaceUser | None = None
        self.user: str | None = None
        self.worker: str | None = None
        self.cookie_line = b""
        self.login: bytes | None = None
        self.retried = False
        self.rid = 0
        self.ts = 0.0

    @property
    def live(self) -> bool:
        """Still relaying to or from a worker: an open-requests entry the sweep must not take, however old."""
        return self.conn is not None and not self.finished


NO_HEAD = http1.RequestHead()
