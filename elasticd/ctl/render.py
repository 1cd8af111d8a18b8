"""elasticctl's tables: status (workers, limits, views), a limits reply, the pool (pure: JSON in, text out).
``elasticctl high``'s table is accounting/high.py's; the population's and the watch screen are monitor/terminal.py's.
"""

from __future__ import annotations

import time
from typing import Any

from elasticd.monitor.terminal import capacity_text, queue_text, render_nodes

__all__ = ["render_limit_table", "render_limits", "render_pool", "render_status", "table"]


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
    began = status.get("began") or {}
    if began.get("how") in ("crash", "upgrade"):
        not_adopted = began.get("not_adopted") or []
        out.append(f"began: after {'a crash' if began['how'] == 'crash' else 'an upgrade in place'} at {began['at']}: "
                   f"{began.get('adopted', 0)} workers adopted, {len(not_adopted)} not")
    descriptors = status.get("descriptors") or {}
    if descriptors.get("low"):
        out.append(f"descriptors: LOW: {descriptors['warning']}")
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
        out.append("(not enforced here, as the cgroups line above says: these are the values elasticd would write)")
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


def render_limits(data: dict[str, Any]) -> str:
    rows = []
    for name, limit in data["limits"].items():
        rows.append([name, str(limit["value"]), limit["source"], str(limit.get("config", ""))])
    head = f"tenant {data['tenant']}: limits in force"
    if data.get("persisted"):
        backup = data.get("backup")
        head += f" (persisted; previous file kept as {backup})" if backup else " (the file already held these)"
    return head + "\n" + table(["LIMIT", "VALUE", "SOURCE", "CONFIG BENEATH"], rows)



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
        queue = group.get("queue")
        if queue is not None:
            out.append(queue_text(queue))
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

