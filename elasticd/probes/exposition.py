"""A Prometheus text-exposition reader: the few numbers a ``prometheus`` capacity probe needs. Pure: text in.

An inference server (vLLM, SGLang, TGI) says how busy it is in its ``/metrics``: requests running and waiting,
one series per label set (a model, an engine). The probe needs only their sums, so this reads only the lines of
the names asked for and never raises: a scrape is another program's output, and a line this cannot read is one
sample fewer, not a blind probe (seed 001: a probe that cannot read anything reports nothing, and admission falls
back to the open-request count).

What a sample line is: ``name{labels} value [timestamp]`` or ``name value [timestamp]``. Label values are
quoted and may hold spaces, commas, braces and ``\\"`` escapes, so the braces are scanned quote-aware rather
than split. ``#`` lines (HELP, TYPE, comments, OpenMetrics' ``# EOF``) are skipped; so are values that are not
finite (``NaN``, ``±Inf``): a sum with one of them in it says nothing, and a name whose every sample is one is
reported absent, like a name that is not there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Sequence
from typing import Final

__all__ = ["DEFAULT_RUNNING", "DEFAULT_WAITING", "metric_sums", "used_of"]

# The engines' names for the same two numbers, the alternatives in the order they are tried (seed 001's
# defaults; a capacity block's ``running``/``waiting`` replace them).
DEFAULT_RUNNING: Final = ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size")
DEFAULT_WAITING: Final = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size")

_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A number as the exposition writes one (Go's ParseFloat, less what Python's float() takes and it does not:
# digit underscores). The words (NaN, Inf) go through float() too, and are dropped as not finite.
_NUMBER: Final = re.compile(r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)", re.IGNORECASE)


def _number(token: str) -> float | None:
    if _NUMBER.fullmatch(token) is None:
        return None
    return float(token)


def _skip_labels(line: str, start: int) -> int:
    """Where the label set opened at ``line[start] == "{"`` ends (the index after its ``}``), -1 when it is not
    one: ``name="value"`` pairs, comma-separated (a trailing comma allowed), values quoted with backslash
    escapes. Scanned rather than split: a value may hold ``}``, ``,``, ``=`` and spaces."""
    i = start + 1
    end = len(line)
    while True:
        while i < end and line[i] in " \t":
            i += 1
        if i < end and line[i] == "}":
            return i + 1
        label = _LABEL.match(line, i)
        if label is None:
            return -1
        i = label.end()
        while i < end and line[i] in " \t":
            i += 1
        if i >= end or line[i] != "=":
            return -1
        i += 1
        while i < end and line[i] in " \t":
            i += 1
        if i >= end or line[i] != '"':
            return -1
        i += 1
        while i < end and line[i] != '"':
            i += 2 if line[i] == "\\" else 1  # an escape: the next character is the value's, whatever it is
        if i >= end:
            return -1  # the quote never closed
        i += 1
        while i < end and line[i] in " \t":
            i += 1
        if i < end and line[i] == ",":
            i += 1
        elif i >= end or line[i] != "}":
            return -1


def _sample(line: str, names: Collection[str]) -> tuple[str, float] | None:
    """(name, value) of a sample line of one of ``names`` with a finite value; None for anything else."""
    found = _NAME.match(line)
    if found is None:
        return None
    name = found.group()
    if name not in names:  # (most of a scrape: read no further than its name)
        return None
    i = found.end()
    rest = line[i:].lstrip(" \t")
    if rest.startswith("{"):
        after = _skip_labels(rest, 0)
        if after < 0:
            return None
        rest = rest[after:]
    elif len(rest) == len(line) - i:
        return None  # neither labels nor a space after the name: "foo-1", "foo@x 1"
    tokens = rest.split()
    if not tokens:
        return None
    value = _number(tokens[0])
    if value is None:
        return None
    tail = tokens[1:]
    if tail and tail[0] != "#":  # a timestamp (ignored), then perhaps an OpenMetrics exemplar ("# {...} v")
        if _number(tail[0]) is None:
            return None
        tail = tail[1:]
    if tail and tail[0] != "#":
        return None
    if not math.isfinite(value):
        return None
    return name, value


def metric_sums(text: str, names: Collection[str]) -> dict[str, float]:
    """For each of ``names`` with a finite sample in ``text``: the sum of its samples across every label set.
    A name only of non-finite samples, or not there, is absent. Never raises on what the text holds."""
    wanted = names if isinstance(names, (set, frozenset, dict)) else frozenset(names)
    sums: dict[str, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        sample = _sample(line, wanted)
        if sample is not None:
            name, value = sample
            sums[name] = sums.get(name, 0.0) + value
    return sums


def used_of(text: str, running: Sequence[str], waiting: Sequence[str]) -> float | None:
    """Running plus waiting requests: the sum of the first of ``running`` the text has, plus the first of
    ``waiting`` it has (each list is the engines' alternatives for one number). A text with only one of the
    two counts what it has (a waiting request is load as much as a running one); None when it has neither,
    so the probe reports nothing rather than a zero it did not read."""
    sums = metric_sums(text, frozenset((*running, *waiting)))
    ran = next((sums[name] for name in running if name in sums), None)
    waited = next((sums[name] for name in waiting if name in sums), None)
    if ran is None and waited is None:
        return None
    return (ran or 0.0) + (waited or 0.0)
