"""A chunked request body read by the front itself (pure, no I/O), where the parser would refuse what RFC 9112
allows.

Why the front reads chunk framing at all: PyPI's httptools (llhttp) refuses whitespace after a chunk extension's
``;`` (``5; a=b``: "Invalid character in chunk extensions"), which RFC 9112 §7.1.1 allows (``BWS ";" BWS``, kept
for the clients that sent it before the grammar tightened), and llhttp has no leniency flag for it (its
``lenient_spaces_after_chunk_size`` covers ``5 ;a=b`` only). Debian's httptools (http-parser) reads it, so the
front takes a chunked body over on llhttp alone (``request_reading.RequestReading``): once the parser has read a
request head that says ``chunked``, the bytes after it come here, and the next request's bytes go to a fresh parser.
Chunked request bodies are rare (a browser sends none; an upload tool or a proxy may), so the cost falls on them:
the parser's C loop stays the common path.

What this accepts is RFC 9112 §7.1 exactly, and no more: a chunk-size of hex digits (at most 16: past them the size
cannot be a body anyone sends, and an overflow is how smuggling starts), extensions as the grammar has them (each
``BWS ; BWS token [BWS = BWS (token | quoted-string)]``, read and dropped: the front forwards the data re-chunked,
as it did with the parser), CRLF after every line and after each chunk's data (a bare LF, as llhttp's strict mode,
is refused: a front and the worker behind it must agree where a body ends), and a trailer section of field lines
whose fields are dropped (RFC 9110 §6.5.1 lets a proxy discard them; as the parser's path did). Bounds: a chunk-size
line of ``MAX_SIZE_LINE`` bytes with its extensions, and a trailer section of the head's own limit.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_SIZE_LINE", "ChunkedBody"]

MAX_SIZE_LINE: Final = 4096  # bytes of a chunk-size line with its extensions and CRLF (nginx's own buffer: 1 KiB)
_MAX_SIZE_DIGITS: Final = 16

_TOKEN: Final = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_QUOTED: Final = rb'"(?:[\t \x21\x23-\x5b\x5d-\x7e\x80-\xff]|\\[\t \x21-\x7e\x80-\xff])*"'
_EXTENSION: Final = rb"[ \t]*;[ \t]*" + _TOKEN + rb"(?:[ \t]*=[ \t]*(?:" + _TOKEN + rb"|" + _QUOTED + rb"))?"
_SIZE_LINE: Final = re.compile(rb"([0-9A-Fa-f]{1,%d})(?:%s)*" % (_MAX_SIZE_DIGITS, _EXTENSION))
_TRAILER_FIELD: Final = re.compile(_TOKEN + rb":[\t \x21-\x7e\x80-\xff]*")
_HEX_DIGITS: Final = b"0123456789ABCDEFabcdef"

# Where the reading is (the states of RFC 9112 §7.1's grammar, one at a time).
SIZE: Final = 0  # in a chunk-size line
DATA: Final = 1  # in a chunk's data (``left`` bytes to go)
DATA_END: Final = 2  # the CRLF after a chunk's data
TRAILER: Final = 3  # in the trailer section, after the last chunk
DONE: Final = 4


class ChunkedBody:
    """One chunked body, fed as it comes: ``feed`` hands back the data it carried and says where it ended."""

    __slots__ = ("error", "left", "line", "max_trailer", "state", "trailer")

    def __init__(self, max_trailer: int) -> None:
        self.max_trailer = max_trailer
        self.state = SIZE
        self.left = 0  # DATA: the chunk's bytes still to come; DATA_END: the bytes of its CRLF seen
        self.line = b""  # a line not whole yet (SIZE, TRAILER)
        self.trailer = 0  # the trailer section's bytes so far
        self.error = ""  # why the body is refused (then the state stays where it broke)

    def feed(self, data: bytes, out: list[bytes]) -> int:
        """Reads ``data``: the data of its chunks appended to ``out``. Returns how many bytes of ``data`` the body
        took: all of them while it goes on, fewer once it ended (``state`` DONE: the rest is the next request's),
        or -1 when it is refused (``error`` says why)."""
        at, end = 0, len(data)
        while at < end:
            state = self.state
            if state == DATA:
                take = min(self.left, end - at)
                out.append(data[at:at + take])
                at += take
                self.left -= take
                if not self.left:
                    self.state = DATA_END
            elif state == DATA_END:
                if not self.left and data.startswith(b"\r\n", at):  # (the common case: both bytes in one read)
                    at += 2
                    self.state = SIZE
                    continue
                expected = b"\r\n"[self.left]
                if data[at] != expected:
                    return self._refuse("a chunk's data is not followed by CRLF (its size is wrong, or a line "
                                        "ends in a bare LF)")
                at += 1
                self.left += 1
                if self.left == 2:
                    self.state, self.left = SIZE, 0
            else:  # SIZE or TRAILER (DONE is returned as it is reached: no read goes on past it)
                at = self._line(data, at)
                if at < 0:
                    return -1
                if self.state == DONE:
                    return at
        return at

    def _line(self, data: bytes, at: int) -> int:
        """A chunk-size or trailer line from ``at``: read when whole (returns where it ended), kept while not
        (returns ``len(data)``), or refused (-1)."""
        bound = MAX_SIZE_LINE if self.state == SIZE else self.max_trailer - self.trailer
        newline = data.find(b"\n", at, at + bound - len(self.line) + 1)
        if newline < 0:
            if len(self.line) + len(data) - at > bound:
                return self._refuse(f"a chunk-size line over {MAX_SIZE_LINE} bytes" if self.state == SIZE
                                    else f"a chunked body's trailer section over {self.max_trailer} bytes")
            self.line += data[at:]
            return len(data)
        line = self.line + data[at:newline + 1] if self.line else data[at:newline + 1]
        self.line = b""
        if not line.endswith(b"\r\n"):
            return self._refuse("a line of a chunked body ends in a bare LF (RFC 9112 §7.1: CRLF)")
        line = line[:-2]
        if self.state == TRAILER:
            self.trailer += len(line) + 2
            if not line:
                self.state = DONE
            elif _TRAILER_FIELD.fullmatch(line) is None:
                return self._refuse("a malformed field line in a chunked body's trailer section")
            return newline + 1
        if line and len(line) <= _MAX_SIZE_DIGITS and not line.translate(None, _HEX_DIGITS):
            size = int(line, 16)  # (no extension: the common line, without the regular expression)
        else:
            size_line = _SIZE_LINE.fullmatch(line)
            if size_line is None:
                return self._refuse("a malformed chunk-size line (RFC 9112 §7.1: hex digits, then extensions)")
            size = int(size_line.group(1), 16)
        if size:
            self.state, self.left = DATA, size
        else:
            self.state = TRAILER
        return newline + 1

    def _refuse(self, why: str) -> int:
        self.error = why
        return -1
