"""``elasticctl tenant add|set|remove|show``: a tenant's own file, for a hosting panel or an operator's script.

``add TENANT FILE|-`` creates it (refused when the tenant exists), ``set TENANT FILE|-`` creates or replaces it:
FILE (or standard input) holds the tenant's mapping, as it would stand under ``tenants.<tenant>`` in a config file,
in YAML (JSON is YAML too). ``remove TENANT`` drains its users, stops its workers and removes its cgroups and its
file; ``show TENANT`` prints its configuration and the file that holds it. Each prints what was applied.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any
from urllib.parse import quote

from .client import AdminClient, CommandRefused, error_of

__all__ = ["add_tenant_parser"]

_MAX_INPUT = 1 << 20  # elasticd refuses more (413): said here, before it is sent


def _read_source(source: str) -> bytes:
    try:
        if source == "-":
            data = sys.stdin.buffer.read(_MAX_INPUT + 1)
        else:
            with open(source, "rb") as handle:
                data = handle.read(_MAX_INPUT + 1)
    except OSError as exc:
        raise CommandRefused("elasticctl tenant", f"cannot read {source}: {exc.strerror or exc}") from None
    if len(data) > _MAX_INPUT:
        raise CommandRefused("elasticctl tenant", f"{source} is over {_MAX_INPUT} bytes: no tenant is that large")
    return data


def _path(tenant: str) -> str:
    return f"/v1/tenants/{quote(tenant, safe='')}/config"


def _print(data: Any, args: argparse.Namespace, line: str) -> None:
    print(json.dumps(data, indent=2) if args.json else line)


async def _put(client: AdminClient, args: argparse.Namespace) -> int:
    create_only = args.tenant_command == "add"
    headers = {"Content-Type": "application/yaml"}
    if create_only:
        headers["If-None-Match"] = "*"
    code, data = await client.request("PUT", _path(args.tenant), data=_read_source(args.source), headers=headers)
    if code not in (200, 201):
        problems = "".join(f"\n  {p}" for p in data.get("problems", [])) if isinstance(data, dict) else ""
        raise CommandRefused(f"tenant {args.tenant} {args.tenant_command} refused", error_of(data, code) + problems)
    written = data["applied"]["cgroups_written"]
    for problem in data["applied"]["problems"]:
        print(f"warning: {problem}", file=sys.stderr)
    _print(data, args, f"tenant {args.tenant}: {'created' if data['created'] else 'replaced'} {data['file']}, "
                       f"applied ({'its cgroup files written' if written else 'no cgroup file changed'})"
                       + (f"; the old file kept as {data['backup']}" if data.get("backup") else ""))
    return 0


async def _remove(client: AdminClient, args: argparse.Namespace) -> int:
    code, data = await client.request("DELETE", _path(args.tenant))
    if code != 200:
        raise CommandRefused(f"tenant {args.tenant} remove refused", error_of(data, code))
    _print(data, args, f"tenant {args.tenant}: removed {data['removed']}; {data['workers_stopping']} workers draining "
                       "and stopping, then its cgroups removed"
                       + (f"; the file kept as {data['backup']}" if data.get("backup") else ""))
    return 0


async def _show(client: AdminClient, args: argparse.Namespace) -> int:
    code, data = await client.request("GET", _path(args.tenant))
    if code != 200:
        raise CommandRefused(f"tenant {args.tenant}", error_of(data, code))
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        managed = "its own file" if data["managed"] else "not a managed tenant file"
        print(f"# tenant {args.tenant}: {data['file']} ({managed})")
        print(json.dumps(data["config"], indent=2))
    return 0


def add_tenant_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tenant = sub.add_parser("tenant", help="a tenant's own file: add, set, remove, show (for a hosting panel)")
    verbs = tenant.add_subparsers(dest="tenant_command", required=True, metavar="add|set|remove|show")
    for verb, says in (("add", "create a tenant (refused when it exists)"),
                       ("set", "create or replace a tenant")):
        put = verbs.add_parser(verb, help=says)
        put.add_argument("tenant", metavar="TENANT")
        put.add_argument("source", metavar="FILE|-", help="the tenant's mapping in YAML or JSON; - reads stdin")
        put.add_argument("--json", action="store_true")
        put.set_defaults(run=_put)
    remove = verbs.add_parser("remove", help="drain its users, stop its workers, remove its cgroups and its file")
    remove.add_argument("tenant", metavar="TENANT")
    remove.add_argument("--json", action="store_true")
    remove.set_defaults(run=_remove)
    show = verbs.add_parser("show", help="its configuration and the file that holds it")
    show.add_argument("tenant", metavar="TENANT")
    show.add_argument("--json", action="store_true")
    show.set_defaults(run=_show)
