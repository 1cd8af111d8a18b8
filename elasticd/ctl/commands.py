"""elasticctl's commands and their parser: each command asks the admin API (client.py) and prints what it said
(render.py); a refusal is raised as ``CommandRefused`` and said once, in ``main``.

Exit codes: 0 ok, 1 refused or failed (the reason on stderr), 2 usage (argparse's own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

from elasticd.accounting.high import SORTS, render_high
from elasticd.config.units import UnitError, parse_duration
from elasticd.monitor.terminal import render_population, render_watch
from elasticd.upgrade.report import DONE as UPGRADE_DONE
from elasticd.upgrade.report import describe as describe_upgrade

from .client import DEFAULT_SOCKET, AdminClient, ApiError, CommandRefused, error_of
from .render import render_limits, render_pool, render_status
from .tenant import add_tenant_parser

__all__ = ["main", "parser"]


async def _status(client: AdminClient, args: argparse.Namespace) -> int:
    data = await client.expect("GET", "/v1/status", "elasticctl")
    print(json.dumps(data, indent=2) if args.json else render_status(data))
    return 0


async def _reload(client: AdminClient, args: argparse.Namespace) -> int:
    code, data = await client.request("POST", "/v1/reload?all=1" if args.all else "/v1/reload")
    if args.json:
        print(json.dumps(data, indent=2))
    if code != 200 or not data.get("ok"):  # (its JSON printed first all the same: the refusal is in it)
        raise CommandRefused("reload refused", error_of(data, code))
    for problem in data.get("problems", []):
        print(f"warning: {problem}", file=sys.stderr)
    if not args.json:
        written = data.get("written", [])
        print(f"reloaded: {len(written)} tenants' cgroup files written" + (f" ({', '.join(written[:5])}"
              f"{f' and {len(written) - 5} more' if len(written) > 5 else ''})" if written else ""))
    return 0



async def _upgrade(client: AdminClient, args: argparse.Namespace) -> int:
    """Ask for the re-exec in place, then wait for the new image's report (the admin socket stays open across the
    exec: a request in flight at that moment fails, and is asked again)."""
    code, data = await client.request("POST", "/v1/upgrade")
    if code != 202:
        if args.json:
            print(json.dumps(data, indent=2))
        raise CommandRefused("upgrade refused", error_of(data, code))
    if not args.json:
        print(data.get("message", "upgrading"), file=sys.stderr)
    deadline = time.monotonic() + args.timeout
    state: Any = None
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        try:
            code, state = await client.request("GET", "/v1/upgrade")
        except ApiError:
            continue  # (the exec's moment)
        if code == 200 and isinstance(state, dict) and not state.get("under_way"):
            break
        state = None
    if state is None:
        raise CommandRefused("upgrade", f"no report from elasticd within {args.timeout:g}s (see its journal)")
    report = state.get("report") or {}
    if args.json:
        print(json.dumps(state, indent=2))
    else:
        print("\n".join(describe_upgrade(report)))
    return 0 if report.get("outcome") == UPGRADE_DONE else 1


async def _limit(client: AdminClient, args: argparse.Namespace) -> int:
    if args.clear is not None:
        return await _clear(client, args)
    body: dict[str, Any] = {}
    for key in ("cpu", "memory", "io_weight"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    bandwidth = {k: v for k, v in (("read", args.io_read), ("write", args.io_write)) if v is not None}
    if bandwidth:
        body["io_bandwidth"] = bandwidth
    if args.persist:
        body["persist"] = True
    data = await client.expect("POST", f"/v1/tenants/{args.tenant}/limits", "limit refused", body)
    print(json.dumps(data, indent=2) if args.json else render_limits(data))
    for problem in data.get("problems", []):
        print(f"warning: {problem}", file=sys.stderr)
    return 0


async def _clear(client: AdminClient, args: argparse.Namespace) -> int:
    query = f"?limits={','.join(args.clear)}" if args.clear else ""
    data = await client.expect("DELETE", f"/v1/tenants/{args.tenant}/limits{query}", "limit --clear refused")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        cleared = data.get("cleared") or []
        print((f"cleared {', '.join(cleared)}: back to the config" if cleared else
               "no override to clear: the limits already are the config's") + "\n" + render_limits(data))
    for problem in data.get("problems", []):
        print(f"warning: {problem}", file=sys.stderr)
    return 0


# elasticctl limit --clear's names (the API's, with "-" as the options spell them)
CLEARABLE = ("cpu", "memory", "io-weight", "io-read", "io-write")


def _limit_parser(sub: Any) -> None:
    limit = sub.add_parser("limit", help="override a tenant's limits now (--persist: also in the config file)")
    limit.add_argument("tenant")
    limit.add_argument("--cpu", help='percent of one CPU, e.g. 50%%, or "max"')
    limit.add_argument("--memory", help='bytes with K/M/G/T, e.g. 1G, or "max"')
    limit.add_argument("--io-weight", dest="io_weight", type=int, metavar="N", help="1-10000")
    limit.add_argument("--io-read", dest="io_read", metavar="RATE", help='bytes per second, e.g. 50M, or "max"')
    limit.add_argument("--io-write", dest="io_write", metavar="RATE", help='bytes per second, e.g. 20M, or "max"')
    limit.add_argument("--persist", action="store_true",
                       help="write the values into the config file (previous kept as .bak.<time>) and reload")
    limit.add_argument("--clear", nargs="*", metavar="LIMIT", choices=CLEARABLE,
                       help="clear the overrides (all, or these: cpu memory io-weight io-read io-write), back to the "
                            "config's values; the file is not touched")
    limit.add_argument("--json", action="store_true")
    limit.set_defaults(run=_limit, check=_check_limit)


def _check_limit(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    values = [k for k in ("cpu", "memory", "io_weight", "io_read", "io_write") if getattr(args, k) is not None]
    if args.clear is not None:
        if values or args.persist:
            p.error("limit: --clear goes back to the config's values: give it no values and no --persist")
        return
    if all(getattr(args, k) is None for k in ("cpu", "memory", "io_weight", "io_read", "io_write")):
        p.error("limit: give at least one of --cpu, --memory, --io-weight, --io-read, --io-write (or --clear)")


async def _high(client: AdminClient, args: argparse.Namespace) -> int:
    query = f"/v1/tenants/usage?interval_ms={args.interval_ms}" + ("&apps=1" if args.apps else "")
    data = await client.expect("GET", query, "high")
    if args.json:
        data["tenants"] = dict(sorted(data.get("tenants", {}).items(), key=lambda item: -(_sort_value(item[1],
                                                                                                      args.sort))))
    print(json.dumps(data, indent=2) if args.json else render_high(data, args.sort, args.apps))
    return 0


def _sort_value(usage: dict[str, Any], sort: str) -> float:
    """The widest consumer first, in --json too (missing values last)."""
    if sort == "cpu":
        value = usage.get("cpu_percent")
    elif sort == "memory":
        value = usage.get("memory_bytes")
    else:
        value = (usage.get("io_read_bytes_per_second") or 0) + (usage.get("io_write_bytes_per_second") or 0)
    return float(value) if value is not None else -1.0


def _high_parser(sub: Any) -> None:
    high = sub.add_parser("high", help="who uses the most CPU, memory or I/O now (two samples, N ms apart)")
    high.add_argument("--sort", choices=SORTS, default="cpu")
    high.add_argument("--interval-ms", dest="interval_ms", type=int, default=1000, metavar="N",
                      help="time between the two samples (default 1000)")
    high.add_argument("--apps", action="store_true", help="break tenants down by app")
    high.add_argument("--json", action="store_true")
    high.set_defaults(run=_high)


def _app_path(args: argparse.Namespace, command: str) -> str | None:
    tenant, _, app = args.target.partition("/")
    if not tenant or not app or "/" in app:
        print(f"{command}: name the app as TENANT/APP", file=sys.stderr)
        return None
    return f"/v1/apps/{tenant}/{app}"


async def _pool(client: AdminClient, args: argparse.Namespace) -> int:
    path = _app_path(args, "pool")
    if path is None:
        return 2
    if args.watch:
        return await _watch(client, path + "/pool", args.interval)
    data = await client.expect("GET", path + "/pool", "pool")
    print(json.dumps(data, indent=2) if args.json else render_pool(data))
    return 0


_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen: what top and systemd-cgtop redraw with


async def _watch(client: AdminClient, path: str, interval: float) -> int:
    """Redraw the pool every ``interval`` until Ctrl-C; an app that is not there (any more) ends it (1), an
    elasticd that does not answer is said on screen, and the view goes on (it may be restarting)."""
    tty = sys.stdout.isatty()
    try:
        while True:
            at = time.strftime("%H:%M:%S")
            try:
                data = await client.expect("GET", path, "pool")  # (CommandRefused: the app went; main says so)
            except ApiError as exc:
                screen = f"{at}: {exc} (trying again every {interval:g}s)\n"
            else:
                screen = render_watch(data, at, interval)
            sys.stdout.write((_CLEAR if tty else "\n") + screen)
            sys.stdout.flush()
            await asyncio.sleep(interval)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 0
    except BrokenPipeError:  # piped into a reader that has had enough (head): done, as `yes | head` is
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (so the exit's flush cannot fail)
        return 0


async def _population(client: AdminClient, args: argparse.Namespace) -> int:
    path = _app_path(args, "population")
    if path is None:
        return 2
    data = await client.expect("GET", path + "/population", "population")
    print(json.dumps(data, indent=2) if args.json else render_population(data))
    return 0


def _interval(text: str) -> float:
    try:
        value = parse_duration(text)
    except (UnitError, ValueError) as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 0.1:
        raise argparse.ArgumentTypeError(f"{text}: at least 100ms")
    return value


async def _drain(client: AdminClient, args: argparse.Namespace) -> int:
    data = await client.expect("POST", f"/v1/workers/{args.worker}/drain", "drain")
    if args.json:
        print(json.dumps(data, indent=2))
    moved = data["moved"]
    if data["empty"]:
        if not args.json:
            print(f"{args.worker}: {len(moved)} user{'s' if len(moved) != 1 else ''} moved off; retired")
        return 0
    for user, why in data["failed"]:
        print(f"drain: {user} could not be moved: {why}", file=sys.stderr)
    if data["left"]:
        print(f"drain: not tried after it: {', '.join(data['left'])}", file=sys.stderr)
    print(f"drain: {args.worker} is kept ({len(moved)} moved before the failure)", file=sys.stderr)
    return 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elasticctl", description="Control a running elasticd.")
    p.add_argument("--socket", default=os.environ.get("ELASTIC_ADMIN_SOCKET", DEFAULT_SOCKET),
                   help=f"admin socket (default $ELASTIC_ADMIN_SOCKET or {DEFAULT_SOCKET})")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    status = sub.add_parser("status", help="what runs: cgroups, tenants, apps, workers")
    status.add_argument("--json", action="store_true", help="the raw JSON of GET /v1/status")
    status.set_defaults(run=_status)
    upgrade = sub.add_parser("upgrade", help="re-execute the installed elasticd in place, keeping workers, users and "
                                             "connections; print what was kept and the accept gap")
    upgrade.add_argument("--json", action="store_true")
    upgrade.add_argument("--timeout", type=float, default=120.0,
                         help="seconds to wait for the new image's report (default 120)")
    upgrade.set_defaults(run=_upgrade)
    reload = sub.add_parser("reload", help="re-read the config file (a refused file changes nothing)")
    reload.add_argument("--all", action="store_true",
                        help="parse every file again and write every tenant's cgroup files (a reload writes only "
                             "the changed tenants')")
    reload.add_argument("--json", action="store_true")
    reload.set_defaults(run=_reload)
    _limit_parser(sub)
    _high_parser(sub)
    pool = sub.add_parser("pool", help="an app's elastic pool: workers, occupancy, the ledger, last decisions")
    pool.add_argument("target", metavar="TENANT/APP")
    shown = pool.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true")
    shown.add_argument("--watch", action="store_true", help="redraw it every --interval, with occupancy bars, "
                                                             "until Ctrl-C")
    pool.add_argument("--interval", type=_interval, default=2.0, metavar="DURATION",
                      help="between two redraws of --watch (default 2s; 500ms, 5s...)")
    pool.set_defaults(run=_pool)
    population = sub.add_parser("population", help="an app's users: worker, consumption, pages, connections, "
                                                   "last seen (every worker asked)")
    population.add_argument("target", metavar="TENANT/APP")
    population.add_argument("--json", action="store_true")
    population.set_defaults(run=_population)
    drain = sub.add_parser("drain", help="take a worker out: no new users, every user moved off (with its state), "
                                         "then retired")
    drain.add_argument("worker", metavar="WORKER_ID", help="tenant.app.group.N, as elasticctl pool shows it")
    drain.add_argument("--json", action="store_true")
    drain.set_defaults(run=_drain)
    add_tenant_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if hasattr(args, "check"):
        args.check(p, args)
    client = AdminClient(args.socket)
    try:
        code: int = asyncio.run(args.run(client, args))
        return code
    except ApiError as exc:
        print(f"elasticctl: {exc}", file=sys.stderr)
        return 1
    except CommandRefused as refused:  # the one place a refusal is said
        print(refused, file=sys.stderr)
        return 1

