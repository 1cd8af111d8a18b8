"""The HTTP/1.1 rules of the proxy, as pure functions over parsed heads: no sockets, no clock (h11-style).

httptools (a C parser) finds the message boundaries and hands over (name, value) pairs; these functions
decide what crosses the proxy and how each body is framed, and build the bytes to send:

- ``read_request``: the client's head → what the worker gets (end-to-end headers, Host kept, the
  X-Forwarded-* trio, X-Elastic-User-Id set by us only) and the facts the front routes on;
- ``upstream_head``: those facts → the request head bytes for the worker (always HTTP/1.1, kept alive);
- ``read_response``: the worker's head → the client's head (hop-by-hop and X-Elastic-Login stripped, the
  sticky cookie added) and the framing on both sides;
- ``plain``: the answers the front gives itself (404, 429, 431, 502, 503, 504...).

Hop-by-hop (RFC 9110 §7.6.1): Connection, the headers it names, Keep-Alive, Proxy-*, TE, Trailer(s),
Transfer-Encoding and Upgrade describe one connection and never cross — except the Upgrade handshake of a
WebSocket, relayed both ways. Bodies are relayed as they come: Content-Length kept when there is one,
otherwise re-chunked for an HTTP/1.1 client or delimited by closing the connection for HTTP/1.0.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Final

from elasticd.front.core.bounds import FRAMING, HEAD_FIELDS, HEAD_SIZE, MAX_HEAD_BYTES, MAX_HEAD_FIELDS, AnswerRefused

__all__ = ["CHUNK", "EOF", "LENGTH", "NONE", "RequestHead", "RequestReader", "ResponseHead", "ResponseReader",
           "chunk", "head_refusal", "is_http11", "oversize_status", "plain", "read_request", "read_response",
           "status_line", "upstream_head"]

# Framing of a body (how its end is known).
NONE: Final = 0
LENGTH: Final = 1
CHUNK: Final = 2
EOF: Final = 3

_HOP: Final = (b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
               b"te", b"trailer", b"trailers", b"transfer-encoding", b"upgrade")
_HOST: Final = 1
_COOKIE: Final = 2
_CONN: Final = 3
_XFF: Final = 4
_XFP: Final = 5
_XFH: Final = 6
_EXPECT: Final = 7
_TE: Final = 8
_LENGTH: Final = 9
_UPGRADE: Final = 10
_DROP: Final = 11
_LOGIN: Final = 12
_RETRY: Final = 13  # Retry-After: passed on, and read as a back-off when the answer is a 429

_REQUEST_KINDS: Final[dict[bytes, int]] = {name: _DROP for name in _HOP}
_REQUEST_KINDS.update({
    b"host": _HOST, b"cookie": _COOKIE, b"connection": _CONN, b"x-forwarded-for": _XFF,
    b"x-forwarded-proto": _XFP, b"x-forwarded-host": _XFH, b"expect": _EXPECT, b"transfer-encoding": _TE,
    b"content-length": _LENGTH, b"upgrade": _UPGRADE,
    b"x-elastic-user-id": _DROP,  # only the front says who the user is
})
_RESPONSE_KINDS: Final[dict[bytes, int]] = {name: _DROP for name in _HOP}
_RESPONSE_KINDS.update({
    b"connection": _CONN, b"transfer-encoding": _TE, b"content-length": _LENGTH, b"upgrade": _UPGRADE,
    b"x-elastic-login": _LOGIN, b"retry-after": _RETRY,
})
_NOT_NAMES: Final = frozenset({b"close", b"keep-alive", b"upgrade", b""})  # Connection tokens that name no header


class RequestHead:
    """A client's request head, read. ``lines``: the end-to-end header lines as pieces to join."""

    __slots__ = ("chunked", "cookie", "expect", "forwarded_for", "forwarded_host", "host", "hosts", "keep_alive",
                 "length", "lines", "proto", "upgrade")

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.host: bytes | None = None
        self.hosts = 0  # Host lines sent: two make the request ambiguous (RFC 9112 §3.2), and host None
        self.cookie: bytes | None = None
        self.forwarded_for: bytes | None = None
        self.forwarded_host: bytes | None = None
        self.proto: bytes | None = None
        self.expect = False
        self.chunked: bytes | None = None  # the Transfer-Encoding value when the body is chunked
        self.length: bytes | None = None
        self.upgrade: bytes | None = None  # the Upgrade value, kept only for a real upgrade request
        self.keep_alive = True

    @property
    def has_body(self) -> bool:
        return self.chunked is not None or (self.length is not None and self.length.strip() not in (b"0", b""))

    @property
    def secure(self) -> bool:
        """Came over TLS, as the terminator in front of us says (the first X-Forwarded-Proto value)."""
        return self.proto is not None and self.proto.split(b",", 1)[0].strip().lower() == b"https"


def is_http11(parser: Any, tokens: list[bytes] | None) -> bool:
    """The message's version is 1.1, asking the parser as cheaply as it can be asked (at the end of a head).

    ``get_http_version`` formats a string (~0.3 µs); ``should_keep_alive`` is a plain C flag that is True
    without a keep-alive token only for HTTP/1.1, so the string is only made for the rarer cases."""
    if parser.should_keep_alive() and (tokens is None or b"keep-alive" not in tokens):
        return True
    return bool(parser.get_http_version() == "1.1")


def _drop_named(lines: list[bytes], names: set[bytes]) -> list[bytes]:
    """Without the header lines ``Connection`` named (lines are (name, ": ", value, CRLF) pieces)."""
    kept: list[bytes] = []
    for i in range(0, len(lines), 4):
        if lines[i].lower() not in names:
            kept.extend(lines[i:i + 4])
    return kept


def _tokens(value: bytes) -> list[bytes]:
    return [token.strip().lower() for token in value.split(b",")]


class RequestReader:
    """Reads request heads one header at a time: ``header`` is the parser's own ``on_header`` callback (one
    Python call per header), ``finish`` completes the head at ``on_headers_complete``. No I/O."""

    __slots__ = ("between", "head", "size", "tokens")

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        # Between heads (after finish(), until the next message begins: ``between`` is the caller's to clear), the
        # fields a chunked body's trailer carries are dropped: a proxy may discard them (RFC 9110 §6.5.1), and
        # read into the next head they would give one request's Cookie, Host or X-Forwarded-For to another.
        self.between = False
        self.head = RequestHead()
        self.size = 0  # header bytes read (name, value, ": " and CRLF)
        self.tokens: list[bytes] | None = None  # Connection's tokens

    def header(self, name: bytes, value: bytes) -> None:
        if self.between:
            return  # a trailer field (see start)
        head = self.head
        self.size += len(name) + len(value) + 4
        kind = _REQUEST_KINDS.get(name.lower())
        if kind is None:
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == _HOST:
            head.hosts += 1
            head.host = value if head.hosts == 1 else None  # None: head_refusal, not the fast path, decides
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == _COOKIE:
            head.cookie = value if head.cookie is None else head.cookie + b"; " + value
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == _CONN:
            tokens = self.tokens
            if tokens is None:
                self.tokens = _tokens(value)
            else:  # (extended in place: a head of many Connection lines is linear, not quadratic)
                tokens.extend(_tokens(value))
        elif kind == _XFF:
            head.forwarded_for = value if head.forwarded_for is None else head.forwarded_for + b", " + value
        elif kind == _XFP:
            head.proto = value if head.proto is None else head.proto + b", " + value
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == _XFH:
            head.forwarded_host = value
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == _EXPECT:
            head.expect = value.strip().lower() == b"100-continue"
        elif kind == _TE:
            head.chunked = value  # the parser took the chunked layer off; other codings stay, and stay said
        elif kind == _LENGTH:
            head.length = value
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == _UPGRADE:
            head.upgrade = value
        # _DROP: hop-by-hop, or X-Elastic-User-Id (only the front says who the user is)

    def finish(self, http11: bool, upgrade: bool) -> RequestHead:
        """``upgrade``: the parser saw a real upgrade request (Upgrade with Connection: upgrade). The reader is
        ready for the next head afterwards (``size`` and ``tokens`` describe that one: read them first)."""
        head = self.head
        if not upgrade:
            head.upgrade = None
        tokens = self.tokens
        if tokens is None:
            head.keep_alive = http11
        else:
            head.keep_alive = b"close" not in tokens if http11 else b"keep-alive" in tokens
            named = set(tokens) - _NOT_NAMES
            if named:
                head.lines = _drop_named(head.lines, named)
                if b"cookie" in named:
                    head.cookie = None
        self.head = RequestHead()  # start(), inlined: readied for the next head in the same call
        self.size = 0
        self.tokens = None
        self.between = True
        return head


def _set_host(head: RequestHead, authority: bytes) -> None:
    """The request's host is ``authority``: every Host line the client sent gives way to one naming it."""
    lines = [piece for i in range(0, len(head.lines), 4) if head.lines[i].lower() != b"host"
             for piece in head.lines[i:i + 4]]
    lines.extend((b"Host", b": ", authority, b"\r\n"))
    head.lines = lines
    head.host = authority


def head_refusal(head: RequestHead, method: bytes, url: bytes, http11: bool,
                 version: str | None) -> tuple[int, str, bytes]:
    """What RFC 9112 makes of a complete request head before anything routes it: (0, "", target) to go on,
    with the target the worker gets, or (status, why, url) to refuse. ``version``: the parser's
    "major.minor", needed only when ``http11`` cannot be trusted to say it (a request not HTTP/1.1, or a
    parser that does not check versions itself).

    - HTTP/1.1 without Host, or with two Host lines: 400 (§3.2: "MUST respond with a 400").
    - A version other than 1.0 and 1.1 (HTTP/0.9's bare request line, 1.2, 2.0 over 1.1 framing): 400.
    - CONNECT (authority-form, §3.2.3): 501; the front is no forward proxy.
    - The asterisk form (§3.2.4) only for OPTIONS; any other target that is neither origin-form nor an
      http(s) absolute-form: 400.
    - An absolute-form target (§3.2.2): an origin server "MUST ignore the received Host header field … and
      instead use the host information of the request-target". The request is routed by the target's
      authority, the worker's Host line says that authority, and the worker gets the origin form (path and
      query), so no request is routed by one name while its worker is told another. A target with userinfo
      (``http://user@host/``, RFC 9110 §4.2.4) or an empty authority is refused.
    """
    if version is not None and version not in ("1.0", "1.1"):
        return 400, f"HTTP/{version} is not supported (HTTP/1.1 or 1.0 only)", url
    if head.hosts > 1:
        return 400, "a request with more than one Host header", url
    if method == b"CONNECT":
        return 501, "CONNECT is not supported", url
    if url == b"*":
        if method != b"OPTIONS":
            return 400, "the asterisk target is for OPTIONS only", url
    elif url[:1] != b"/":
        lower = url[:8].lower()
        skip = 7 if lower.startswith(b"http://") else 8 if lower.startswith(b"https://") else 0
        if not skip:
            return 400, "a request target must be a path or an http(s) URL", url
        if skip:
            rest = url[skip:]
            end = len(rest)
            for stop in (b"/", b"?", b"#"):
                found = rest.find(stop)
                if 0 <= found < end:
                    end = found
            authority, target = rest[:end], rest[end:]
            if not authority or b"@" in authority:
                return 400, "an absolute-form target needs a host and no userinfo", url
            if not target.startswith(b"/"):
                target = b"/" + target
            _set_host(head, authority)
            url = target
    if head.host is None and http11:
        return 400, "an HTTP/1.1 request needs a Host header", url
    return 0, "", url


def oversize_status(url_bytes: int, header_bytes: int, limit: int) -> tuple[int, str]:
    """A head past ``limit`` bytes: 414 when the target is most of it (RFC 9110 §15.5.15), else 431 — also while
    a first large header is still arriving and no header has been counted yet."""
    if url_bytes > limit // 2:  # the target is the larger part of what passed the bound
        return 414, "request target too long"
    return 431, "request headers too large"


def read_request(headers: list[tuple[bytes, bytes]], http11: bool, upgrade: bool) -> RequestHead:
    """A whole head at once (for tests and tools): what the reader makes of these headers."""
    reader = RequestReader()
    for name, value in headers:
        reader.header(name, value)
    return reader.finish(http11, upgrade)


_COMMON_TAIL: Final = (b"X-Forwarded-For: %b\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: %b\r\n"
                       b"X-Elastic-User-Id: %b\r\n\r\n")


def upstream_head(method: bytes, url: bytes, head: RequestHead, peer: bytes | None, user: bytes) -> list[bytes]:
    """The pieces of the request head the worker receives (joined by the caller with whatever body follows)."""
    parts = [method, b" ", url, b" HTTP/1.1\r\n", *head.lines]
    if (peer is not None and head.forwarded_for is None and head.proto is None and head.forwarded_host is None
            and head.host is not None and head.chunked is None and head.upgrade is None):
        # The common request (from a client, not through another proxy; no body framing, no upgrade): the
        # lines below as one formatted piece, what they would make one by one.
        parts.append(_COMMON_TAIL % (peer, head.host, user))
        return parts
    # X-Forwarded-For is appended to (a proxy in front of us keeps its chain); Proto and Host are only set
    # when absent, so a TLS terminator in front can state the scheme and host the user saw.
    if peer is not None:
        previous = head.forwarded_for
        parts.extend((b"X-Forwarded-For: ", previous + b", " + peer if previous else peer, b"\r\n"))
    elif head.forwarded_for is not None:
        parts.extend((b"X-Forwarded-For: ", head.forwarded_for, b"\r\n"))
    if head.proto is None:
        parts.append(b"X-Forwarded-Proto: http\r\n")
    if head.forwarded_host is None and head.host is not None:
        parts.extend((b"X-Forwarded-Host: ", head.host, b"\r\n"))
    parts.extend((b"X-Elastic-User-Id: ", user, b"\r\n"))
    if head.chunked is not None:
        parts.extend((b"Transfer-Encoding: ", head.chunked, b"\r\n"))
    if head.upgrade is not None:
        parts.extend((b"Connection: upgrade\r\nUpgrade: ", head.upgrade, b"\r\n"))
    parts.append(b"\r\n")
    return parts


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
        kind = _RESPONSE_KINDS.get(name.lower())
        if kind is None:
            self.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == _LENGTH:
            self.length = value
            self.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == _CONN:
            tokens = self.tokens
            if tokens is None:
                self.tokens = _tokens(value)
            else:  # (extended in place: a head of many Connection lines is linear, not quadratic)
                tokens.extend(_tokens(value))
        elif kind == _TE:
            self.chunked = True
        elif kind == _LOGIN:
            self.login = value.strip()
        elif kind == _UPGRADE:
            self.upgrade = value
        elif kind == _RETRY:
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
            named = set(tokens) - _NOT_NAMES
            if named:
                parts = [parts[0], *_drop_named(parts[1:], named)]
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
