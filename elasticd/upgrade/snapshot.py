"""What lives only in the daemon's memory and a re-exec must carry: the surface's users and the tenants' quota
buckets, read out of their objects into the state document and written back into the new image's (pure: objects in,
data out, and back; no clock is read — the monotonic clock both images share is in the values).

Carried for a user: its worker, group, app, login, when it was last seen and its totals (requests, seconds). Not
carried: its consumption's recent epochs (the rates a placement policy reads start afresh, as for a new user), and
a move's or a pin's flag (a re-exec begins with no move under way).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from elasticd.front.core.quota import QuotaBook
from elasticd.front.core.sticky import Surface
from elasticd.upgrade.state import SavedUser

__all__ = ["restore_buckets", "restore_users", "saved_buckets", "saved_users"]


def saved_users(surface: Surface) -> tuple[SavedUser, ...]:
    return tuple(SavedUser(user, entry.worker, entry.group, entry.app, entry.login, entry.seen, entry.requests,
                           entry.seconds)
                 for user, entry in surface.users.items())


def restore_users(surface: Surface, users: Iterable[SavedUser], keep: Callable[[SavedUser], bool]) -> int:
    """Put back the users ``keep`` says (those on an adopted worker); the number put back."""
    count = 0
    for saved in users:
        if not keep(saved):
            continue
        entry = surface.assign(saved.user, saved.worker, saved.seen, saved.group or None, saved.app)
        entry.login = saved.login
        entry.requests = saved.requests
        entry.seconds = saved.seconds
        count += 1
    return count


def saved_buckets(book: QuotaBook) -> dict[str, tuple[float, float]]:
    """tenant → (tokens, when counted), for the tenants with a rate limit."""
    return {tenant: (quota.bucket.tokens, quota.bucket.stamp)
            for tenant, quota in book.tenants.items() if quota.bucket is not None}


def restore_buckets(book: QuotaBook, buckets: Mapping[str, tuple[float, float]]) -> None:
    """Each tenant's bucket as it was (clamped to its burst now: the configuration may have changed between): a
    tenant that spent its burst just before a re-exec does not get a fresh one from it."""
    for tenant, (tokens, stamp) in buckets.items():
        quota = book.get(tenant)
        if quota is not None and quota.bucket is not None:
            quota.bucket.tokens = min(tokens, quota.bucket.cap)
            quota.bucket.stamp = stamp
