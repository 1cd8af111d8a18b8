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
from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any, Final

__all__ = ["FORMAT", "READS", "SavedHandover", "SavedRequest", "SavedState", "SavedTunnel", "SavedUnsent", "SavedUser",
           "SavedWorker", "StateError", "digest", "dump", "load"]

# The format this image writes, and those it reads. Format 2 added ``requests`` and ``unsent`` (requests awaiting their
# answer, and requests not yet sent to a worker, carried over); a format-1 document has none, so it reads as it is.
# An image that reads only format 1 would drop format 2's requests unseen: it refuses the document (its preflight
# says so), and the package falls back to a restart.
FORMAT: Final = 2
READS: Final = (1, 2)


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
    sandboxed: bool = False  # its command runs in a sandbox (a stop signals the command inside)
    listed: bool = True  # in its group's list (False: it was being retired: the next image retires it too)
    output: int | None = None  # the read end of its output pipe, kept open across the exec (None: journald's)


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
class SavedTunnel:
    """A WebSocket tunnel in progress: its two connections' descriptors, kept open across the exec, and whose."""

    client: int  # the client's connection
    upstream: int  # the worker's connection
    worker: str
    user: str | None


@dataclass(frozen=True, slots=True)
class SavedRequest:
    """A request sent whole to its worker and waiting for the first byte of its answer: its two connections'
    descriptors (the answer stays in the kernel's buffer for the next image to read) and what the next image needs
    to relay that answer as the old one would have (the request's method and version, whether the client keeps its
    connection, the sticky cookie to set) and to account for it (whose, where, since when)."""

    client: int  # the client's connection
    upstream: int  # the worker's connection
    worker: str
    user: str | None
    tenant: str
    app: str
    group: str
    host: str | None  # the request's Host (latin-1), which names its route (None: it had none)
    method: str
    url: str
    http11: bool
    keep_alive: bool  # the client keeps its connection after the answer (as its head said)
    has_body: bool
    cookie_line: str  # the Set-Cookie line for a newcomer's first answer (latin-1), "" when none
    began: float  # when it was forwarded (the monotonic clock, shared by both images)


@dataclass(frozen=True, slots=True)
class SavedUnsent:
    """A request read whole and not yet sent to a worker (in its group's queue, waiting for a worker that starts, or
    for one of its worker's connections): its client's connection, and the request as the client could have sent it
    (``front.handover.request_again``), which the next image reads as if it came now and routes afresh."""

    client: int
    data: str  # the request's bytes, base64 (a body may be any bytes; JSON would write most of them 6 characters long)


@dataclass(frozen=True, slots=True)
class SavedHandover:
    """How the step went on the old image's side, for the report the new image gives (``elasticctl upgrade``)."""

    generation: int  # how many re-execs this process has been through before this one
    version: str  # the old image's elasticd version
    began: float  # when the upgrade was asked for (the monotonic clock)
    stopped_accepting: float  # when the old image stopped accepting (the accept gap begins)
    waited: float  # seconds the old image waited for requests in flight
    cut: int  # requests still in flight past the grace: their connections closed
    closed: int  # client connections that could not be carried (busy, closing, or a tunnel that would not settle)


@dataclass(frozen=True, slots=True)
class SavedState:
    workers: tuple[SavedWorker, ...] = ()
    users: tuple[SavedUser, ...] = ()
    # tenant → resource → its parsed value (limits/overrides.py: a number of bytes, a percentage, None for "max")
    overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    buckets: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # tenant → (tokens, at)
    next_ids: Mapping[str, int] = field(default_factory=dict)  # "tenant/app/group" → its next worker number
    written_at: float = 0.0  # the monotonic clock (shared by both images: one boot)
    # Descriptors kept open across the exec: the listening sockets by name ("front", "metrics", "admin", "agent",
    # "channel:<tenant>"), each channel socket file's inode (a tenant may replace the file in its own directory),
    # the idle kept-alive client connections, the WebSocket tunnels, and the requests awaiting their answer.
    listeners: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    channel_inodes: Mapping[str, int] = field(default_factory=dict)
    connections: tuple[int, ...] = ()
    tunnels: tuple[SavedTunnel, ...] = ()
    requests: tuple[SavedRequest, ...] = ()
    unsent: tuple[SavedUnsent, ...] = ()
    handover: SavedHandover | None = None
    cgroup_base: str | None = None  # the cgroup base the old image claimed (it lives in <base>/server by now)
    # The descriptor of the memfd that keeps this state in systemd's store for a crash (elasticd/crash), kept open
    # across the exec: the next image goes on writing it (None: none; an image before it had none).
    state_store: int | None = None
    format: int = FORMAT


def digest(definition: object) -> str:
    """A stable digest of a worker's definition (a dataclass: its fields as canonical JSON): equal definitions,
    equal digests, in any process (no repr of a set, whose order changes with the process's hash seed)."""
    value = asdict(definition) if is_dataclass(definition) and not isinstance(definition, type) else definition
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=_canonical)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _canonical(value: object) -> object:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


def dump(state: SavedState) -> bytes:
    return json.dumps(asdict(state), sort_keys=True, separators=(",", ":")).encode()


_Shape = Mapping[str, type | tuple[type, ...]]
_WORKER: Final[_Shape] = {"id": str, "tenant": str, "app": str, "group": str, "pid": int, "started": int,
                  "socket_path": str, "token": str, "spec": str, "restarts": int, "served": bool,
                  "sandboxed": bool, "listed": bool, "output": (int, type(None))}
_TUNNEL: Final[_Shape] = {"client": int, "upstream": int, "worker": str, "user": (str, type(None))}
_REQUEST: Final[_Shape] = {"client": int, "upstream": int, "worker": str, "user": (str, type(None)), "tenant": str,
                           "app": str, "group": str,
                           "host": (str, type(None)), "method": str, "url": str, "http11": bool, "keep_alive": bool,
                           "has_body": bool, "cookie_line": str, "began": (int, float)}
_UNSENT: Final[_Shape] = {"client": int, "data": str}
_HANDOVER: Final[_Shape] = {"generation": int, "version": str, "began": (int, float), "stopped_accepting": (int, float),
                            "waited": (int, float), "cut": int, "closed": int}
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
    if version not in READS or isinstance(version, bool):
        raise StateError(f"format {version!r}: this elasticd reads formats {', '.join(map(str, READS))}")
    workers = tuple(SavedWorker(**_fields(item, _WORKER, f"workers[{i}]"))
                    for i, item in enumerate(_list(raw, "workers")))
    users = tuple(SavedUser(**_fields(item, _USER, f"users[{i}]")) for i, item in enumerate(_list(raw, "users")))
    overrides = {}
    for tenant, values in _map(raw.get("overrides", {}), "overrides").items():
        where = f"overrides.{tenant}"
        overrides[tenant] = {name: _typed(value, (int, float, str, type(None)), f"{where}.{name}")
                             for name, value in _map(values, where).items()}
    buckets = {tenant: _pair(value, f"buckets.{tenant}")
               for tenant, value in _map(raw.get("buckets", {}), "buckets").items()}
    next_ids = {key: _typed(value, int, f"next_ids.{key}")
                for key, value in _map(raw.get("next_ids", {}), "next_ids").items()}
    listeners = {name: tuple(_typed(fd, int, f"listeners.{name}[{i}]")
                             for i, fd in enumerate(_seq(fds, f"listeners.{name}")))
                 for name, fds in _map(raw.get("listeners", {}), "listeners").items()}
    inodes = {tenant: _typed(value, int, f"channel_inodes.{tenant}")
              for tenant, value in _map(raw.get("channel_inodes", {}), "channel_inodes").items()}
    connections = tuple(_typed(fd, int, f"connections[{i}]") for i, fd in enumerate(_list(raw, "connections")))
    tunnels = tuple(SavedTunnel(**_fields(item, _TUNNEL, f"tunnels[{i}]"))
                    for i, item in enumerate(_list(raw, "tunnels")))
    requests = tuple(SavedRequest(**_fields(item, _REQUEST, f"requests[{i}]"))
                     for i, item in enumerate(_list(raw, "requests")))
    unsent = tuple(SavedUnsent(**_fields(item, _UNSENT, f"unsent[{i}]")) for i, item in enumerate(_list(raw, "unsent")))
    handover = raw.get("handover")
    return SavedState(workers=workers, users=users, overrides=overrides, buckets=buckets, next_ids=next_ids,
                      written_at=float(_typed(raw.get("written_at", 0.0), (int, float), "written_at")),
                      listeners=listeners, channel_inodes=inodes, connections=connections, tunnels=tunnels,
                      requests=requests, unsent=unsent,
                      handover=SavedHandover(**_fields(handover, _HANDOVER, "handover")) if handover is not None
                      else None,
                      cgroup_base=_typed(raw.get("cgroup_base"), (str, type(None)), "cgroup_base"),
                      state_store=_typed(raw.get("state_store"), (int, type(None)), "state_store"), format=version)


def _seq(value: object, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise StateError(f"{where}: not a list")
    return value


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
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
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
