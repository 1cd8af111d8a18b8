"""The admin API: HTTP/JSON on a Unix socket that only root (or ``server.admin_group``) may open.

Routes are described in ``openapi.yaml`` beside this file. The handlers are thin: the daemon answers
(``Control``), this module only speaks HTTP, and every refusal is a JSON body with an ``error`` string.
"""

from __future__ import annotations

import contextlib
import grp
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiohttp import web

from elasticd.accounting.usage import parse_apps_flag, parse_interval_ms
from elasticd.aiohttp_grace import grace
from elasticd.listeners import Listeners
from elasticd.loop_slices import gather_in_slices
from elasticd.tenant_files.document import MAX_BODY

__all__ = ["AdminApi", "Control", "ReloadOutcome", "SocketInUse"]

log = logging.getLogger("elasticd.api")

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

STOP_GRACE = 2.0  # seconds an admin request still running at a stop may take (aiohttp's default is 60)


async def json_in_slices(value: dict[str, Any], key: str) -> bytes:
    """``json.dumps(value)``, with its largest mapping, ``value[key]`` (its last key), encoded an entry at a time and a
    turn of the loop whenever a slice took LOOP_SLICE: the json module's C encoder holds the interpreter for all it
    encodes in one call, and a 10,000-app status is megabytes (tens of ms, the front's loop waiting)."""
    keys = list(value)
    if not keys or keys[-1] != key:
        raise ValueError(f"json_in_slices: {key!r} must be the last key")  # (a bug of ours: the text's order)
    head = json.dumps({k: v for k, v in value.items() if k != key})
    entries = await gather_in_slices(f"{json.dumps(name)}: {json.dumps(entry)}" for name, entry in value[key].items())
    # (json.dumps' own separators: ", " between items, ": " after a key)
    text = head[:-1] + (", " if len(keys) > 1 else "") + json.dumps(key) + ": {" + ", ".join(entries) + "}}"
    return text.encode()


class ReloadOutcome(Protocol):
    ok: bool
    error: str | None
    problems: list[str]
    written: list[str]


class LimitsOutcome(Protocol):
    status: int
    body: dict[str, Any]


class Control(Protocol):
    async def status_in_slices(self) -> dict[str, Any]: ...
    async def reload(self, everything: bool = False) -> ReloadOutcome: ...
    async def set_limits(self, tenant: str, body: Any) -> LimitsOutcome: ...
    async def clear_limits(self, tenant: str, names: str | None) -> LimitsOutcome: ...
    async def put_tenant(self, tenant: str, raw: bytes, content_type: str, create_only: bool) -> LimitsOutcome: ...
    async def get_tenant(self, tenant: str) -> LimitsOutcome: ...
    async def delete_tenant(self, tenant: str) -> LimitsOutcome: ...
    async def usage(self, interval_ms: int, apps: bool) -> dict[str, Any]: ...
    def pool_state(self, tenant: str, app: str) -> dict[str, Any]: ...
    async def population(self, tenant: str, app: str) -> dict[str, Any]: ...
    async def drain(self, worker_id: str) -> dict[str, Any]: ...
    async def upgrade(self) -> tuple[bool, str]: ...
    def upgrade_state(self) -> dict[str, Any]: ...


class SocketInUse(RuntimeError):
    pass


class AdminApi:
    __slots__ = ("_control", "_runner", "group", "path")

    def __init__(self, control: Control, path: str, group: str | None = None) -> None:
        self._control = control
        self.path = path
        self.group = group
        self._runner: web.AppRunner | None = None

    def _app(self) -> web.Application:
        # (a tenant's configuration is at most document.MAX_BODY: a bigger body is refused as it arrives, 413)
        app = web.Application(middlewares=[_json_errors], client_max_size=MAX_BODY)
        app.router.add_get("/v1/status", self._status)
        app.router.add_post("/v1/reload", self._reload)
        app.router.add_post("/v1/upgrade", self._upgrade)
        app.router.add_get("/v1/upgrade", self._upgrade_state)
        app.router.add_get("/v1/tenants", self._tenants)
        app.router.add_get("/v1/tenants/usage", self._usage)
        app.router.add_post("/v1/tenants/{tenant}/limits", self._set_limits)
        app.router.add_delete("/v1/tenants/{tenant}/limits", self._clear_limits)
        app.router.add_put("/v1/tenants/{tenant}/config", self._put_tenant)
        app.router.add_get("/v1/tenants/{tenant}/config", self._get_tenant)
        app.router.add_delete("/v1/tenants/{tenant}/config", self._delete_tenant)
        app.router.add_get("/v1/apps/{tenant}/{app}/pool", self._pool)
        app.router.add_get("/v1/apps/{tenant}/{app}/population", self._population)
        app.router.add_post("/v1/workers/{worker}/drain", self._drain)
        return app

    async def start(self, listeners: Listeners | None = None) -> None:
        """Serve on the admin socket: the previous image's (a re-exec in place: ``listeners``), or bound now."""
        listeners = listeners if listeners is not None else Listeners()
        # Resolve the group before binding, so a typo refuses to start rather than leaving a 0600 socket.
        gid = _group_id(self.group) if self.group else None
        on_runner, on_site = grace(STOP_GRACE)
        self._runner = web.AppRunner(self._app(), access_log=None, **on_runner)
        await self._runner.setup()
        sock = listeners.take_unix("admin", self.path)
        if sock is None:
            _claim_socket_path(self.path)
            # The umask makes the socket private from its first instant; chmod then only ever widens it.
            bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old_umask = os.umask(0o177)
            try:
                bound.bind(self.path)
                bound.listen(128)
            except BaseException:
                bound.close()
                raise
            finally:
                os.umask(old_umask)
            sock = listeners.hold("admin", bound)
        await web.SockSite(self._runner, sock, **on_site).start()
        if gid is not None:
            os.chown(self.path, 0 if os.geteuid() == 0 else -1, gid)
            os.chmod(self.path, 0o660)
        else:
            os.chmod(self.path, 0o600)
        log.info("admin API on %s", self.path)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    async def _status(self, request: web.Request) -> web.Response:
        body = await json_in_slices(await self._control.status_in_slices(), "tenants")
        return web.Response(body=body, content_type="application/json")

    async def _tenants(self, request: web.Request) -> web.Response:
        tenants = (await self._control.status_in_slices())["tenants"]
        return web.json_response({name: {"limits": t["limits"], "apps": sorted(t["apps"]), "user": t["user"]}
                                  for name, t in tenants.items()})

    async def _usage(self, request: web.Request) -> web.Response:
        try:
            interval_ms = parse_interval_ms(request.query.get("interval_ms"))
            apps = parse_apps_flag(request.query.get("apps"))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(await self._control.usage(interval_ms, apps))

    async def _pool(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(self._control.pool_state(request.match_info["tenant"],
                                                              request.match_info["app"]))
        except LookupError as exc:
            return web.json_response({"error": str(exc)}, status=404)

    async def _population(self, request: web.Request) -> web.Response:
        """Answers within the monitor's timeout whatever the workers do: one that does not answer is an error
        row."""
        try:
            return web.json_response(await self._control.population(request.match_info["tenant"],
                                                                    request.match_info["app"]))
        except LookupError as exc:
            return web.json_response({"error": str(exc)}, status=404)

    async def _drain(self, request: web.Request) -> web.Response:
        """Answers once the worker is empty and retired (200, ``empty``), or kept after a move failed (200,
        ``failed``): the moves take up to ``move_timeout`` each."""
        worker = request.match_info["worker"]
        try:
            return web.json_response(await self._control.drain(worker))
        except KeyError:
            return web.json_response({"error": f"no worker {worker}"}, status=404)
        except (ValueError, TimeoutError) as exc:
            return web.json_response({"error": str(exc)}, status=409)

    async def _set_limits(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as exc:
            return web.json_response({"error": f"body: not JSON: {exc}"}, status=400)
        outcome = await self._control.set_limits(request.match_info["tenant"], body)
        return web.json_response(outcome.body, status=outcome.status)

    async def _put_tenant(self, request: web.Request) -> web.Response:
        """The tenant's own file, created or replaced (201 or 200); ``If-None-Match: *`` only creates (409 when it
        exists: elasticctl tenant add)."""
        raw = await request.read()  # (over client_max_size: 413 from aiohttp, before any of it is kept)
        create_only = request.headers.get("If-None-Match", "").strip() == "*"
        outcome = await self._control.put_tenant(request.match_info["tenant"], raw,
                                                 request.headers.get("Content-Type", "application/json"), create_only)
        return web.json_response(outcome.body, status=outcome.status)

    async def _get_tenant(self, request: web.Request) -> web.Response:
        outcome = await self._control.get_tenant(request.match_info["tenant"])
        return web.json_response(outcome.body, status=outcome.status)

    async def _delete_tenant(self, request: web.Request) -> web.Response:
        outcome = await self._control.delete_tenant(request.match_info["tenant"])
        return web.json_response(outcome.body, status=outcome.status)

    async def _clear_limits(self, request: web.Request) -> web.Response:
        """?limits=cpu,memory clears those overrides; no query clears them all."""
        outcome = await self._control.clear_limits(request.match_info["tenant"], request.query.get("limits"))
        return web.json_response(outcome.body, status=outcome.status)

    async def _reload(self, request: web.Request) -> web.Response:
        """?all=1: every file parsed again and every tenant's cgroup files written (elasticctl reload --all)."""
        everything = request.query.get("all", "0")
        if everything not in ("0", "1", "true", "false"):
            return web.json_response({"error": f"all={everything!r}: 1 or 0"}, status=400)
        outcome = await self._control.reload(everything in ("1", "true"))
        if not outcome.ok:
            return web.json_response({"ok": False, "error": outcome.error, "problems": outcome.problems},
                                     status=422)
        return web.json_response({"ok": True, "problems": outcome.problems, "written": outcome.written})


    async def _upgrade(self, request: web.Request) -> web.Response:
        """202 once the preflight passed and the hand-over began (this connection ends with the exec: poll
        ``GET /v1/upgrade`` for the report); 409 with the reason when refused (nothing was stopped)."""
        began, message = await self._control.upgrade()
        if not began:
            return web.json_response({"ok": False, "error": message}, status=409)
        return web.json_response({"ok": True, "message": message, **self._control.upgrade_state()}, status=202)

    async def _upgrade_state(self, request: web.Request) -> web.Response:
        return web.json_response(self._control.upgrade_state())


@web.middleware
async def _json_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": f"{exc.reason}: {request.method} {request.path}"}, status=exc.status)


def _group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ValueError(f'server.admin_group: there is no group "{name}"') from None


def _claim_socket_path(path: str) -> None:
    """Remove a stale socket left by a crash, but never steal the socket of an elasticd that still runs."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(path)
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise SocketInUse(f"another process answers on the admin socket {path} (is elasticd already running?)")
