"""elasticctl: the operator's command line, a client of the admin API on its Unix socket.

Exit codes: 0 ok, 1 refused or failed (the reason on stderr), 2 usage (argparse's own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from elasticd.accounting.high import SORTS, render_high
from elasticd.config.units import UnitError, parse_duration
from elasticd.monitor.terminal import capacity_text, render_nodes, render_population, render_watch

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
        except aiohttp.ClientConnectorError as exc:
            # aiohttp's own text ("Cannot connect to unix socket … ssl:default [Errno 2] …") says more about aiohttp
            # than about elasticd: the OS's reason, and what to do about it.
            reason = exc.os_error.strerror or str(exc.os_error)
            raise ApiError(f"cannot reach elasticd on {self.socket_path}: {reason} ({_hint(exc.os_error)})") from None
        except (aiohttp.ClientConnectionError, FileNotFoundError, PermissionError) as exc:
            raise ApiError(f"cannot reach elasticd on {self.socket_path}: {exc}") from None
        except TimeoutError:
            raise ApiError(f"elasticd on {self.socket_path} did not answer within {self.timeout:g}s") from None


def _hint(error: OSError) -> str:
    if isinstance(error, PermissionError):
        return "the socket is root's, or server.admin_group's: run as root or as a member"
    return "is elasticd running? --socket PATH or $ELASTIC_ADMIN_SOCKET names another socket"


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
        user = tenant.get("user")
        runs_as = f"{user['name']}:{user['group']}" if user else "root (no user:)"
        for aname, app in tenant["apps"].items():
            canary = app.get("canary")
            for gname, group in app["groups"].items():
                # * the default group (new users), ~ the canary with its share, nothing: users finishing there
                label = gname + ("*" if gname == app["default_group"] else
                                 f"~{canary['share']:.0%}" if canary and canary["group"] == gname else "")
                users = str(group.get("sticky_users", "-"))
                if not group["workers"]:
                    rows.append([tname, runs_as, aname, label, users, "-", "-", "none (at zero)", "-", "-"])
                for w in group["workers"]:
                    rows.append([tname, runs_as, aname, label, users, w["id"], str(w["pid"] or "-"), w["state"],
                                 _duration(w["uptime"]), str(w["restarts"])])
    out.append("")
    out.append(table(["TENANT", "USER", "APP", "GROUP", "STICKY USERS", "WORKER", "PID", "STATE", "UPTIME", "RESTARTS"],
                     rows) if rows else "no apps configured")
    out.append("GROUP: * new users go there, ~ the canary and its share of new users, bare: its users finish there")
    out.append("STICKY USERS: the users the front routes to the group by their cookie (elasticctl population "
               "counts every user, newcomers included)")
    limits = render_limit_table(status["tenants"], enforced=bool(cg["enforced"]))
    if limits:
        out.append("")
        out.extend(limits)
    views = [[tname, _isolation(tenant.get("isolation"))] for tname, tenant in status["tenants"].items()]
    if views:
        out.append("")
        out.append(table(["TENANT", "ISOLATION"], views))
    return "\n".join(out)


# The limits table's columns: (header, the limit's name in GET /v1/status's "limits")
_LIMIT_COLUMNS = (("CPU", "cpu"), ("MEMORY", "memory"), ("SWAP", "swap"), ("PIDS", "pids"), ("IO WEIGHT", "io_weight"),
                  ("IO READ", "io_bandwidth.read"), ("IO WRITE", "io_bandwidth.write"))


def render_limit_table(tenants: dict[str, Any], enforced: bool) -> list[str]:
    """Each tenant's limits in force, an override marked *, then a line per override naming the config's value
    beneath it (what ``elasticctl limit TENANT --clear`` goes back to)."""
    rows, overrides = [], []
    for tname, tenant in tenants.items():
        limits = tenant.get("limits") or {}
        row = [tname]
        for _header, name in _LIMIT_COLUMNS:
            limit = limits.get(name)
            if limit is None:
                row.append("-")
                continue
            override = limit.get("source") == "override"
            row.append(f"{limit['value']}{'*' if override else ''}")
            if override:
                overrides.append(f"  {tname} {name}: {limit['value']} (the config says {limit.get('config')})")
        rows.append(row)
    if not rows:
        return []
    out = [table(["LIMITS", *(header for header, _name in _LIMIT_COLUMNS)], rows)]
    if not enforced:
        out.append("(not enforced: cgroups are off here; these are what elasticd would write)")
    if overrides:
        out.append("* an override until elasticd restarts (elasticctl limit TENANT --clear goes back to the config):")
        out.extend(overrides)
    return out


def _isolation(view: dict[str, Any] | None) -> str:
    """One tenant's view in a line: what its workers may write, what else they see, where its /tmp is."""
    if view is None:
        return "none: its workers see the host as elasticd does"
    writes = ", ".join(view["read_write"]) or "-"
    reads = f"; also read-only: {', '.join(view['read_only'])}" if view["read_only"] else ""
    return f"own mount+pid namespace ({view['tool']}); writes {writes}; /tmp {view['tmp']}{reads}"


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


def render_limits(data: dict[str, Any]) -> str:
    rows = []
    for name, limit in data["limits"].items():
        rows.append([name, str(limit["value"]), limit["source"], str(limit.get("config", ""))])
    head = f"tenant {data['tenant']}: limits in force"
    if data.get("persisted"):
        backup = data.get("backup")
        head += f" (persisted; previous file kept as {backup})" if backup else " (the file already held these)"
    return head + "\n" + table(["LIMIT", "VALUE", "SOURCE", "CONFIG BENEATH"], rows)


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
    code, data = await client.request("POST", f"/v1/tenants/{args.tenant}/limits", body)
    if code != 200:
        print(f"limit refused: {data.get('error') or f'HTTP {code}'}", file=sys.stderr)
        return 1
    print(json.dumps(data, indent=2) if args.json else render_limits(data))
    for problem in data.get("problems", []):
        print(f"warning: {problem}", file=sys.stderr)
    return 0


async def _clear(client: AdminClient, args: argparse.Namespace) -> int:
    query = f"?limits={','.join(args.clear)}" if args.clear else ""
    code, data = await client.request("DELETE", f"/v1/tenants/{args.tenant}/limits{query}")
    if code != 200:
        print(f"limit --clear refused: {data.get('error') or f'HTTP {code}'}", file=sys.stderr)
        return 1
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
    code, data = await client.request("GET", query)
    if code != 200:
        print(f"high: {data.get('error') or f'HTTP {code}'}", file=sys.stderr)
        return 1
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


def render_pool(data: dict[str, Any]) -> str:
    out = []
    for name, group in data["groups"].items():
        if group.get("nodes"):
            out.extend(render_nodes(name, group))
            out.append("")
            continue
        t = group["thresholds"]
        book = group["ledger"]
        zero = "" if group["workers"] else (" — at zero: its next request starts one" if group.get("active", True)
                                             else " — at zero: new users go elsewhere")
        out.append(f"{data['tenant']}/{data['app']} group {name}: {len(group['workers'])} workers{zero} "
                   f"(min {t['min_workers']}, max {t['max_workers'] or 'unbounded'}); thresholds reception "
                   f"{t['reception']:g}, admission {t['admission']:g}, margin {t['compaction_margin']:g}")
        out.append(f"ledger: C={book['C']:.2f} O={book['O']:.2f} H={book['H']:.2f} "
                   f"(compacts while H > {book['trigger']:.2f}); CPU wall {group.get('cpu_wall', 1.0):g} core")
        held = group.get("held")
        if held:
            out.append(f"HELD by the tenant's {', '.join(held['resources'])} limit: {held['reason']}")
            out.append("  more workers would not help: raise the tenant's limit (elasticctl limit TENANT ...)")
        rows = []
        for w in group["workers"]:
            role = "reception" if w["reception"] else "draining" if w["draining"] else \
                "spawning" if w["spawning"] else ""
            parts = " ".join(f"{k}={v:.2f}" for k, v in sorted(w["components"].items()))
            rps = f"{w['rates']['rps']:.1f}" if w["rates"] else "-"
            rows.append([w["id"], str(w["pid"] or "-"), w["state"], role, f"{w['occupancy']:.2f}", parts or "-",
                         rps, str(len(w["sticky_users"])), "channel" if w["announced"] else "sensed",
                         capacity_text(w.get("capacity"))])
        out.append(table(["WORKER", "PID", "STATE", "ROLE", "OCC", "COMPONENTS", "RPS", "STICKY USERS", "SENSOR",
                          "CAPACITY"], rows))
        for m in group.get("moves", []):
            out.append(f"moving {m['user']} from {m['from']} to {m['to']}: {m['step']} for {m['seconds']:.1f}s")
        if group["decisions"]:
            out.append("last decisions:")
            for d in group["decisions"][-10:]:
                when = time.strftime("%H:%M:%S", time.localtime(d["at"]))
                out.append(f"  {when} {d['decision']:<10} {d['worker'] or '-':<24} {d['reason']}")
        out.append("")
    return "\n".join(out).rstrip()


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
    code, data = await client.request("GET", path + "/pool")
    if code != 200:
        print(f"pool: {data.get('error') or f'HTTP {code}'}", file=sys.stderr)
        return 1
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
                code, data = await client.request("GET", path)
            except ApiError as exc:
                screen = f"{at}: {exc} (trying again every {interval:g}s)\n"
            else:
                if code != 200:
                    print(f"pool: {data.get('error') or f'HTTP {code}'}", file=sys.stderr)
                    return 1
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
    code, data = await client.request("GET", path + "/population")
    if code != 200:
        print(f"population: {data.get('error') or f'HTTP {code}'}", file=sys.stderr)
        return 1
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
    code, data = await client.request("POST", f"/v1/workers/{args.worker}/drain")
    if code != 200:
        print(f"drain: {data.get('error') or f'HTTP {code}'}", file=sys.stderr)
        return 1
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
    reload = sub.add_parser("reload", help="re-read the config file (a refused file changes nothing)")
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
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if hasattr(args, "check"):
        args.check(p, args)
    client = AdminClient(args.socket)
    try:
        return asyncio.run(args.run(client, args))
    except ApiError as exc:
        print(f"elasticctl: {exc}", file=sys.stderr)
        return 1


# ---------------------------------------------------------------------- the ADR-0010 aliases


def _alias(prog: str, value_help: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--socket", default=os.environ.get("ELASTIC_ADMIN_SOCKET", DEFAULT_SOCKET))
    p.add_argument("--persist", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("tenant")
    if value_help:
        p.add_argument("value", help=value_help)
    return p


def _common(args: argparse.Namespace) -> list[str]:
    return [*(["--persist"] if args.persist else []), *(["--json"] if args.json else [])]


def limitcpu_main(argv: list[str] | None = None) -> int:
    args = _alias("elastic-limitcpu", 'percent of one CPU, e.g. 50%%, or "max"').parse_args(argv)
    return main(["--socket", args.socket, "limit", args.tenant, "--cpu", args.value, *_common(args)])


def limitram_main(argv: list[str] | None = None) -> int:
    args = _alias("elastic-limitram", 'bytes with K/M/G/T, e.g. 1G, or "max"').parse_args(argv)
    return main(["--socket", args.socket, "limit", args.tenant, "--memory", args.value, *_common(args)])


def limitio_main(argv: list[str] | None = None) -> int:
    p = _alias("elastic-limitio", None)
    p.add_argument("--read", metavar="RATE")
    p.add_argument("--write", metavar="RATE")
    p.add_argument("--weight", type=int, metavar="N")
    args = p.parse_args(argv)
    extra = [*(["--io-read", args.read] if args.read else []), *(["--io-write", args.write] if args.write else []),
             *(["--io-weight", str(args.weight)] if args.weight is not None else [])]
    if not extra:
        p.error("give at least one of --read, --write, --weight")
    return main(["--socket", args.socket, "limit", args.tenant, *extra, *_common(args)])


def _high_alias(sort: str) -> Callable[[list[str] | None], int]:
    def run(argv: list[str] | None = None) -> int:
        p = argparse.ArgumentParser(prog=f"elastic-high{dict(cpu='cpu', memory='ram', io='io')[sort]}")
        p.add_argument("--socket", default=os.environ.get("ELASTIC_ADMIN_SOCKET", DEFAULT_SOCKET))
        p.add_argument("--interval-ms", dest="interval_ms", default="1000", metavar="N")
        p.add_argument("--apps", action="store_true")
        p.add_argument("--json", action="store_true")
        args = p.parse_args(argv)
        extra = [*(["--apps"] if args.apps else []), *(["--json"] if args.json else [])]
        return main(["--socket", args.socket, "high", "--sort", sort, "--interval-ms", args.interval_ms, *extra])
    return run


highcpu_main = _high_alias("cpu")
highram_main = _high_alias("memory")
highio_main = _high_alias("io")


if __name__ == "__main__":
    sys.exit(main())
