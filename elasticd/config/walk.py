"""The walk over a YAML document: issues collected with their key path and line (every problem of a file at
once), and the scalar readers each key's value goes through. Pure: no file is read here."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from elasticd.config.model import Address
from elasticd.config.units import UnitError, parse_duration

__all__ = ["CGROUP_MODES", "ConfigError", "ConfigIssue", "Walk", "absolute_path", "address", "duration",
           "duration_or_zero", "fraction", "integer", "join", "kind", "mode", "positive_number", "share", "string"]

CGROUP_MODES = ("auto", "required", "off")


# --------------------------------------------------------------------------------------------- errors


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    path: str
    line: int | None
    message: str
    file: str | None = None  # an included file; None: the file the error is reported for (the main one)

    def __str__(self) -> str:
        if self.path:
            where = f"{self.path} (line {self.line})" if self.line else self.path
        else:
            where = f"line {self.line}" if self.line else "config"
        return f"{self.file}: {where}: {self.message}" if self.file else f"{where}: {self.message}"


class ConfigError(Exception):
    def __init__(self, issues: list[ConfigIssue], source: str = "<string>") -> None:
        self.issues = issues
        self.source = source
        super().__init__("\n".join(str(i) for i in issues))


# --------------------------------------------------------------------------------------------- the walk


class Walk:
    """Collects issues while the model is built, so one pass reports everything wrong with a file."""

    __slots__ = ("file", "issues")

    def __init__(self, file: str | None = None) -> None:
        self.issues: list[ConfigIssue] = []
        self.file = file  # the included file being walked (its issues name it); None: the main file

    def error(self, path: str, line: int | None, message: str) -> None:
        self.issues.append(ConfigIssue(path, line, message, self.file))

    # A node's line: ruamel keeps 0-based positions per key (``lc.key``) and per item (``lc.item``).
    @staticmethod
    def key_line(node: Any, key: Any) -> int | None:
        try:
            return int(node.lc.key(key)[0]) + 1
        except (AttributeError, KeyError, TypeError):
            return None

    @staticmethod
    def item_line(node: Any, index: int) -> int | None:
        try:
            return int(node.lc.item(index)[0]) + 1
        except (AttributeError, KeyError, TypeError, IndexError):
            return None

    @staticmethod
    def node_line(node: Any) -> int | None:
        try:
            return int(node.lc.line) + 1
        except AttributeError:
            return None

    def mapping(self, node: Any, path: str, line: int | None, allowed: tuple[str, ...] | None) -> dict[Any, Any]:
        """The node as a mapping (empty when absent or wrong), unknown keys reported. (A plain dict from the fast
        loader, a CommentedMap, which is one, from the round-trip loader that knows the lines: ``load``.)"""
        if node is None:
            return {}
        if not isinstance(node, dict):
            self.error(path, line, f"must be a mapping, not {kind(node)}")
            return {}
        if allowed is not None:
            for key in node:
                if key not in allowed:
                    self.error(join(path, key), self.key_line(node, key),
                               f"unknown key (expected one of: {', '.join(allowed)})")
        return node

    def value(self, node: dict[Any, Any], key: str, path: str, parse: Any, default: Any) -> Any:
        """Parse ``node[key]`` with ``parse`` (which raises ValueError); absent or null → default."""
        if key not in node or node[key] is None:
            return default
        try:
            return parse(node[key])
        except (UnitError, ValueError, TypeError) as exc:
            self.error(join(path, key), self.key_line(node, key), str(exc))
            return default


def join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def kind(node: Any) -> str:
    if isinstance(node, dict):
        return "a mapping"
    if isinstance(node, list):
        return "a list"
    if isinstance(node, bool):
        return "a boolean"
    if isinstance(node, (int, float)):
        return f"the number {node}"
    return f'"{node}"'


# --------------------------------------------------------------------------------------------- scalars


def integer(minimum: int, maximum: int | None = None, allow_max: bool = False) -> Callable[[Any], int | None]:
    def parse(value: Any) -> int | None:
        if allow_max and value == "max":
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{kind(value)} is not a whole number" + (' or "max"' if allow_max else ""))
        if value < minimum or (maximum is not None and value > maximum):
            upper = f" and {maximum}" if maximum is not None else ""
            raise ValueError(f"{value} is out of range (between {minimum}{upper})" if upper
                             else f"{value} is out of range (at least {minimum})")
        return int(value)
    return parse


def fraction(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{kind(value)} is not a number")
    if not 0 <= value <= 1:
        raise ValueError(f"{value} is not between 0 and 1")
    return float(value)


def share(value: Any) -> float:
    """A share of a limit, in (0, 1]: 0 would hold every scale-up, over 1 none."""
    part = fraction(value)
    if part == 0:
        raise ValueError("0 is not a share of a limit (between 0, excluded, and 1)")
    return part


def percentage(value: Any) -> float:
    """``"10%"`` (or ``"2.5%"``) → 0.1: a share of traffic, 0 % to 100 % (a bare number is a fraction, 0 to 1)."""
    if isinstance(value, str) and value.strip().endswith("%"):
        text = value.strip()[:-1].strip()
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f'"{value}" is not a percentage (write e.g. "10%")') from None
        if not 0 <= number <= 100:
            raise ValueError(f'"{value}" is not between 0% and 100%')
        return number / 100
    return fraction(value)


def positive_number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{kind(value)} is not a number")
    if value <= 0:
        raise ValueError(f"{value} must be more than 0")
    return float(value)


def string(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{kind(value)} is not a string")
    return str(value)


def absolute_path(value: Any) -> str:
    text = string(value)
    if not text.startswith("/"):
        raise ValueError(f'"{text}" is not an absolute path')
    if "\0" in text:
        raise ValueError("a path cannot hold a NUL byte")
    return text


def address(value: Any) -> Address:
    text = str(value).strip()
    match = re.match(r"^\[([0-9a-fA-F:.]+)\]:(\d+)$", text) or re.match(r"^([^:\[\]]+):(\d+)$", text)
    if not match:
        raise ValueError(f'"{text}" is not HOST:PORT (e.g. "127.0.0.1:8080" or "[::1]:8080")')
    port = int(match.group(2))
    if not 0 < port < 65536:
        raise ValueError(f'"{text}" has no valid port (1-65535)')
    return Address(match.group(1), port)


def mode(value: Any) -> str:
    if value not in CGROUP_MODES:
        raise ValueError(f"{kind(value)} is not a mode (expected one of: {', '.join(CGROUP_MODES)})")
    return str(value)


def duration(value: Any) -> float:
    return parse_duration(value)




def duration_or_zero(value: Any) -> float:
    """A duration, or 0 (the number, or "0s"): off, or never (``stop_drain``, a reading's ``max_age``)."""
    if (isinstance(value, int) and not isinstance(value, bool) and value == 0) or value in ("0", "0s", "0ms"):
        return 0.0
    return duration(value)
