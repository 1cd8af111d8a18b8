"""``GET /monitor`` on ``metrics_listen``: the monitor page, and ``GET /monitor/state`` its JSON.

The page (``monitor.html`` beside this file) is one HTML document with its CSS and script inline and no other
asset (it works on a host with no internet); it fetches ``/monitor/state?app=TENANT/APP`` every few seconds
and redraws without reloading. The state is the daemon's (``StateFn``): the app list, the chosen app's pool
(``GET /v1/apps/…/pool``'s document) and its population.

Both answer only with the credentials of ``server.monitor`` when it is set (the page shows user names);
``/metrics`` stays open to the scraper either way.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from elasticd.monitor.auth import CHALLENGE, Credentials, authorized

__all__ = ["MonitorPage", "StateFn"]

# (the app asked for as "tenant/app", or None for the first) → the page's state; LookupError: no such app
StateFn = Callable[[str | None], Awaitable[dict[str, Any]]]

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY",
            "Referrer-Policy": "no-referrer"}
# The page's own inline script and style, nothing else: no request leaves for another origin.
_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:"


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
