"""elasticctl: the operator's command line, a client of the admin API on its Unix socket.

Exit codes: 0 ok, 1 refused or failed (the reason on stderr), 2 usage (argparse's own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

import aiohttp

__all__ = ["AdminClient", "ApiError", "main"]

DEFAULT_SOCKET = "/run/elasticd/admin.sock"


class ApiError(Exception):
    pass


class AdminClient:
    """One request per call: elasticctl is short-lived, so no session outlives a command."""

    __slots__ = ("socket_path", "timeout")

    def __init__(self, socket_path: str, timeout: float = 120.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    async def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        connector = aiohttp.UnixConnector(path=self.socket_path)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session, \
                    session.request(method, f"http://elasticd{path}", json=body) as response:
                try:
                    data = await response.json(content_type=None)
                except (json.JSONDecodeError, aiohttp.ContentTypeError):
                    data = {"error": (await response.text()).strip()}
                return response.status, data
        except (aiohttp.ClientConnectionError, FileNotFoundError, PermissionError) as exc:
            raise ApiError(f"cannot reach elasticd on {self.socket_path}: {exc}") from None
        except TimeoutError:
            raise ApiError(f"elasticd on {self.socket_path} did not answer within {self.timeout:g}s") from None


# ---------------------------------------------------------------------- rendering


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600:02d}h"


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in [header, *rows]]
    return "\n".join(lines)


def render_status(status: dict[str, Any]) -> str:
    cg = status["cgroups"]
    if cg["enforced"]:
        cgroups = f"enforced under {cg['base']} (mode {cg['mode']})"
        if cg["missing_controllers"]:
            cgroups += f"; missing controllers: {', '.join(cg['missing_controllers'])}"
    else:
        cgroups = cg.get("warning") or f"NOT enforced (mode {cg['mode']})"
    out = [f"elasticd {status['version']}  pid {status['pid']}  up {_duration(status['uptime'])}  "
           f"front {status['listen']}  config {status['config']}",
           f"cgroups: {cgroups}"]
    last = status.get("last_reload")
    if last:
        out.append(f"last reload: {'ok' if last['ok'] else 'REFUSED'} at {last['at']}")
        if not last["ok"] and last.get("error"):
            out.extend("  " + line for line in last["error"].splitlines())
    rows = []
    for tname, tenant in status["tenants"].items():
        for aname, app in tenant["apps"].items():
            for gname, group in app["groups"].items():
                label = gname + ("*" if gname == app["default_group"] else "")
                if not group["workers"]:
                    rows.append([tname, aname, label, "-", "-", "none", "-", "-"])
                for w in group["workers"]:
                    rows.append([tname, aname, label, w["id"], str(w["pid"] or "-"), w["state"],
                                 _duration(w["uptime"]), str(w["restarts"])])
    out.append("")
    out.append(table(["TENANT", "APP", "GROUP", "WORKER", "PID", "STATE", "UPTIME", "RESTARTS"], rows)
               if rows else "no apps configured")
    return "\n".join(out)


# ---------------------------------------------------------------------- commands


async def _status(client: AdminClient, args: argparse.Namespace) -> int:
    code, data = await client.request("GET", "/v1/status")
    if code != 200:
        raise ApiError(data.get("error") or f"HTTP {code}")
    print(json.dumps(data, indent=2) if args.json else render_status(data))
    return 0


async def _reload(client: AdminClient, args: argparse.Namespace) -> int:
    code, data = await client.request("POST", "/v1/reload")
    if args.json:
        print(json.dumps(data, indent=2))
    if code != 200 or not data.get("ok"):
        print(f"reload refused: {data.get('error') or f'HTTP {code}'}", file=sys.stderr)
        return 1
    for problem in data.get("problems", []):
        print(f"warning: {problem}", file=sys.stderr)
    if not args.json:
        print("reloaded")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elasticctl", description="Control a running elasticd.")
    p.add_argument("--socket", default=os.environ.get("ELASTIC_ADMIN_SOCKET", DEFAULT_SOCKET),
                   help=f"admin socket (default $ELASTIC_ADMIN_SOCKET or {DEFAULT_SOCKET})")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = sub.add_parser("status", help="what runs: cgroups, tenants, apps, workers")
    status.add_argument("--json", action="store_true", help="the raw JSON of GET /v1/status")
    status.set_defaults(run=_status)
    reload = sub.add_parser("reload", help="re-read the config file (a refused file changes nothing)")
    reload.add_argument("--json", action="store_true")
    reload.set_defaults(run=_reload)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    client = AdminClient(args.socket)
    try:
        return asyncio.run(args.run(client, args))
    except ApiError as exc:
        print(f"elasticctl: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
