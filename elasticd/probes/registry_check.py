"""The registry snapshot, reading side: whether a fetched snapshot may be believed. Pure: the answer and the
time are passed in.

The checks run in a fixed order and the first that fails names the refusal (the probe's state on the monitor):

1. ``unreachable``: the answer is not 2xx;
2. ``bad signature``: the header is missing or is not the HMAC of the body's bytes as received. Checked before
   the body is parsed: a forged body is never parsed at all, and a body that is both forged and malformed is a
   forgery, not the publisher's bug;
3. ``too big``: over ``MAX_SNAPSHOT_BYTES``, or holding more than ``MAX_SNAPSHOT_VALUES`` JSON values (counted
   on the bytes, before anything is parsed: a signed body is still another host's, and parsing costs the reader);
4. ``malformed``: not a UTF-8 JSON object of ``version`` 1 with a finite ``generated_at`` and a positive ``ttl``;
5. ``too big``: more than ``MAX_APPS`` apps, ``MAX_GROUPS`` groups in an app or ``MAX_WORKERS`` workers in a
   group (more than any host runs: such a snapshot is refused whole, not read in part);
6. ``from the future``: generated more than ``max_skew`` ahead of the reader's clock (the two hosts' clocks
   disagree, and a reading from the future would be believed for too long);
7. ``stale``: its ttl has run out (seed 001: report nothing rather than something old);
8. ``replayed``: older than the last snapshot accepted from this publisher (one captured earlier and sent
   again). The same ``generated_at`` is accepted: a publisher that had nothing new serves the same snapshot.

The probe's read itself is bounded before any of this (``probe.Probe.fetch``: 3 s, 4 MiB, never decompressed).
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from elasticd.probes.registry_snapshot import VERSION, sign

__all__ = ["BAD_SIGNATURE", "FUTURE", "MALFORMED", "MAX_APPS", "MAX_GROUPS", "MAX_SNAPSHOT_BYTES",
           "MAX_SNAPSHOT_VALUES", "MAX_WORKERS", "REPLAYED", "STALE", "TOO_BIG", "UNREACHABLE", "Accepted", "Refused",
           "check_snapshot", "values_at_most"]

UNREACHABLE: Final = "unreachable"
BAD_SIGNATURE: Final = "bad signature"
TOO_BIG: Final = "too big"  # (the probe's own state for a read over its bound too)
MALFORMED: Final = "malformed"
FUTURE: Final = "from the future"
STALE: Final = "stale"
REPLAYED: Final = "replayed"

# A snapshot's bytes: the probe's read bound (probe.MAX_BODY). A worker's entry is about 230 bytes, so this is
# some 18,000 workers: more than one host runs.
MAX_SNAPSHOT_BYTES: Final = 4 << 20
# JSON values in it, counted on the bytes before parsing (``values_at_most``): a worker's entry is about a dozen,
# so this is again some 20,000 workers; what it refuses is a body of tiny values (``[0,0,0,...]``: 2 bytes each,
# two million in 4 MiB), each a Python object once parsed.
MAX_SNAPSHOT_VALUES: Final = 1 << 18
# Entries, once parsed: more than a host runs (a group's max_workers is at most 1000; a rollover briefly lists the
# old workers beside the new).
MAX_APPS: Final = 16384
MAX_GROUPS: Final = 256  # in one app
MAX_WORKERS: Final = 4096  # in one group


@dataclass(frozen=True, slots=True)
class Accepted:
    """A snapshot to believe until ``expires_at`` (its ``generated_at`` plus its ``ttl``, in the publisher's
    clock, which ``max_skew`` bounds)."""

    snapshot: dict[str, Any]
    generated_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a snapshot is not believed: ``state`` one of the constants above, ``detail`` a sentence for a human."""

    state: str
    detail: str


def _finite(value: object) -> float | None:
    """A finite number (a bool is not one), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range (JSON has no bound on digits)
        return None
    return number if math.isfinite(number) else None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python's json reads them unless told not to


def _parse(body: bytes) -> tuple[dict[str, Any], float, float] | Refused:
    """(the object, generated_at, ttl), or why it is malformed."""
    try:
        parsed = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        kind = "not UTF-8" if isinstance(error, UnicodeDecodeError) else "not JSON"
        return Refused(MALFORMED, f"the body is {kind}")
    if not isinstance(parsed, dict):
        return Refused(MALFORMED, f"the body is a JSON {type(parsed).__name__}, not an object")
    version = parsed.get("version")
    if isinstance(version, bool) or version != VERSION:
        return Refused(MALFORMED, f"version {version!r}, expected {VERSION}")
    generated_at = _finite(parsed.get("generated_at"))
    if generated_at is None:
        what = "missing" if "generated_at" not in parsed else f"{parsed['generated_at']!r}, not a finite number"
        return Refused(MALFORMED, f"generated_at {what}")
    ttl = _finite(parsed.get("ttl"))
    if ttl is None or ttl <= 0:
        what = "missing" if "ttl" not in parsed else f"{parsed['ttl']!r}, not a positive number"
        return Refused(MALFORMED, f"ttl {what}")
    return parsed, generated_at, ttl


def values_at_most(body: bytes) -> int:
    """An upper bound on the JSON values in ``body``, without parsing it: every element of an array and member of
    an object but the first of each is preceded by a comma, so the values are at most the commas, the brackets and
    braces (each a container that may hold a first one), and the root. Those inside strings only count too many."""
    return body.count(b",") + body.count(b"[") + body.count(b"{") + 1


def _entries_refusal(snapshot: Mapping[str, Any]) -> Refused | None:
    """Why a parsed snapshot lists more than a host runs, None when it does not (its shape is node_load's to read:
    what is not a list here is left to it)."""
    apps = snapshot.get("apps")
    if not isinstance(apps, list):
        return None
    if len(apps) > MAX_APPS:
        return Refused(TOO_BIG, f"{len(apps)} apps, at most {MAX_APPS} are read")
    for app in apps:
        groups = app.get("groups") if isinstance(app, Mapping) else None
        if not isinstance(groups, list):
            continue
        if len(groups) > MAX_GROUPS:
            return Refused(TOO_BIG, f"an app of {len(groups)} groups, at most {MAX_GROUPS} are read")
        for group in groups:
            workers = group.get("workers") if isinstance(group, Mapping) else None
            if isinstance(workers, list) and len(workers) > MAX_WORKERS:
                return Refused(TOO_BIG, f"a group of {len(workers)} workers, at most {MAX_WORKERS} are read")
    return None


def check_snapshot(status: int, body: bytes, signature: str | None, secret: bytes, now: float,
                   last_accepted: float | None, max_skew: float = 5.0) -> Accepted | Refused:
    """Accept or refuse one fetched snapshot: ``status`` and ``body`` as received, ``signature`` the
    ``SIGNATURE_HEADER`` value (None: absent), ``now`` the reader's wall clock, ``last_accepted`` the
    ``generated_at`` of the last snapshot accepted from the same publisher (None: none yet)."""
    if not 200 <= status < 300:
        return Refused(UNREACHABLE, f"answered {status}")
    if signature is None:
        return Refused(BAD_SIGNATURE, "no signature header")
    expected = sign(secret, body).encode("ascii")
    # compare_digest on bytes: on str it raises for non-ASCII, and a header is whatever the peer sent
    if not hmac.compare_digest(signature.encode("utf-8", "surrogateescape"), expected):
        return Refused(BAD_SIGNATURE, "the signature does not match the body")
    if len(body) > MAX_SNAPSHOT_BYTES:
        return Refused(TOO_BIG, f"{len(body)} bytes, at most {MAX_SNAPSHOT_BYTES} are read")
    values = values_at_most(body)
    if values > MAX_SNAPSHOT_VALUES:
        return Refused(TOO_BIG, f"up to {values} JSON values, at most {MAX_SNAPSHOT_VALUES} are parsed")
    parsed = _parse(body)
    if isinstance(parsed, Refused):
        return parsed
    snapshot, generated_at, ttl = parsed
    crowded = _entries_refusal(snapshot)
    if crowded is not None:
        return crowded
    if generated_at > now + max_skew:
        return Refused(FUTURE, f"generated {generated_at - now:.1f}s in the future, max skew {max_skew:g}s")
    if generated_at + ttl <= now:
        return Refused(STALE, f"generated {now - generated_at:.1f}s ago, ttl {ttl:g}s")
    if last_accepted is not None and generated_at < last_accepted:
        return Refused(REPLAYED, f"generated {last_accepted - generated_at:.1f}s before the last snapshot accepted")
    return Accepted(snapshot, generated_at, generated_at + ttl)
