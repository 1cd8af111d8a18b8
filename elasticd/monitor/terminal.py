"""The terminal views (pure: data in, text out): ``elasticctl pool TENANT/APP --watch``, redrawn like
``systemd-cgtop``, with an occupancy bar per worker, its components and its recent history as a sparkline;
and ``elasticctl population``'s table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["bar", "capacity_text", "queue_text", "render_nodes", "render_population", "render_watch", "sparkline"]

_FULL, _EMPTY = "█", "·"
_TICKS = "▁▂▃▄▅▆▇█"


def bar(value: float, width: int = 20) -> str:
    """``value`` in [0, 1] as a bar of ``width`` cells (clipped: an occupancy over 1 fills it)."""
    filled = round(max(0.0, min(value, 1.0)) * width)
    return _FULL * filled + _EMPTY * (width - filled)


def sparkline(values: Sequence[float], width: int = 30) -> str:
    """The last ``width`` values, each as one of eight heights (0 → the lowest, 1 or more → the highest)."""
    return "".join(_TICKS[min(int(max(v, 0.0) * len(_TICKS)), len(_TICKS) - 1)] for v in values[-width:])


# A probe's states as the API spells them (probes/probe.py): the two that are no news to print.
_QUIET_PROBE_STATES = frozenset({"ok", "new"})


def capacity_text(capacity: dict[str, Any] | None) -> str:
    """A worker's or node's capacity (``GET …/pool``'s ``capacity``): its tightest fresh reading and its age,
    FULL while it refuses, or why there is none; "-" without a capacity block."""
    if not capacity:
        return "-"
    readings = capacity.get("readings") or []
    if not readings:
        state = capacity.get("state")
        why = f" ({state})" if state and state not in _QUIET_PROBE_STATES else ""
        return f"{capacity['probe']}: no reading{why}"
    r = max(readings, key=lambda r: (r.get("retry_after") is not None, r["used"] / r["limit"] if r["limit"] else 1))
    text = f"{r['used']:g}/{r['limit']:g} {r['source']} {r['age']:.1f}s ago"
    if capacity.get("full"):
        text += f" FULL (retry {capacity.get('retry_after')}s)"
    return text


def queue_text(queue: dict[str, Any]) -> str:
    """A group's queue in the front (``GET …/pool``'s ``queue``): waiting now of its max, its timeout, how many
    waited, and the 503s it answered by reason."""
    refused = ", ".join(f"{count} {reason}" for reason, count in sorted(queue["refused"].items())) or "none"
    return (f"queue: {queue['depth']} waiting (max {queue['max']}, timeout {queue['timeout']:g}s); "
            f"{queue['waited']} waited so far; refused 503: {refused}")


def render_nodes(name: str, group: dict[str, Any]) -> list[str]:
    """A nodes: group: HTTP upstreams routed, sticky and admitted like workers, never spawned."""
    rows = [[n["id"], n["address"], "routable" if n["routable"] else "unreachable", str(n["open"]),
             str(n["sticky_users"]), capacity_text(n.get("capacity"))] for n in group["workers"]]
    return [f"group {name}: {len(rows)} node{'s' if len(rows) != 1 else ''} (not started by elasticd)",
            *_table(["NODE", "ADDRESS", "STATE", "OPEN", "STICKY USERS", "CAPACITY"], rows)]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [header, *rows]]


def _role(worker: dict[str, Any]) -> str:
    return "reception" if worker["reception"] else "draining" if worker["draining"] else \
        "spawning" if worker["spawning"] else ""


def render_watch(data: dict[str, Any], at: str, interval: float, bar_width: int = 20) -> str:
    """One screen of the pool of ``data`` (``GET /v1/apps/…/pool``'s document), stamped ``at``."""
    out = [f"{data['tenant']}/{data['app']}   {at}   every {interval:g}s   Ctrl-C quits", ""]
    for name, group in data["groups"].items():
        if group.get("nodes"):
            out.extend("  " + line if i else line for i, line in enumerate(render_nodes(name, group)))
            out.append("")
            continue
        book, t = group["ledger"], group["thresholds"]
        out.append(f"group {name}: {len(group['workers'])} workers (min {t['min_workers']}, max "
                   f"{t['max_workers'] or 'unbounded'})   C={book['C']:.2f} O={book['O']:.2f} H={book['H']:.2f} "
                   f"(compacts while H > {book['trigger']:.2f})")
        if group.get("queue") is not None:
            out.append("  " + queue_text(group["queue"]))
        if group.get("held"):
            out.append(f"  HELD by the tenant's {', '.join(group['held']['resources'])} limit: "
                       f"{group['held']['reason']}")
        rows = []
        for w in group["workers"]:
            components = " ".join(f"{k} {bar(v, 5)} {v:4.0%}" for k, v in sorted(w["components"].items()))
            rps = f"{w['rates']['rps']:.1f}" if w["rates"] else "-"
            rows.append([w["id"], w["state"], _role(w), f"{bar(w['occupancy'], bar_width)} {w['occupancy']:4.0%}",
                         components or "-", sparkline(w["history"]), rps, str(len(w["sticky_users"])),
                         capacity_text(w.get("capacity"))])
        out.extend("  " + line for line in _table(
            ["WORKER", "STATE", "ROLE", "OCCUPANCY", "COMPONENTS", "HISTORY", "RPS", "STICKY USERS", "CAPACITY"], rows))
        for m in group.get("moves", []):
            out.append(f"  moving {m['user']} from {m['from']} to {m['to']}: {m['step']} for {m['seconds']:.1f}s")
        for d in group["decisions"][-5:]:
            out.append(f"  {d['decision']:<12} {d['worker'] or '-':<24} {d['reason']}")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _seconds(value: float) -> str:
    if value < 60:
        return f"{value:.1f}s"
    if value < 3600:
        return f"{int(value // 60)}m{int(value % 60):02d}s"
    return f"{int(value // 3600)}h{int(value % 3600 // 60):02d}m"


def render_population(data: dict[str, Any]) -> str:
    """``elasticctl population``: one line per user, then the workers that did not answer."""
    users = [r for r in data["rows"] if "error" not in r]
    errors = [r for r in data["rows"] if "error" in r]
    rows = [[r["user"], r["login"] or "-", r["worker"], str(r["requests"]), f"{r['seconds']:.3f}",
             f"{r['recent_requests']}/{r['recent_seconds']:.3f}s", "-" if r["pages"] is None else str(r["pages"]),
             "-" if r["connections"] is None else str(r["connections"]), _seconds(r["idle"]) + " ago"]
            for r in users]
    out = [f"{data['tenant']}/{data['app']}: population {data['population']} ({data['sticky_users']} sticky, "
           f"routed by their cookie; {data['register_only_users']} only in a worker's register: newcomers not back "
           "with their cookie yet)"
           + (f", {len(errors)} worker{'s' if len(errors) != 1 else ''} not answering" if errors else "")]
    if rows:
        out.extend(_table(["USER", "LOGIN", "WORKER", "REQUESTS", "SECONDS", "LAST 30S", "PAGES", "CONNS",
                           "LAST SEEN"], rows))
    out.extend(f"{r['worker']} ({r['group']}): {r['error']}" for r in errors)
    return "\n".join(out)
