"""Run-time limit overrides: what ``POST /v1/tenants/{tenant}/limits`` asks for, and what is then in force.

Pure. A request body is validated with the config's own field table (``RESOURCE_FIELDS``), so "50%" or
"512M" mean exactly what they mean in the file and a bad value gets the same message. Overrides live in the
daemon's memory on top of the config: ``effective`` merges them, ``describe`` shows both layers,
``clear_overrides`` takes some or all of them away again (``DELETE``, systemctl revert's idea: back to what the
file says).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from elasticd.config import RESOURCE_FIELDS, ConfigError, ConfigIssue, Resources
from elasticd.config.units import UnitError, format_size

__all__ = ["OVERRIDABLE", "LimitRequest", "clear_overrides", "describe", "effective", "format_limit",
           "parse_clear_request", "parse_limit_request"]

# ADR-0010: cpu, memory, io_weight and io_bandwidth can be overridden at run time.
OVERRIDABLE = ("cpu", "memory", "io_weight", "io_read", "io_write")
_FIELDS = {f.attr: f for f in RESOURCE_FIELDS if f.attr in OVERRIDABLE}
_BODY_KEYS = ("cpu", "memory", "io_weight", "io_bandwidth", "persist")


@dataclass(frozen=True, slots=True)
class LimitRequest:
    values: Mapping[str, Any]  # Resources attribute → parsed value (None: unlimited)
    typed: Mapping[str, Any]  # Resources attribute → the value as the operator typed it ("512M" stays "512M")
    persist: bool


def parse_limit_request(body: Any) -> LimitRequest:
    """Validate a request body; every problem is reported at once as a ConfigError naming the field."""
    issues: list[ConfigIssue] = []
    if not isinstance(body, dict):
        raise ConfigError([ConfigIssue("body", None, "must be a JSON object")])
    for key in body:
        if key not in _BODY_KEYS:
            issues.append(ConfigIssue(str(key), None, f"unknown field (expected any of: {', '.join(_BODY_KEYS)})"))
    raw: dict[str, Any] = {}
    for attr in ("cpu", "memory", "io_weight"):
        if attr in body:
            raw[attr] = body[attr]
    bandwidth = body.get("io_bandwidth")
    if bandwidth is not None:
        if not isinstance(bandwidth, dict):
            issues.append(ConfigIssue("io_bandwidth", None, 'must be an object like {"read": "50M", "write": "20M"}'))
        else:
            for key, value in bandwidth.items():
                if key not in ("read", "write"):
                    issues.append(ConfigIssue(f"io_bandwidth.{key}", None, "unknown field (expected read, write)"))
                else:
                    raw[f"io_{key}"] = value
    persist = body.get("persist", False)
    if not isinstance(persist, bool):
        issues.append(ConfigIssue("persist", None, "must be true or false"))
    values: dict[str, Any] = {}
    for attr, value in raw.items():
        field = _FIELDS[attr]
        if value is None or isinstance(value, (dict, list)):
            issues.append(ConfigIssue(field.name, None, 'needs a value (write "max" for no limit)'))
            continue
        try:
            values[attr] = field.parse(value)
        except (UnitError, ValueError, TypeError) as exc:
            issues.append(ConfigIssue(field.name, None, str(exc)))
    if not raw and not issues:
        issues.append(ConfigIssue("body", None, "names no limit (give any of: cpu, memory, io_weight, io_bandwidth)"))
    if issues:
        raise ConfigError(issues)
    return LimitRequest(values=values, typed=raw, persist=bool(persist))


def effective(resources: Resources, override: Mapping[str, Any]) -> Resources:
    return replace(resources, **override) if override else resources


def format_limit(attr: str, value: Any) -> str | int:
    """A limit as an operator reads it: "150%", "1G", "max", or a plain weight."""
    if attr == "cpu":
        return "max" if value is None else f"{value:g}%"
    if attr in ("io_weight", "pids"):
        return ("default 100" if attr == "io_weight" else "max") if value is None else value
    return format_size(value)


def describe(resources: Resources, override: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per limit: the value in force, where it comes from, and what the config says beneath an override."""
    shown: dict[str, dict[str, Any]] = {}
    for field in RESOURCE_FIELDS:
        configured = format_limit(field.attr, getattr(resources, field.attr))
        if field.attr in override:
            shown[field.name] = {"value": format_limit(field.attr, override[field.attr]), "source": "override",
                                 "config": configured}
        else:
            shown[field.name] = {"value": configured, "source": "config"}
    return shown


def parse_clear_request(text: str | None) -> frozenset[str] | None:
    """The ``limits`` query of ``DELETE /v1/tenants/{tenant}/limits``: absent or empty → None (every override);
    else names of OVERRIDABLE, comma-separated (elasticctl's spelling with "-" too: io-read). ConfigError naming
    each unknown one."""
    if text is None or not text.strip():
        return None
    names, issues = set(), []
    for word in text.split(","):
        name = word.strip().replace("-", "_")
        if name in OVERRIDABLE:
            names.add(name)
        else:
            issues.append(ConfigIssue("limits", None, f'"{word.strip()}" is not a limit an override can set '
                                      f"(expected any of: {', '.join(OVERRIDABLE)})"))
    if issues:
        raise ConfigError(issues)
    return frozenset(names)


def clear_overrides(override: Mapping[str, Any], names: frozenset[str] | None) -> tuple[dict[str, Any], list[str]]:
    """(the overrides that remain, the names cleared, in OVERRIDABLE's order). Naming a limit that has no override
    is no error: it is already what the config says."""
    cleared = [name for name in OVERRIDABLE if name in override and (names is None or name in names)]
    return {k: v for k, v in override.items() if k not in cleared}, cleared
