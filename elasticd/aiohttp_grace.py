"""How long an aiohttp runner waits for handlers still running when it is cleaned up, on every aiohttp.

aiohttp >= 3.9 takes ``shutdown_timeout`` on the runner, 3.8 (Debian bookworm) on the site; its default is 60 s,
which is how long one slow admin request could hold a ``systemctl stop``. elasticd's own servers (the admin API,
the metrics page) and the demo app pass theirs here.
"""

from __future__ import annotations

import inspect
from typing import TypedDict

from aiohttp import web

__all__ = ["Grace", "grace"]

_ON_RUNNER = "shutdown_timeout" in inspect.signature(web.BaseRunner.__init__).parameters


class Grace(TypedDict, total=False):
    """Keyword arguments that both aiohttp's runner and its site take (a TypedDict, so a type checker sees the
    one keyword and its type rather than any float)."""

    shutdown_timeout: float


def grace(seconds: float) -> tuple[Grace, Grace]:
    """(keyword arguments for the runner, for the site)."""
    kwargs = Grace(shutdown_timeout=seconds)
    return (kwargs, Grace()) if _ON_RUNNER else (Grace(), kwargs)
