"""Pure parsers for the cgroup v2 interface files the sampler reads.

Text in, numbers out; no I/O. Kernels add keys over time (``nice_usec`` and ``nr_bursts`` in cpu.stat,
``oom_group_kill`` in memory.events, ``cost.*`` in io.stat with iocost), so every parser keeps what it can
read and ignores the rest: an unknown key or a malformed line is skipped, never an exception.

They run for every cgroup on every tick (the budget is ~30 µs per cgroup for nine files, reads included),
so each has a fast path for the text the kernel writes and falls back to a line-by-line walk only when
that does not fit. Converting a number is the dominant cost, so only the values asked for are converted.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterable
from typing import NamedTuple

__all__ = [
    "CPU_KEYS",
    "IO_KEYS",
    "Pressure",
    "cpu_stat_ints",
    "flat_keyed_ints",
    "io_totals",
    "parse_flat_keyed",
    "parse_io_stat",
    "parse_pressure",
    "parse_single",
]


class Pressure(NamedTuple):
    """One PSI file (cpu.pressure, memory.pressure, io.pressure). Totals are microseconds of stall since
    the cgroup was made; avg10 is the percentage of the last 10 s. The ``full`` values are None when the
    file has no "full" line (cpu.pressure before Linux 5.13)."""

    some_total_usec: int
    some_avg10: float
    full_total_usec: int | None = None
    full_avg10: float | None = None


# A NamedTuple's own __new__ (Python code, for the defaults) costs 2-3x this, on every tick for every file.
_new_tuple = tuple.__new__


# ----------------------------------------------------------------------------------------- flat keyed


def _pairs(text: str) -> dict[str, str]:
    words = text.split()
    if len(words) % 2 == 0:
        # The kernel's own output: strictly "key value" lines, so the words alternate.
        return dict(zip(words[::2], words[1::2], strict=True))
    pairs: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            pairs[parts[0]] = parts[1]
    return pairs


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def parse_flat_keyed(text: str) -> dict[str, int]:
    """``"usage_usec 123\\nuser_usec 100\\n"`` → ``{"usage_usec": 123, "user_usec": 100}``.

    For the flat keyed files: cpu.stat, memory.events, memory.stat, pids.events. A line that is not
    "key integer" is skipped.
    """
    result: dict[str, int] = {}
    for key, value in _pairs(text).items():
        number = _int(value)
        if number is not None:
            result[key] = number
    return result


def flat_keyed_ints(text: str, keys: Iterable[str]) -> list[int | None]:
    """The values of ``keys`` in a flat keyed file, None where absent or malformed. Converts only those,
    and finds each key as a word followed by its value, so a malformed line elsewhere does no harm."""
    words = text.split()
    values: list[int | None] = []
    for key in keys:
        try:
            values.append(int(words[words.index(key) + 1]))
        except (ValueError, IndexError):  # absent (index), no value after it, or not an integer
            values.append(None)
    return values


CPU_KEYS = ("usage_usec", "user_usec", "system_usec", "nr_periods", "nr_throttled", "throttled_usec")


def cpu_stat_ints(text: str) -> list[int | None]:
    """cpu.stat → the values of CPU_KEYS (None where absent). The kernel has always printed usage, user and
    system first, and nr_periods, nr_throttled, throttled_usec together: found at once when so."""
    w = text.split()
    try:
        if w[0] == "usage_usec" and w[2] == "user_usec" and w[4] == "system_usec":
            head: list[int | None] = [int(w[1]), int(w[3]), int(w[5])]
            if "nr_periods" not in w:
                return [*head, None, None, None]  # no cpu controller: no throttling keys
            i = w.index("nr_periods", 6)
            if w[i + 2] == "nr_throttled" and w[i + 4] == "throttled_usec":
                return [*head, int(w[i + 1]), int(w[i + 3]), int(w[i + 5])]
    except (IndexError, ValueError):
        pass
    return flat_keyed_ints(text, CPU_KEYS)


def parse_single(text: str) -> int | None:
    """A single value file (memory.current, pids.current, memory.max...): its integer; ``max`` and an
    empty or malformed file → None."""
    try:
        return int(text)  # int() strips the trailing newline itself
    except ValueError:
        return None


# ----------------------------------------------------------------------------------------- io.stat

# The io.stat keys summed over devices. dbytes/dios (discards) appeared in Linux 5.2.
IO_KEYS = ("rbytes", "wbytes", "rios", "wios", "dbytes", "dios")
# The kernel prints the keys in this order (blkcg_print_one_stat); iocost may append "cost.*" keys.
_IO_LINE_RE = re.compile(r"^(\S+) rbytes=(\d+) wbytes=(\d+) rios=(\d+) wios=(\d+)(?: dbytes=(\d+) dios=(\d+))?",
                         re.MULTILINE)


def _line_count(text: str) -> int:
    return text.count("\n") + (1 if text and text[-1] != "\n" else 0)


def _io_slow(text: str, skip: Container[str]) -> dict[str, int]:
    totals = {"rbytes": 0, "wbytes": 0, "rios": 0, "wios": 0}
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] in skip:
            continue
        for field in fields[1:]:
            key, sep, value = field.partition("=")
            number = _int(value) if sep and key in IO_KEYS else None
            if number is not None:
                totals[key] = totals.get(key, 0) + number
    return totals


def parse_io_stat(text: str, skip: Container[str] = ()) -> dict[str, int]:
    """io.stat summed over devices: ``{"rbytes", "wbytes", "rios", "wios"[, "dbytes", "dios"]}``. An empty
    file (no I/O yet: the kernel lists only devices with I/O) gives zeros; dbytes/dios only when a
    device reports them.

    ``skip`` holds "MAJ:MIN" devices to leave out: the lower devices of a stack (the disk under an LVM or
    dm-crypt volume), whose lines count the same bytes a second time.
    """
    lines = _IO_LINE_RE.findall(text)
    if len(lines) != _line_count(text):  # a line off the kernel's shape
        return _io_slow(text, skip)
    rbytes = wbytes = rios = wios = dbytes = dios = 0
    discards = False
    for dev, rb, wb, ri, wi, db, di in lines:
        if dev in skip:
            continue
        rbytes += int(rb)
        wbytes += int(wb)
        rios += int(ri)
        wios += int(wi)
        if db:
            discards = True
            dbytes += int(db)
            dios += int(di)
    totals = {"rbytes": rbytes, "wbytes": wbytes, "rios": rios, "wios": wios}
    if discards:
        totals["dbytes"] = dbytes
        totals["dios"] = dios
    return totals


# The sampler's path: only the four sums it keeps, and no dict.
_IO_SUMS_RE = re.compile(r"^(\S+) rbytes=(\d+) wbytes=(\d+) rios=(\d+) wios=(\d+)", re.MULTILINE)


def io_totals(text: str, skip: Container[str] = ()) -> tuple[int, int, int, int]:
    """(rbytes, wbytes, rios, wios) summed over devices: parse_io_stat's values the sampler keeps."""
    lines = _IO_SUMS_RE.findall(text)
    if len(lines) != _line_count(text):  # a line off the kernel's shape
        t = _io_slow(text, skip)
        return t["rbytes"], t["wbytes"], t["rios"], t["wios"]
    rbytes = wbytes = rios = wios = 0
    for dev, rb, wb, ri, wi in lines:
        if dev not in skip:
            rbytes += int(rb)
            wbytes += int(wb)
            rios += int(ri)
            wios += int(wi)
    return rbytes, wbytes, rios, wios


# ----------------------------------------------------------------------------------------- PSI

def _psi_slow(text: str) -> dict[str, tuple[int, float]]:
    found: dict[str, tuple[int, float]] = {}
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] not in ("some", "full"):
            continue
        values = dict(word.partition("=")[::2] for word in words[1:])
        try:
            found[words[0]] = (int(values["total"]), float(values["avg10"]))
        except (KeyError, ValueError):
            continue
    return found


def parse_pressure(text: str) -> Pressure | None:
    """A PSI file → Pressure; None when it has no readable "some" line.

    ``some avg10=0.00 avg60=0.00 avg300=0.00 total=0`` / ``full avg10=0.00 avg60=0.00 avg300=0.00 total=0``
    """
    w = text.split()
    if (len(w) == 10 and w[0] == "some" and w[5] == "full" and w[1][:6] == "avg10=" and w[6][:6] == "avg10="
            and w[4][:6] == "total=" and w[9][:6] == "total="):
        try:
            return _new_tuple(Pressure, (int(w[4][6:]), float(w[1][6:]), int(w[9][6:]), float(w[6][6:])))
        except ValueError:
            pass
    found = _psi_slow(text)
    some = found.get("some")
    if some is None:
        return None
    full = found.get("full")
    if full is None:
        return Pressure(some[0], some[1])
    return Pressure(some[0], some[1], full[0], full[1])
