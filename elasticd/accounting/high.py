"""``elasticctl high``: the usage report (GET /v1/tenants/usage) as a table, widest consumer first (pure).

    TENANT     CPU            MEMORY         READ             WRITE            IO PSI
    acme       35.0% / 150%   512.0M / 1G    4.0M/s / 50M/s   1.0M/s / 20M/s   0.12%
      shop     30.0%          400.0M         4.0M/s           1.0M/s           0.10%

Sizes are powers of 1024 with K/M/G/T, as the config writes them; "max" is an unlimited limit; "-" a
figure that could not be measured (a controller off, a group that came or went between the two reads).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["ALIASES", "SORTS", "human_bytes", "render_high"]

SORTS = ("cpu", "memory", "io")
# ADR-0010's commands: each is ``elasticctl high --sort KEY``.
ALIASES = {"elastic-highcpu": "cpu", "elastic-highram": "memory", "elastic-highio": "io"}

_UNITS = ("B", "K", "M", "G", "T", "P")


def human_bytes(value: float, exact: bool = False) -> str:
    """1288490188 → "1.2G"; with ``exact`` (limits, as configured), a whole number drops its ".0": "1G"."""
    if value < 1024:
        return f"{value:.0f}B"
    unit = 0
    while value >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    if exact and value == int(value):
        return f"{int(value)}{_UNITS[unit]}"
    return f"{value:.1f}{_UNITS[unit]}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _psi(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}%"


def _limit_percent(value: float | None) -> str:
    return "max" if value is None else f"{value:g}%"


def _size(value: float | None) -> str:
    return "-" if value is None else human_bytes(value)


def _limit_size(value: float | None) -> str:
    return "max" if value is None else human_bytes(value, exact=True)


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{human_bytes(value)}/s"


def _limit_rate(value: float | None) -> str:
    return "max" if value is None else f"{human_bytes(value, exact=True)}/s"


# (header, usage key, its format, limit key, its format)
_COLUMNS: tuple[tuple[str, str, Callable[[Any], str], str | None, Callable[[Any], str]], ...] = (
    ("CPU", "cpu_percent", _percent, "cpu_limit_percent", _limit_percent),
    ("MEMORY", "memory_bytes", _size, "memory_limit_bytes", _limit_size),
    ("READ", "io_read_bytes_per_second", _rate, "io_read_limit_bytes_per_second", _limit_rate),
    ("WRITE", "io_write_bytes_per_second", _rate, "io_write_limit_bytes_per_second", _limit_rate),
    ("IO PSI", "io_pressure_avg10", _psi, None, str),
)


def _sort_value(usage: Mapping[str, Any], sort: str) -> float | None:
    if sort == "cpu":
        return usage.get("cpu_percent")
    if sort == "memory":
        return usage.get("memory_bytes")
    read, write = usage.get("io_read_bytes_per_second"), usage.get("io_write_bytes_per_second")
    if read is None and write is None:
        return None
    return (read or 0) + (write or 0)


def _ordered(entries: Mapping[str, Mapping[str, Any]], sort: str) -> list[str]:
    """Names, widest consumer first; unmeasured last; ties by name."""
    def key(name: str) -> tuple[bool, float, str]:
        value = _sort_value(entries[name], sort)
        return (value is None, -(value or 0), name)
    return sorted(entries, key=key)


def render_high(usage: Mapping[str, Any], sort: str = "cpu", apps: bool = False) -> str:
    if sort not in SORTS:
        raise ValueError(f"sort: {sort!r} is not one of {', '.join(SORTS)}")
    tenants: Mapping[str, Mapping[str, Any]] = usage.get("tenants", {})
    head = f"usage over {usage.get('interval_ms', '?')} ms, widest {sort} first"
    if usage.get("measured") == "process trees":
        # Said first, and plainly: these figures are not the cgroups' (see process_trees.py for how they differ).
        head = (f"no cgroups to read: {usage.get('why') or 'cgroups are not enforced'}\n"
                f"{usage.get('note') or 'measured instead from the process trees'}\n{head}")
    if not tenants:
        return f"{head}\nno tenants configured"
    # rows of (name, [(usage text, limit text or None) per column])
    rows: list[tuple[str, list[tuple[str, str | None]]]] = []
    for tenant in _ordered(tenants, sort):
        entry = tenants[tenant]
        rows.append((tenant, [(fmt(entry.get(key)), None if lkey is None else lfmt(entry.get(lkey)))
                              for _h, key, fmt, lkey, lfmt in _COLUMNS]))
        if apps:
            app_entries: Mapping[str, Mapping[str, Any]] = entry.get("apps", {})
            for app in _ordered(app_entries, sort):
                rows.append((f"  {app}", [(fmt(app_entries[app].get(key)), None)
                                          for _h, key, fmt, _lk, _lf in _COLUMNS]))
    return f"{head}\n{_table(rows)}"


def _table(rows: list[tuple[str, list[tuple[str, str | None]]]]) -> str:
    # Each figure is right-aligned (digits line up), its limit follows after " / ", left-aligned.
    columns: list[list[str]] = [["TENANT", *(name for name, _ in rows)]]
    for column, (header, *_rest) in enumerate(_COLUMNS):
        pairs = [values[column] for _name, values in rows]
        used = max(len(figure) for figure, _ in pairs)
        limit_width = max((len(limit) for _, limit in pairs if limit is not None), default=0)
        texts = [header]
        for figure, limit in pairs:
            text = figure.rjust(used)
            if limit is not None:
                text += f" / {limit.ljust(limit_width)}"
            texts.append(text)
        columns.append(texts)
    widths = [max(len(text) for text in texts) for texts in columns]
    lines = ["   ".join(texts[i].ljust(w) for texts, w in zip(columns, widths, strict=True)).rstrip()
             for i in range(len(rows) + 1)]
    return "\n".join(lines)
