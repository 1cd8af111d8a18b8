"""The registry snapshot, reading side: whether a fetched snapshot may be believed. Pure: the answer and the
time are passed in.

The checks run in a fixed order and the first that fails names the refusal (the probe's state on the monitor):

1. ``unreachable``: the answer is not 2xx;
2. ``bad signature``: the header is missing or is not the HMAC of the body's bytes as received. Checked before
   the body is parsed: a forged body is never parsed at all, and a body that is both forged and malformed is a
   forgery, not the publisher's bug;
3. ``malformed``: not a UTF-8 JSON object of ``version`` 1 with a finite ``generated_at`` and a positive ``ttl``;
4. ``from the future``: generated more than ``max_skew`` ahead of the reader's clock (the two hosts' clocks
   disagree, and a reading from the future would be believed for too long);
5. ``stale``: its ttl has run out (seed 001: report nothing rather than something old);
6. ``replayed``: older than the last snapshot accepted from this publisher (one captured earlier and sent
   again). The same ``generated_at`` is accepted: a publisher that had nothing new serves the same snapshot.
"""

from __future__ import annotations

import hmac
import json
import math
from dataclasses import dataclass
from typing import Any, Final

from elasticd.probes.registry_snapshot import VERSION, sign

__all__ = ["BAD_SIGNATURE", "FUTURE", "MALFORMED", "REPLAYED", "STALE", "UNREACHABLE", "Accepted", "Refused",
           "check_snapshot"]

UNREACHABLE: Final = "unreachable"
BAD_SIGNATURE: Final = "bad signature"
MALFORMED: Final = "malformed"
FUTURE: Final = "from the future"
STALE: Final = "stale"
REPLAYED: Final = "replayed"


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
    parsed = _parse(body)
    if isinstance(parsed, Refused):
        return parsed
    snapshot, generated_at, ttl = parsed
    if generated_at > now + max_skew:
        return Refused(FUTURE, f"generated {generated_at - now:.1f}s in the future, max skew {max_skew:g}s")
    if generated_at + ttl <= now:
        return Refused(STALE, f"generated {now - generated_at:.1f}s ago, ttl {ttl:g}s")
    if last_accepted is not None and generated_at < last_accepted:
        return Refused(REPLAYED, f"generated {last_accepted - generated_at:.1f}s before the last snapshot accepted")
    return Accepted(snapshot, generated_at, generated_at + ttl)
