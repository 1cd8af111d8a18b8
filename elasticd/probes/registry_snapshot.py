"""The registry snapshot, publishing side: what one elasticd says about its apps' load to another that routes to
it as a node (seed 001's ``registry`` probe). Pure: the time and the apps are passed in, bytes come out.

A front whose node is itself an elasticd would otherwise count only what *it* sent there, and every front in
front of that host would believe it emptier than it is. The host publishes instead what its own workers carry,
and the reader takes that as the node's reading (``registry_check`` says when it may).

The body is signed with a shared secret (HMAC-SHA256 over its exact bytes, in ``SIGNATURE_HEADER``): the
snapshot decides admission on the reader, so a forged one must not be believed. Its JSON is canonical (sorted
keys, no spaces, lists in a fixed order) so the same state gives the same bytes: a snapshot that did not change
reads the same, and a test can compare bytes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["MIN_SECRET", "SIGNATURE_HEADER", "VERSION", "canonical", "node_load", "read_secret", "sign", "snapshot"]

SIGNATURE_HEADER: Final = "X-Elastic-Registry-Signature"
VERSION: Final = 1  # the body's format; a reader refuses any other as malformed
MIN_SECRET: Final = 32  # bytes: an HMAC key shorter than its hash's output is guessable sooner than it need be


def canonical(body: Mapping[str, Any]) -> bytes:
    """The body's one byte form: the signature is over these bytes. NaN/Inf raise (``allow_nan=False``): they are
    not JSON, and a reader would refuse them anyway."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def sign(secret: bytes, payload: bytes) -> str:
    """The signature header's value for ``payload``: ``sha256=`` and the HMAC's lower-case hex."""
    return "sha256=" + hmac.new(secret, payload, hashlib.sha256).hexdigest()


def read_secret(data: bytes, where: str) -> bytes:
    """The secret from a secret file's contents ``data`` (``where``: the file, for the message): whitespace at
    its ends stripped (the newline an editor or ``echo`` leaves is not part of it, and publisher and reader
    strip alike). Refused when shorter than ``MIN_SECRET`` bytes: a short secret is a signature anyone can
    guess, and a registry that accepts forged snapshots is worse than none."""
    secret = data.strip()
    if len(secret) < MIN_SECRET:
        raise ValueError(f"{where}: the registry secret is {len(secret)} bytes; at least {MIN_SECRET} are needed")
    return secret


def _text(entry: Mapping[str, Any], key: str) -> str:
    value = entry.get(key)
    return value if isinstance(value, str) else ""


def _sorted(entries: object, key: str, inner: str | None) -> object:
    """A copy of the list ``entries`` sorted by each entry's ``key``, each entry copied (and its ``inner`` list
    sorted in turn); a list that is not all mappings is copied in its order, anything else passed as it is (the
    publisher's own data: not this function's to judge, only never to mutate)."""
    if not isinstance(entries, (list, tuple)):
        return entries
    if not all(isinstance(e, Mapping) for e in entries):
        return list(entries)
    out = []
    for entry in entries:
        copied = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in entry.items()}
        if inner is not None and inner in copied:
            copied[inner] = _sorted(copied[inner], "id", None)
        out.append(copied)
    out.sort(key=lambda e: _text(e, key))
    return out


def snapshot(instance: str, generated_at: float, ttl: float, apps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The body to publish: apps sorted by (tenant, app), each app's groups by name, each group's workers by id
    (a fixed order, so an unchanged state gives the same bytes). ``apps`` is copied, never mutated."""
    ordered = []
    for app in apps:
        copied = dict(app)
        if "groups" in copied:
            copied["groups"] = _sorted(copied["groups"], "group", "workers")
        ordered.append(copied)
    ordered.sort(key=lambda a: (_text(a, "tenant"), _text(a, "app")))
    return {"version": VERSION, "instance": instance, "generated_at": generated_at, "ttl": ttl, "apps": ordered}


def _count(value: object) -> float | None:
    """A finite, non-negative number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a float's range (JSON has no bound on digits)
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _worker_load(worker: object) -> tuple[float, float] | None:
    """(used, limit) of one worker entry, None when it is not healthy or not well formed: used is the most of
    its open requests and what its own capacity reading said (each undercounts what the other sees); limit is
    the reading's when it has one, else the worker's configured one."""
    if not isinstance(worker, Mapping) or worker.get("healthy") is not True:
        return None
    opened = _count(worker.get("open"))
    limit = _count(worker.get("limit"))
    if opened is None or limit is None:
        return None
    capacity = worker.get("capacity")
    if capacity is None:
        return opened, limit
    if not isinstance(capacity, Mapping):
        return None
    used = _count(capacity.get("used"))
    read_limit = _count(capacity.get("limit"))
    if used is None or read_limit is None:
        return None
    return max(opened, used), read_limit


def node_load(snapshot: Mapping[str, Any], tenant: str, app: str) -> tuple[float, float] | None:
    """(used, limit) of ``tenant``/``app`` in a snapshot: the sums over its groups' healthy workers. None when
    the app is not in it or has no healthy, well-formed worker (then the snapshot says nothing of it, rather
    than a zero limit that would read as full). Never raises on what the snapshot holds."""
    apps = snapshot.get("apps")
    if not isinstance(apps, list):
        return None
    entry = next((a for a in apps if isinstance(a, Mapping) and a.get("tenant") == tenant and a.get("app") == app),
                 None)
    if entry is None:
        return None
    groups = entry.get("groups")
    if not isinstance(groups, list):
        return None
    used = limit = 0.0
    counted = False
    for group in groups:
        workers = group.get("workers") if isinstance(group, Mapping) else None
        if not isinstance(workers, list):
            continue
        for worker in workers:
            load = _worker_load(worker)
            if load is not None:
                used += load[0]
                limit += load[1]
                counted = True
    return (used, limit) if counted else None
