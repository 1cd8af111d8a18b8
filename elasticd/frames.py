"""The channel's framing, both sides (elasticd's ``pool/channel_server.py`` and the worker library's
``worker/channel.py``): newline-delimited JSON objects, one per line; a message that carries bytes (a live
move's package) says how many with ``"bytes": N``, and those N raw bytes follow its line. Pure: bytes in,
messages out.

JSON lines stay readable from any language and refusable line by line; a package goes raw rather than base64
in a line, so a line keeps its small bound (``MAX_LINE``) and a package has its own (``MAX_PAYLOAD``).
"""

from __future__ import annotations

import json
from typing import Any, Final

__all__ = ["MAX_LINE", "MAX_PAYLOAD", "FrameError", "FrameReader", "encode", "payload_size"]

MAX_LINE: Final = 65536
MAX_PAYLOAD: Final = 64 << 20  # a user's package: a move of more than this is refused


class FrameError(ValueError):
    """The stream cannot be framed any more (a line or a payload over its bound, a line that is no object)."""


def encode(message: dict[str, Any], payload: bytes | None = None) -> bytes:
    if payload is not None:
        message = {**message, "bytes": len(payload)}
    return json.dumps(message, separators=(",", ":")).encode() + b"\n" + (payload or b"")


def payload_size(message: dict[str, Any]) -> int | None:
    """How many raw bytes follow ``message``'s line (None: none); FrameError when the count is not one."""
    size = message.get("bytes")
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_PAYLOAD:
        raise FrameError(f'"bytes" must be a count of bytes from 0 to {MAX_PAYLOAD}, not {size!r}')
    return size


class FrameReader:
    """Feed it what the socket gave; it returns the whole messages so far, each with its payload (or None)."""

    __slots__ = ("_buffer", "_waiting")

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._waiting: tuple[dict[str, Any], int] | None = None  # a message whose payload has not all come

    def feed(self, data: bytes) -> list[tuple[dict[str, Any], bytes | None]]:
        buffer = self._buffer
        buffer += data
        out: list[tuple[dict[str, Any], bytes | None]] = []
        while True:
            if self._waiting is not None:
                waiting, wanted = self._waiting
                if len(buffer) < wanted:
                    return out
                payload = bytes(buffer[:wanted])
                del buffer[:wanted]
                self._waiting = None
                out.append((waiting, payload))
                continue
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > MAX_LINE:
                    raise FrameError(f"a line longer than {MAX_LINE} bytes")
                return out
            line = bytes(buffer[:end])
            del buffer[:end + 1]
            if not line.strip():
                continue
            try:
                message = json.loads(line)
            except (UnicodeDecodeError, ValueError) as exc:
                raise FrameError(f"not JSON: {exc}") from None
            if not isinstance(message, dict):
                raise FrameError("a message must be a JSON object")
            size = payload_size(message)
            if size is None:
                out.append((message, None))
            else:
                self._waiting = (message, size)
