"""One reading of one cgroup: the interface files' texts → a ``Sample`` (pure).

Every value is Optional: a file that is absent (controller not enabled, a fake tree, PSI disabled) or
unreadable gives None, and the exporters omit it rather than report 0.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .parse import Pressure, cpu_stat_ints, io_totals, parse_pressure, parse_single

__all__ = ["FILES", "MEMORY_EVENTS", "Sample", "sample_from_texts"]

# Read on every tick, in this order (the order of the texts given to sample_from_texts).
# memory.swap.current is the ninth: usage beside the configured swap limit.
FILES = (
    "cpu.stat",
    "memory.current",
    "memory.swap.current",
    "memory.events",
    "pids.current",
    "io.stat",
    "cpu.pressure",
    "memory.pressure",
    "io.pressure",
)

# The memory.events counters exported (label ``event``); newer keys (oom_group_kill) are ignored.
MEMORY_EVENTS = ("low", "high", "max", "oom", "oom_kill")


# Not frozen: a frozen dataclass's __init__ costs ~5x more (object.__setattr__ per field), and one Sample is
# made per cgroup per tick. Treat it as immutable all the same: /metrics and the usage API share them.
@dataclass(slots=True)
class Sample:
    ts: float  # monotonic seconds when it was read
    cpu_usage_usec: int | None = None
    cpu_user_usec: int | None = None
    cpu_system_usec: int | None = None
    cpu_periods: int | None = None  # nr_periods: only with the cpu controller (a cpu.max)
    cpu_throttled_periods: int | None = None  # nr_throttled
    cpu_throttled_usec: int | None = None
    memory_bytes: int | None = None
    swap_bytes: int | None = None
    memory_events: Mapping[str, int] | None = None  # only MEMORY_EVENTS keys
    pids: int | None = None
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None
    io_read_ops: int | None = None
    io_write_ops: int | None = None
    cpu_pressure: Pressure | None = None
    memory_pressure: Pressure | None = None
    io_pressure: Pressure | None = None


_MISSING: tuple[object, ...] = ((None,) * 6, None, None, None, None, (None,) * 4, None, None, None)


def _events(text: str) -> dict[str, int]:
    words = text.split()
    events: dict[str, int] = {}
    for key in MEMORY_EVENTS:
        try:
            events[key] = int(words[words.index(key) + 1])
        except (ValueError, IndexError):
            continue
    return events


Parser = Callable[[str], object]


_PARSERS: dict[frozenset[str], tuple[Parser, ...]] = {}


def _parsers(skip_devices: Container[str]) -> tuple[Parser, ...]:
    """The parsers for these stacked devices, made once per set (a builder per cgroup asks for them)."""
    if isinstance(skip_devices, frozenset):
        made = _PARSERS.get(skip_devices)
        if made is None:
            made = _PARSERS[skip_devices] = _make_parsers(skip_devices)
        return made
    return _make_parsers(skip_devices)


def _make_parsers(skip_devices: Container[str]) -> tuple[Parser, ...]:
    """One parser per file of FILES, in order: a list/tuple for cpu.stat (6) and io.stat (4), else a value."""
    def io(text: str) -> tuple[int, int, int, int]:
        return io_totals(text, skip_devices)
    return (cpu_stat_ints, parse_single, parse_single, _events, parse_single, io, parse_pressure, parse_pressure,
            parse_pressure)


def _sample(ts: float, parsed: Sequence[Any]) -> Sample:
    cpu, mem, swap, events, pids, io, cpu_p, mem_p, io_p = parsed
    # By position, in FILES order: cpu.stat's six fields and io.stat's four are spread (mypy cannot count them).
    return Sample(ts, *cpu, mem, swap, events, pids, *io, cpu_p, mem_p, io_p)  # type: ignore[call-arg]


def sample_from_texts(ts: float, texts: Sequence[str | None], skip_devices: Container[str] = ()) -> Sample:
    """The texts of FILES (None where a file was missing) → a Sample. ``skip_devices``: see parse_io_stat."""
    parsers = _parsers(skip_devices)
    return _sample(ts, [_MISSING[i] if text is None else parsers[i](text) for i, text in enumerate(texts)])


class SampleBuilder:
    """sample_from_texts for one cgroup, tick after tick, parsing only the files whose bytes changed.

    Most files of most cgroups read the same from one tick to the next (an idle app's memory.events,
    pids.current, io.stat, pressure), and comparing bytes costs far less than parsing them. Deterministic:
    the same bytes always give the same values, whatever came before.
    """

    __slots__ = ("_parsed", "_parsers", "_raw")

    def __init__(self, skip_devices: Container[str] = ()) -> None:
        self._parsers = _parsers(skip_devices)
        self._raw: list[bytes | None] = [None] * len(FILES)
        self._parsed: list[object] = list(_MISSING)

    def build(self, ts: float, raw: Sequence[bytes | None]) -> Sample:
        previous = self._raw
        parsed = self._parsed
        if raw == previous:  # an idle group: nothing changed at all (one C-level comparison of lists)
            return _sample(ts, parsed)
        parsers = self._parsers
        for i, data in enumerate(raw):
            if data is None:
                parsed[i] = _MISSING[i]
            elif data != previous[i]:
                parsed[i] = parsers[i](data.decode("ascii", "replace"))
        self._raw = list(raw)  # a copy: a caller may reuse its list
        return _sample(ts, parsed)
