"""Which group of an app a user goes to: a pure decision over the route and the user's surface entry.

Groups are runtime versions of an app (seed 000, "Group = runtime version"): green and blue, a canary. A user
placed in a group stays there while it is on the surface (sticky): a blue/green switch (a reload that changes
``default_group``) sends new users to the new group while every placed user finishes where it is, and a canary
share that changes moves nobody already placed. No user is moved across groups: a live move's package is only
safe within one runtime. A new user goes to the canary when a stable hash of its id falls within the share,
else to the default group. A user whose group is gone (removed by a reload) is chosen for again.

The user id is 128 random bits (``sticky.new_user_id``), so its first 32 bits are the stable, uniform hash.
"""

from __future__ import annotations

from typing import Final

from elasticd.front.core.routing import AppRoute

__all__ = ["CANARY", "DEFAULT", "REASONS", "STICKY", "canary_point", "choose_group"]

DEFAULT: Final = "default"  # a new user, to the default group
CANARY: Final = "canary"  # a new user whose id falls within the canary's share
STICKY: Final = "sticky"  # a placed user kept on a group new users no longer go to (the old one of a switch)
REASONS: Final = (DEFAULT, CANARY, STICKY)
_SPAN: Final = float(1 << 32)


def canary_point(user: str) -> float:
    """Where a user id falls in [0, 1): its first 32 bits (hex) over 2**32."""
    return int(user[:8], 16) / _SPAN


def choose_group(route: AppRoute, user: str, placed: str = "") -> tuple[str, str]:
    """(the group, why) for ``user``; ``placed``: the group the surface has it in ("" for none)."""
    fresh = route.canary if route.canary is not None and canary_point(user) < route.canary_share else route.group
    if placed and placed in route.groups:
        return placed, (STICKY if placed != fresh else (CANARY if placed == route.canary else DEFAULT))
    return fresh, (CANARY if fresh == route.canary and fresh != route.group else DEFAULT)
