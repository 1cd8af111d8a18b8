"""A worker's response head, as the proxy reads it and as its client gets it, and the front's own answers (pure):
see ``http1.py``.

- ``ResponseReader``: the worker's head, a header at a time → the client's head (hop-by-hop and X-Elastic-Login
  stripped, the sticky cookie added) and the framing on both sides;
- ``plain``: the answers the front gives itself (404, 429, 431, 502, 503, 504...).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Final

from elasticd.front.core.bounds import FRAMING, HEAD_FIELDS, HEAD_SIZE, MAX_HEAD_BYTES, MAX_HEAD_FIELDS, AnswerRefused
from elasticd.front.core.fields import (
    CHUNK,
    CONN,
    CONTENT_LENGTH,
    DROP,
    EOF,
    HOP,
    LENGTH,
    LOGIN,
    NAME_KEPT,
    NAMES_KEPT,
    NONE,
    NOT_NAMES,
    RETRY,
    TE,
    UPGRADE,
    connection_tokens,
    drop_named,
)

__all__ = ["ResponseHead", "ResponseReader", "chunk", "plain", "read_response", "status_line"]

_RESPONSE_KINDS: Final[dict[bytes, int]] = {name: DROP for name in HOP}
_RESPONSE_KINDS.update({
    b"connection": CONN, b"transfer-encoding": TE, b"content-length": CONTENT_LENGTH, b"upgrade": UPGRADE,
    b"x-elastic-login": LOGIN, b"retry-after": RETRY,
})


_PASSED: Final = -1  # a field the client gets as it came
# The kinds of the names as workers spell them ("Content-Type", "content-length"...): a worker's are few, and a hit
# saves lowering the name (a new bytes, and a call mypyc makes by name) for every header of every answer. Bounded as
# the request side's table (fields.py): past the bounds each name is lowered and looked up again, never kept.
_KINDS_AS_SENT: Final[dict[bytes, int]] = {}
_SPELLINGS: Final = NAMES_KEPT
_KEPT_NAME: Final = NAME_KEPT


def _kind(name: bytes) -> int:
    kind = _RESPONSE_KINDS.get(name.lower(), _PASSED)
    if len(_KINDS_AS_SENT) < _SPELLINGS and len(name) <= _KEPT_NAME:
        _KINDS_AS_SENT[name] = kind
    return kind


def chunk(data: bytes) -> tuple[bytes, bytes, bytes]:
    return (b"%x\r\n" % len(data), data, b"\r\n")


class ResponseHead:
    """A worker's response head, read: the client's head (as pieces, to which the body is appended before
    the one write) and how both sides frame the body."""

    __slots__ = ("close", "framing", "login", "parts", "reusable", "upstream_eof")

    def __init__(self, parts: list[bytes], framing: int, close: bool, reusable: bool, upstream_eof: bool,
                 login: bytes | None) -> None:
        self.parts = parts
        self.framing = framing  # toward the client: NONE, LENGTH, CHUNK (re-chunked) or EOF (close ends it)
        self.close = close  # close the client's connection after this answer
        self.reusable = reusable  # the worker's connection may carry another request afterwards
        self.upstream_eof = upstream_eof  # the worker's body ends when it closes
        self.login = login  # X-Elastic-Login's value (stripped) or None when absent

    @property
    def head(self) -> bytes:
        return b"".join(self.parts)

    def __repr__(self) -> str:
        return (f"ResponseHead(framing={self.framing}, close={self.close}, reusable={self.reusable}, "
                f"upstream_eof={self.upstream_eof}, login={self.login!r}, head={self.head!r})")


_REASONS: Final = {s.value: s.phrase.encode() for s in HTTPStatus}
_STATUS_LINES: Final[dict[tuple[int, bytes | None], bytes]] = {}
_CACHED_REASON: Final = 64  # bytes: a longer reason phrase is no standard one, and is not kept for the process's life


def status_line(status: int, reason: bytes | None) -> bytes:
    line = _STATUS_LINES.get((status, reason))
    if line is None:
        line = b"HTTP/1.1 %d %s\r\n" % (status, reason or _REASONS.get(status, b"Unknown"))
        # Workers' reason phrases are few; an odd one (or a long one: a worker's to choose) is formatted again.
        if len(_STATUS_LINES) < 512 and (reason is None or len(reason) <= _CACHED_REASON):
            _STATUS_LINES[(status, reason)] = line
    return line


class ResponseReader:
    """Reads response heads one header at a time (``header`` is the parser's ``on_header``); ``finish``
    decides the client's head and the framing. No I/O.

    A worker's head, and the trailer of its chunked body, are bounded (``bounds``): past ``MAX_HEAD_FIELDS`` lines
    or ``MAX_HEAD_BYTES`` of them, ``header`` raises ``AnswerRefused`` (inside the parser, which stops there).
    What the parser buffers before it calls ``header`` (one line, the reason phrase) is the relay's to bound."""

    __slots__ = ("between", "chunked", "count", "last_line", "last_reason", "last_status", "length", "lines",
                 "login", "retry_after", "size", "tokens", "upgrade")

    def __init__(self) -> None:
        # The last status line made: a worker answers the same status most of the time, and comparing two
        # values costs less than hashing a (status, reason) key for the shared cache.
        self.last_status = 0
        self.last_reason: bytes | None = None
        self.last_line = b""
        self.start()

    def start(self) -> None:
        self.between = False  # after finish(), until the caller clears it: trailer fields are dropped (as requests')
        self.count = 0  # header lines read, of the head (or, after finish(), of the trailer)
        self.size = 0  # their bytes (name, value, ": " and CRLF)
        self.lines: list[bytes] = [b""]  # [0]: the status line, known at the end of the head
        self.tokens: list[bytes] | None = None
        self.length: bytes | None = None
        self.chunked = False
        self.login: bytes | None = None
        self.upgrade: bytes | None = None
        self.retry_after: bytes | None = None  # (read by the answer relay before finish(), for a 429)

    def expect_head(self) -> None:
        """Headers again, not the last answer's trailer: its lines are counted from none."""
        self.between = False
        self.count = self.size = 0

    def header(self, name: bytes, value: bytes) -> None:
        self.count += 1
        self.size += len(name) + len(value) + 4
        if self.count > MAX_HEAD_FIELDS or self.size > MAX_HEAD_BYTES:
            raise self._refused()
        if self.between:
            return  # a trailer field: dropped (a login or a header would otherwise reach the next answer)
        kind = _KINDS_AS_SENT.get(name, _PASSED - 1)
        if kind < _PASSED:
            kind = _kind(name)
        if kind == _PASSED:
            self.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == CONTENT_LENGTH:
            self.length = value
            self.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == CONN:
            tokens = self.tokens
            if tokens is None:
                self.tokens = connection_tokens(value)
            else:  # (extended in place: a head of many Connection lines is linear, not quadratic)
                tokens.extend(connection_tokens(value))
        elif kind == TE:
            self.chunked = True
        elif kind == LOGIN:
            self.login = value.strip()
        elif kind == UPGRADE:
            self.upgrade = value
        elif kind == RETRY:
            self.retry_after = value
            self.lines.extend((name, b": ", value, b"\r\n"))

    def _refused(self) -> AnswerRefused:
        """What passing a bound refuses (a trailer's bound is the framing's)."""
        if self.between:
            if self.count > MAX_HEAD_FIELDS:
                return AnswerRefused(FRAMING, f"sent a trailer of more than {MAX_HEAD_FIELDS} lines")
            return AnswerRefused(FRAMING, f"sent a trailer over {MAX_HEAD_BYTES} bytes")
        if self.count > MAX_HEAD_FIELDS:
            return AnswerRefused(HEAD_FIELDS, f"sent an answer head of more than {MAX_HEAD_FIELDS} header lines")
        return AnswerRefused(HEAD_SIZE, f"sent an answer head over {MAX_HEAD_BYTES} bytes")

    def finish(self, status: int, reason: bytes | None, upstream11: bool, head_request: bool, client11: bool,
               client_keep_alive: bool, extra: bytes = b"") -> ResponseHead:
        """``extra``: header lines the front adds (the new user's Set-Cookie). The reader is ready for the next
        head afterwards (and counts the trailer's lines from none). AnswerRefused when the head with its reason
        phrase is over ``MAX_HEAD_BYTES``."""
        if reason is not None and self.size + len(reason) > MAX_HEAD_BYTES:
            raise AnswerRefused(HEAD_SIZE, f"sent an answer head over {MAX_HEAD_BYTES} bytes")
        parts = self.lines
        if status == self.last_status and reason == self.last_reason:
            parts[0] = self.last_line
        else:
            parts[0] = self.last_line = status_line(status, reason)
            self.last_status, self.last_reason = status, reason
        tokens, length, chunked, login, upgrade = self.tokens, self.length, self.chunked, self.login, self.upgrade
        self.lines = [b""]  # start(), inlined: readied for the next head in the same call
        self.tokens = self.length = self.login = self.upgrade = self.retry_after = None
        self.chunked = False
        self.between = True
        self.count = self.size = 0
        upstream_keep_alive = upstream11
        if tokens is not None:
            upstream_keep_alive = (b"close" not in tokens) if upstream11 else (b"keep-alive" in tokens)
            named = set(tokens) - NOT_NAMES
            if named:
                parts = [parts[0], *drop_named(parts[1:], named)]
        if status == 101:
            # The handshake crosses whole: from here on both connections carry the new protocol.
            parts.extend((b"Connection: upgrade\r\nUpgrade: ", upgrade or b"", b"\r\n", extra, b"\r\n"))
            return ResponseHead(parts, EOF, True, False, True, login)
        upstream_eof = False
        if head_request or status in (204, 304) or status < 200:
            framing = NONE  # a Content-Length here describes the body a GET would have had: it stays as said
        elif length is not None and not chunked:
            framing = LENGTH
        else:
            upstream_eof = not chunked
            framing = CHUNK if client11 else EOF
        close = not client_keep_alive or framing == EOF
        if extra:
            parts.append(extra)
        if framing == CHUNK:
            parts.append(b"Transfer-Encoding: chunked\r\n")
        if close:
            parts.append(b"Connection: close\r\n")
        elif not client11:
            parts.append(b"Connection: keep-alive\r\n")
        parts.append(b"\r\n")
        return ResponseHead(parts, framing, close, upstream_keep_alive and not upstream_eof, upstream_eof, login)


def read_response(status: int, reason: bytes | None, headers: list[tuple[bytes, bytes]], upstream11: bool, *,
                  head_request: bool, client11: bool, client_keep_alive: bool,
                  extra: bytes = b"") -> ResponseHead:
    """A whole head at once (for tests and tools)."""
    reader = ResponseReader()
    for name, value in headers:
        reader.header(name, value)
    return reader.finish(status, reason, upstream11, head_request=head_request, client11=client11,
                         client_keep_alive=client_keep_alive, extra=extra)


def plain(status: int, text: str, *, close: bool = False, retry_after: int | None = None,
          head_request: bool = False) -> bytes:
    """An answer of the front's own: short text naming what went wrong."""
    body = (text + "\n").encode()
    parts = [status_line(status, None), b"Content-Type: text/plain; charset=utf-8\r\n",
             b"Content-Length: %d\r\n" % len(body)]
    if retry_after is not None:
        parts.append(b"Retry-After: %d\r\n" % retry_after)
    if close:
        parts.append(b"Connection: close\r\n")
    parts.append(b"\r\n")
    if not head_request:
        parts.append(body)
    return b"".join(parts)
