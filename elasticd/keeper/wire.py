"""What elasticd and its keeper say to each other (pure: messages to bytes and back, each checked field by field).

A ``SOCK_SEQPACKET`` Unix socket: one message a datagram (no framing to get wrong), in order, each a JSON object,
descriptors attached to the message they belong to (``SCM_RIGHTS``). The socket is root's alone (0600 in a 0700
directory): no tenant reaches it; still, every message is checked as if one could, and one that is not what it
must be ends the connection (``WireError`` names what was wrong).

elasticd → keeper:
- ``{"op": "hello"}``: the keeper answers one ``child`` per row of its table (with the held output descriptor
  attached, when there is one), then ``{"op": "ready", "pid", "base"}``.
- ``{"op": "spawn", "seq", "argv", "env", "cwd", "label", "hold"}`` with stdin, stdout and stderr attached, and,
  with ``hold``, the read end of the output pipe to keep: ``{"op": "spawned", "seq", "pid", "started"}`` or
  ``{"op": "refused", "seq", "error"}``.
- ``{"op": "forget", "pid"}``: an ended child's status was read.
- ``{"op": "stop"}``: elasticd stops for good (its workers stopped): the keeper kills what is left and exits.

keeper → elasticd: ``{"op": "exited", "pid", "code"}`` as each child ends, besides the answers above.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["MAX_MESSAGE", "Spawn", "WireError", "decode", "encode", "parse_spawn"]

MAX_MESSAGE: Final = 256 * 1024  # a worker's argv and environment are the configuration's: far less
SPAWN_FDS: Final = 3  # stdin, stdout, stderr; a fourth with ``hold``


class WireError(ValueError):
    pass


def encode(message: Mapping[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    if len(data) > MAX_MESSAGE:
        raise WireError(f"a {message.get('op')} message of {len(data)} bytes is over {MAX_MESSAGE}")
    return data


def decode(data: bytes) -> dict[str, Any]:
    try:
        message = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise WireError("not an object with an op")
    return message


@dataclass(frozen=True, slots=True)
class Spawn:
    seq: int
    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    label: str
    hold: bool


def _field(message: Mapping[str, Any], name: str, kind: type) -> Any:
    value = message.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise WireError(f"{message.get('op')}: {name} is not a {kind.__name__}")
    return value


def parse_spawn(message: Mapping[str, Any], fds: int) -> Spawn:
    argv = _field(message, "argv", list)
    env = _field(message, "env", dict)
    if not argv or not all(isinstance(arg, str) and "\0" not in arg for arg in argv):
        raise WireError("spawn: argv is not a non-empty list of strings")
    if not all(isinstance(k, str) and isinstance(v, str) and "\0" not in k + v and "=" not in k and k
               for k, v in env.items()):
        raise WireError("spawn: env is not a mapping of names to strings")
    hold = _field(message, "hold", bool)
    if fds != SPAWN_FDS + hold:
        raise WireError(f"spawn: {fds} descriptors attached, not {SPAWN_FDS + hold}")
    return Spawn(_field(message, "seq", int), tuple(argv), dict(env), _field(message, "cwd", str),
                 _field(message, "label", str), hold)
