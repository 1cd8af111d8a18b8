"""How long an aiohttp runner waits for handlers still running when it is cleaned up, on every aiohttp.

aiohttp >= 3.9 takes ``shutdown_timeout`` on the runner, 3.8 (Debian bookworm) on the site; its default is 60 s,
which is how long one slow admin request could hold a ``systemctl stop``. elasticd's own servers (the admin API,
the metrics page) and the demo app pass theirs here.
"""

from __future__ import annotations

import inspect

from aiohttp import web

__all__ = ["grace"]

_ON_RUNNER = "shutdown_timeout" in inspect.signature(web.BaseRunner.__init__).parameters


def grace(seconds: float) -> tuple[dict[str, float], dict[str, float]]:
    """(keyword arguments for the runner, for the site)."""
    kwargs = {"shutdown_timeout": seconds}
    return (kwargs, {}) if _ON_RUNNER else ({}, kwargs)
