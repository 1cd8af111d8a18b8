"""``GET /monitor`` on ``metrics_listen``: the monitor page, and ``GET /monitor/state`` its JSON.

The page (``monitor.html`` beside this file) is one HTML document with its CSS and script inline and no other
asset (it works on a host with no internet); it fetches ``/monitor/state?app=TENANT/APP`` every few seconds
and redraws without reloading. The state is the daemon's (``StateFn``): the app list, the chosen app's pool
(``GET /v1/apps/…/pool``'s document) and its population.

Who sees the page (it shows user names). No tenant's process: the listener guard refuses those before a byte is
read (listener_guard/). With ``server.monitor`` set, whoever has its credentials. Without it, this host's own
browser alone: a peer on this host (a loopback address, or the address it connected to) and a ``Host`` that is an
address or ``localhost`` (a DNS-rebinding page sends its own name); another host (``metrics_listen`` on a public
address, for a Prometheus elsewhere) is told to set ``server.monitor``. So basic auth is optional where the page
stays on the host, and needed to open it to others. ``/metrics`` stays open to the scraper either way.
"""

from __future__ import annotations

import importlib.resources
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from elasticd.monitor.auth import CHALLENGE, Credentials, authorized

__all__ = ["MonitorPage", "StateFn", "local_host"]

# (the app asked for as "tenant/app", or None for the first) → the page's state; LookupError: no such app
StateFn = Callable[[str | None], Awaitable[dict[str, Any]]]

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer"}
# The page's own inline script and style, nothing else: no request leaves for another origin.
_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:"


def local_host(host: str) -> bool:
    """Whether a Host header names an address (v4, [v6]) or localhost, whatever the port."""
    name = host.strip().lower()
    if name.startswith("["):
        name = name[1:name.find("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.partition(":")[0]
    name = name.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _on_this_host(request: web.Request) -> bool:
    """Whether the peer is on this host: a loopback address, or the address it connected to (a connection to one
    of the host's own addresses comes from that address)."""
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    own = transport.get_extra_info("sockname") if transport is not None else None
    if not isinstance(peer, tuple):
        return False
    try:
        ip = ipaddress.ip_address(str(peer[0]).split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or (isinstance(own, tuple) and str(own[0]).split("%", 1)[0] == str(peer[0]).split("%", 1)[0])


class MonitorPage:
    __slots__ = ("_html", "_state", "credentials")

    def __init__(self, state: StateFn, credentials: Credentials | None = None) -> None:
        self._state = state
        self.credentials = credentials  # swapped by the daemon at each reload
        self._html = importlib.resources.files("elasticd.monitor").joinpath("monitor.html").read_bytes()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/monitor", self._page)
        app.router.add_get("/monitor/state", self._state_json)

    def _refused(self, request: web.Request) -> web.Response | None:
        if self.credentials is None:
            if not _on_this_host(request):
                return web.Response(status=403, text="403: without server.monitor (basic auth), the monitor answers "
                                                     "only a browser on elasticd's host; set server.monitor to open "
                                                     "it to others\n", headers=_HEADERS)
            if local_host(request.host):
                return None
            # Without credentials the page is for this host's own browser: a Host that is a name (not an address,
            # not localhost) is what a DNS-rebinding page would send to read the logins from a browser on it.
            return web.Response(status=403, text=f"403: without server.monitor (basic auth), the monitor answers "
                                                 f"only a Host that is an address or localhost, not {request.host!r}\n",
                                headers=_HEADERS)
        if authorized(request.headers.get("Authorization"), self.credentials):
            return None
        return web.Response(status=401, text="401: the monitor needs the user and password of server.monitor\n",
                            headers={"WWW-Authenticate": CHALLENGE, **_HEADERS})

    async def _page(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        return web.Response(body=self._html, content_type="text/html", charset="utf-8",
                            headers={**_HEADERS, "Content-Security-Policy": _CSP})

    async def _state_json(self, request: web.Request) -> web.Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        app = request.query.get("app") or None
        if app is not None and app.count("/") != 1:
            return web.json_response({"error": f"app={app!r}: name the app as TENANT/APP"}, status=400,
                                     headers=_HEADERS)
        try:
            state = await self._state(app)
        except LookupError as exc:
            return web.json_response({"error": str(exc).strip("'\"")}, status=404, headers=_HEADERS)
        return web.json_response(state, headers=_HEADERS)
