"""The state one elasticd image hands the next across a re-exec in place (pure: a document in, a document out).

What a restart would lose, and so what is written: the workers (ids, pids and each process's start time — a pid
alone could be a stranger's after a reuse —, sockets, tokens, groups, the digest of the definition each was started
from), the surface (users, their workers, logins, groups, what they consumed), the run-time limit overrides, the
tenants' quota buckets, and each group's next worker number (a new worker must not take a live one's id).

The document carries a format number. A reader of another format refuses the whole document (``StateError``)
and the new image starts as a fresh one would, saying so; a document it can read but that names a worker gone or
a group changed is adopted in part (``adoption``). Never a half-read document served silently: any field that is
missing or of the wrong kind refuses it, naming the field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

__all__ = ["FORMAT", "SavedState", "SavedUser", "SavedWorker", "StateError", "digest", "dump", "load"]

FORMAT: Final = 1


class StateError(ValueError):
    """The document cannot be taken: another format, or malformed (the message names what and where)."""


@dataclass(frozen=True, slots=True)
class SavedWorker:
    id: str
    tenant: str
    app: str
    group: str
    pid: int
    started: int  # the process's start time (/proc/PID/stat's 22nd field, clock ticks since boot): its identity
    socket_path: str
    token: str
    spec: str  # ``digest`` of the definition it was started from
    restarts: int = 0
    served: bool = True


@dataclass(frozen=True, slots=True)
class SavedUser:
    user: str
    worker: str
    group: str
    app: str
    login: str | None
    seen: float
    requests: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class SavedState:
    workers: tuple[SavedWorker, ...] = ()
    users: tuple[SavedUser, ...] = ()
    overrides: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # tenant → resource → value
    buckets: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # tenant → (tokens, at)
    next_ids: Mapping[str, int] = field(default_factory=dict)  # "tenant/app/group" → its next worker number
    written_at: float = 0.0  # the monotonic clock (shared by both images: one boot)
    format: int = FORMAT


def digest(definition: object) -> str:
    """A stable digest of a worker's definition (its spec's repr): equal definitions, equal digests."""
    return hashlib.sha256(repr(definition).encode()).hexdigest()[:32]


def dump(state: SavedState) -> bytes:
    return json.dumps(asdict(state), sort_keys=True, separators=(",", ":")).encode()


_Shape = Mapping[str, type | tuple[type, ...]]
_WORKER: Final[_Shape] = {"id": str, "tenant": str, "app": str, "group": str, "pid": int, "started": int,
                  "socket_path": str, "token": str, "spec": str, "restarts": int, "served": bool}
_USER: Final[_Shape] = {"user": str, "worker": str, "group": str, "app": str, "login": (str, type(None)),
                "seen": (int, float), "requests": int, "seconds": (int, float)}


def load(data: bytes) -> SavedState:
    """The document, or StateError naming why it cannot be taken."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise StateError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise StateError("not a JSON object")
    version = raw.get("format")
    if version != FORMAT:
        raise StateError(f"format {version!r}: this elasticd reads format {FORMAT}")
    workers = tuple(SavedWorker(**_fields(item, _WORKER, f"workers[{i}]"))
                    for i, item in enumerate(_list(raw, "workers")))
    users = tuple(SavedUser(**_fields(item, _USER, f"users[{i}]")) for i, item in enumerate(_list(raw, "users")))
    overrides = {}
    for tenant, values in _map(raw.get("overrides", {}), "overrides").items():
        where = f"overrides.{tenant}"
        overrides[tenant] = {name: _typed(value, str, f"{where}.{name}") for name, value in _map(values, where).items()}
    buckets = {tenant: _pair(value, f"buckets.{tenant}")
               for tenant, value in _map(raw.get("buckets", {}), "buckets").items()}
    next_ids = {key: _typed(value, int, f"next_ids.{key}")
                for key, value in _map(raw.get("next_ids", {}), "next_ids").items()}
    return SavedState(workers, users, overrides, buckets, next_ids,
                      float(_typed(raw.get("written_at", 0.0), (int, float), "written_at")))


def _list(raw: Mapping[str, Any], name: str) -> list[Any]:
    value = raw.get(name, [])
    if not isinstance(value, list):
        raise StateError(f"{name}: not a list")
    return value


def _map(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StateError(f"{where}: not an object")
    return value


def _typed(value: object, kind: type | tuple[type, ...], where: str) -> Any:
    if (isinstance(value, bool) and kind is int) or not isinstance(value, kind):
        raise StateError(f"{where}: {value!r} is not of the right kind")
    return value


def _pair(value: object, where: str) -> tuple[float, float]:
    if not isinstance(value, list) or len(value) != 2:
        raise StateError(f"{where}: not a pair")
    return float(_typed(value[0], (int, float), where)), float(_typed(value[1], (int, float), where))


def _fields(item: object, shape: _Shape, where: str) -> dict[str, Any]:
    fields = _map(item, where)
    unknown = set(fields) - set(shape)
    if unknown:
        raise StateError(f"{where}: unknown field {sorted(unknown)[0]!r}")
    out = {}
    for name, kind in shape.items():
        if name not in fields:
            raise StateError(f"{where}.{name}: missing")
        out[name] = _typed(fields[name], kind, f"{where}.{name}")
    return out
