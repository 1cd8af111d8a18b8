"""The units an operator types: CPU percentages, byte sizes, durations.

Pure parsers shared by the config loader and (later) the run-time limits API, so a value means the same
wherever it is typed. Each raises ``UnitError`` with a message that quotes the value and says what was
expected; the caller adds the key path and line.
"""

from __future__ import annotations

import re

__all__ = ["UNLIMITED", "UnitError", "parse_cpu", "parse_duration", "parse_size"]

# ``None`` in the model means "no limit"; the cgroup layer writes it as ``max``.
UNLIMITED = None


class UnitError(ValueError):
    pass


# Powers of 1024, as systemd reads MemoryMax= and friends.
_SIZE_FACTORS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)$")
_CPU_RE = re.compile(r"^(\d+(?:\.\d+)?)%$")
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)$")
_DURATION_FACTORS = {"ms": 0.001, "s": 1.0, "m": 60.0}

# cpu.max refuses a quota under 1000 µs per 100 ms period.
_CPU_MIN_PERCENT = 1.0


def _text(value: object) -> str:
    if isinstance(value, bool):
        raise UnitError(f"{value!r} is a boolean")
    return str(value).strip()


def parse_cpu(value: object) -> float | None:
    """``"150%"`` → 150.0 (percent of one CPU); ``"max"`` → None (unlimited)."""
    text = _text(value)
    if text == "max":
        return UNLIMITED
    match = _CPU_RE.match(text)
    if not match:
        raise UnitError(f'"{text}" is not a percentage (write e.g. "50%", "150%" or "max")')
    percent = float(match.group(1))
    if percent < _CPU_MIN_PERCENT:
        raise UnitError(f'"{text}" is below 1% (the kernel\'s smallest CPU quota)')
    return percent


def parse_size(value: object, *, allow_max: bool = True, allow_zero: bool = True) -> int | None:
    """``"1G"`` → 1073741824; bare integers are bytes; ``"max"`` → None (unlimited)."""
    text = _text(value)
    if text == "max":
        if not allow_max:
            raise UnitError('"max" is not allowed here')
        return UNLIMITED
    match = _SIZE_RE.match(text)
    if not match:
        raise UnitError(f'"{text}" is not a size (write bytes, or a number with K, M, G or T, or "max")')
    number = float(match.group(1)) * _SIZE_FACTORS[match.group(2)]
    if number != int(number):
        raise UnitError(f'"{text}" is not a whole number of bytes')
    if number == 0 and not allow_zero:
        raise UnitError(f'"{text}" must be more than 0')
    return int(number)


def parse_duration(value: object) -> float:
    """``"500ms"`` → 0.5, ``"5s"`` → 5.0, ``"30m"`` → 1800.0 (seconds)."""
    text = _text(value)
    match = _DURATION_RE.match(text)
    if not match:
        raise UnitError(f'"{text}" is not a duration (write e.g. "500ms", "5s" or "30m")')
    seconds = float(match.group(1)) * _DURATION_FACTORS[match.group(2)]
    if seconds <= 0:
        raise UnitError(f'"{text}" must be longer than 0')
    return seconds


def format_size(n: int | None) -> str:
    """The inverse for display: 1073741824 → "1G"; None → "max"."""
    if n is None:
        return "max"
    for suffix in ("T", "G", "M", "K"):
        factor = _SIZE_FACTORS[suffix]
        if n >= factor and n % factor == 0:
            return f"{n // factor}{suffix}"
    return str(n)
