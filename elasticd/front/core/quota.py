"""Per-tenant request quotas (ADR-0010 "Request quotas"): pure state over numbers, time passed in.

One ``TenantQuota`` per configured tenant — a concurrency gate and a token bucket — so memory is bounded by
the configuration, whatever the traffic. A reload re-limits the objects in place: requests in flight stay
counted under the new limits and the bucket keeps the tokens it had (clamped to the new burst), so a reload
neither forgets load nor hands out a fresh burst.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from elasticd.config.model import Quotas, default_burst

__all__ = ["CONCURRENCY", "RATE", "ConcurrencyGate", "QuotaBook", "QuotaRefusal", "TenantQuota", "TokenBucket",
           "retry_after"]

CONCURRENCY: Final = "concurrency"
RATE: Final = "rate"


def retry_after(wait: float) -> int:
    """Whole seconds a client should wait for ``wait`` seconds to pass: rounded up, and never 0 (a 0 would
    invite an immediate retry that is refused again)."""
    return max(1, math.ceil(wait - 1e-9))


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` held; a request takes one. Starts full."""

    __slots__ = ("burst", "cap", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, not {rate}, {burst}")
        self.rate = rate
        self.burst = burst
        self.cap = float(burst)
        self.tokens = self.cap
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:  # a clock that stepped back refills nothing, rather than draining the bucket
            self.tokens = min(self.cap, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def take(self, now: float) -> float:
        """0.0 when a token was taken; otherwise the seconds until one is due (nothing is taken)."""
        tokens = self.tokens
        if now > self.stamp:  # _refill, inlined: this runs once per request
            tokens += (now - self.stamp) * self.rate
            if tokens > self.cap:
                tokens = self.cap
            self.stamp = now
        if tokens >= 1.0:
            self.tokens = tokens - 1.0
            return 0.0
        self.tokens = tokens
        return (1.0 - tokens) / self.rate

    def reconfigure(self, rate: float, burst: int, now: float) -> None:
        """New limits from ``now`` on: what accrued so far accrued at the old rate."""
        if rate <= 0 or burst < 1:
            raise ValueError(f"a token bucket needs rate > 0 and burst >= 1, not {rate}, {burst}")
        self._refill(now)
        self.rate = rate
        self.burst = burst
        self.cap = float(burst)
        self.tokens = min(self.tokens, self.cap)


class ConcurrencyGate:
    """Requests in flight, against a limit (None: unlimited, still counted so a later limit sees them)."""

    __slots__ = ("in_flight", "limit")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.in_flight = 0

    def enter(self) -> bool:
        if self.limit is not None and self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        if self.in_flight > 0:
            self.in_flight -= 1


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """Why a request was refused: the status, the Retry-After seconds, and the metric's reason."""

    status: int
    retry_after: int
    reason: str


# Over the concurrency limit: a slot frees when some request ends, which the front cannot predict; one
# second is the shortest whole-second hint.
_BUSY: Final = QuotaRefusal(503, 1, CONCURRENCY)


class TenantQuota:
    """The gate and the bucket of one tenant. ``admit`` → None (go on; call ``leave`` when the answer is
    done) or the ``QuotaRefusal``. The gate is asked first: a request refused for concurrency takes no token."""

    __slots__ = ("bucket", "gate")

    def __init__(self, quotas: Quotas, now: float) -> None:
        self.gate = ConcurrencyGate(quotas.max_concurrent_requests)
        self.bucket = _bucket(quotas, now)

    def admit(self, now: float) -> QuotaRefusal | None:
        gate = self.gate
        if gate.limit is not None and gate.in_flight >= gate.limit:
            return _BUSY
        if self.bucket is not None:
            wait = self.bucket.take(now)
            if wait:
                return QuotaRefusal(429, retry_after(wait), RATE)
        gate.in_flight += 1
        return None

    def leave(self) -> None:
        self.gate.leave()

    def reconfigure(self, quotas: Quotas, now: float) -> None:
        self.gate.limit = quotas.max_concurrent_requests
        if quotas.requests_per_second is None:
            self.bucket = None
        elif self.bucket is None:
            self.bucket = _bucket(quotas, now)
        else:
            self.bucket.reconfigure(quotas.requests_per_second, _burst(quotas), now)


def _burst(quotas: Quotas) -> int:
    # The config fills burst in (one second's worth) when only the rate is given; be as kind to callers
    # that build Quotas by hand.
    assert quotas.requests_per_second is not None
    return quotas.burst if quotas.burst is not None else default_burst(quotas.requests_per_second)


def _bucket(quotas: Quotas, now: float) -> TokenBucket | None:
    if quotas.requests_per_second is None:
        return None
    return TokenBucket(quotas.requests_per_second, _burst(quotas), now)


class QuotaBook:
    """tenant → TenantQuota, for exactly the configured tenants."""

    __slots__ = ("tenants",)

    def __init__(self, quotas: Mapping[str, Quotas] | None = None, now: float = 0.0) -> None:
        self.tenants: dict[str, TenantQuota] = {}
        self.update(quotas or {}, now)

    def update(self, quotas: Mapping[str, Quotas], now: float) -> None:
        """Follow a reload: kept tenants are re-limited in place, new ones start full, removed ones go (their
        requests in flight hold their own object and finish against it)."""
        tenants = {}
        for name, limits in quotas.items():
            known = self.tenants.get(name)
            if known is None:
                known = TenantQuota(limits, now)
            else:
                known.reconfigure(limits, now)
            tenants[name] = known
        self.tenants = tenants

    def get(self, tenant: str) -> TenantQuota | None:
        return self.tenants.get(tenant)
