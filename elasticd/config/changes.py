"""What a reload changed, tenant by tenant (pure): the tenants whose cgroup files a reload writes.

A reload of a hosting host re-reads thousands of tenants to change one (a panel wrote one file); writing every
tenant's cgroup files again is 10,000 apps' worth of writes for nothing. A tenant is written when it is new, or its
settings differ (its resources, its apps: a new app's root may bring a new disk under io.max). Run-time overrides
need no reload: the limits API writes them at once (limits/runtime.py), and a reload writes a changed tenant's
config values with its overrides over them. An unchanged included file's tenants are the very objects of the last
load (config/include.py), so most comparisons are an identity check.
"""

from __future__ import annotations

from elasticd.config.model import Config

__all__ = ["changed_tenants"]


def changed_tenants(old: Config | None, new: Config) -> frozenset[str]:
    """The tenants of ``new`` whose limits must be written; all of them when there is no ``old`` (a start)."""
    if old is None:
        return frozenset(new.tenants)
    return frozenset(name for name, tenant in new.tenants.items()
                     if (before := old.tenants.get(name)) is not tenant and before != tenant)
