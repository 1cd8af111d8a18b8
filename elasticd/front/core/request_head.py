"""A client's request head, as the proxy reads it and as its worker gets it (pure): see ``http1.py``.

- ``RequestReader``: the client's head, a header at a time (httptools' own callback) → what the worker gets
  (end-to-end headers, Host kept, the X-Forwarded-* trio said by the front or passed from a trusted proxy,
  X-Elastic-User-Id set by the front only) and the facts the front routes on;
- ``head_refusal``: what RFC 9112 refuses before anything routes a request;
- ``upstream_head``: those facts → the request head bytes for the worker (always HTTP/1.1, kept alive).
"""

from __future__ import annotations

from typing import Final

from elasticd.front.core.fields import (
    CONN,
    CONTENT_LENGTH,
    COOKIE,
    DROP,
    EXPECT,
    HOP,
    HOST,
    MALFORMED,
    NAME_KEPT,
    NAMES_KEPT,
    NOT_NAMES,
    PLAIN,
    TE,
    UNDERSCORED,
    UPGRADE,
    XFF,
    XFH,
    XFP,
    connection_tokens,
    drop_named,
)

__all__ = ["RequestHead", "RequestReader", "head_refusal", "oversize_status", "read_request", "upstream_head"]

# A request's headers by kind, from a peer the operator trusts to say where a request came from
# (``server.trusted_proxies``, ``server.trusted_proxy_users``: its X-Forwarded-* and Forwarded pass on, and the
# front adds to them) ...
_TRUSTED_KINDS: Final[dict[bytes, int]] = {name: DROP for name in HOP}
_TRUSTED_KINDS.update({
    b"host": HOST, b"cookie": COOKIE, b"connection": CONN, b"x-forwarded-for": XFF,
    b"x-forwarded-proto": XFP, b"x-forwarded-host": XFH, b"expect": EXPECT, b"transfer-encoding": TE,
    b"content-length": CONTENT_LENGTH, b"upgrade": UPGRADE,
    b"x-elastic-user-id": DROP,  # only the front says who the user is
})
# ... and from anyone else (every client by default): what a client says of its own address, scheme and host is
# dropped, and the front says it (upstream_head). A client's "X-Forwarded-Proto: https" would otherwise make the app
# believe the user came over TLS, and its X-Forwarded-For name any address; apps behind the front (gunicorn,
# uvicorn, Werkzeug's ProxyFix, Express) trust these headers from 127.0.0.1, which the front is. The other
# X-Forwarded-* names go too (``_SAID_BY_PROXIES``), and X-Real-IP, nginx's.
_LISTED: Final = frozenset(_TRUSTED_KINDS)  # (the names a table lists before it keeps any decision)
_REQUEST_KINDS: Final[dict[bytes, int]] = dict(_TRUSTED_KINDS)
_REQUEST_KINDS.update({name: DROP for name in (b"x-forwarded-for", b"x-forwarded-proto", b"x-forwarded-host",
                                                b"forwarded", b"x-real-ip")})
_SAID_BY_PROXIES: Final = b"x-forwarded-"


_DECIDED: Final = NAMES_KEPT  # names a kinds table keeps its decision for, past the listed ones (fields.py says why)
_KEPT_NAME: Final = NAME_KEPT


def _unlisted(name: bytes, lower: bytes, trusted: bool, kinds: dict[bytes, int]) -> int:
    """The kind of a field name the table does not list, kept in it (up to ``_DECIDED`` names: random names from a
    hostile client are decided each time, not kept) so that the next request's same field is one lookup."""
    if 0x5F in name:  # "_" (an int: see request_reading._HASH)
        # A name with "_" reads, CGI-style (HTTP_TRANSFER_ENCODING), as the one with "-": an app reading headers so
        # could not tell "Transfer_Encoding" from the real one, nor "X_Forwarded_For" from the front's. Dropped as
        # nginx does (underscores_in_headers off) unless server.underscored_headers: keep (a per-config choice:
        # never kept in the table).
        return UNDERSCORED
    if name.endswith(b" ") or name.endswith(b"\t"):  # (Debian's http-parser passes "X-A : 1" as "X-A ")
        kind = MALFORMED
    elif lower.startswith(_SAID_BY_PROXIES) and not trusted:
        kind = DROP
    else:
        kind = PLAIN
    if len(kinds) < _DECIDED and len(name) <= _KEPT_NAME:
        kinds[lower] = kind
    return kind


def _kept_underscored(lower: bytes) -> bool:
    """With server.underscored_headers: keep, a name with "_" still never reads as one the front frames by or says."""
    dashed = lower.replace(b"_", b"-")
    return not (dashed in _LISTED or dashed == b"forwarded" or dashed.startswith(_SAID_BY_PROXIES))


class RequestHead:
    """A client's request head, read. ``lines``: the end-to-end header lines as pieces to join."""

    __slots__ = ("chunked", "cookie", "expect", "forwarded_for", "forwarded_host", "host", "hosts", "keep_alive",
                 "length", "lines", "malformed", "proto", "upgrade")

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.host: bytes | None = None
        self.hosts = 0  # Host lines sent: two make the request ambiguous (RFC 9112 §3.2), and host None
        self.malformed: str | None = None  # what makes it no request a parser should have passed (head_refusal: 400)
        self.cookie: bytes | None = None
        self.forwarded_for: bytes | None = None
        self.forwarded_host: bytes | None = None
        self.proto: bytes | None = None
        self.expect = False
        self.chunked: bytes | None = None  # the Transfer-Encoding value (its lines as one list) when it has one
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


class RequestReader:
    """Reads request heads one header at a time: ``header`` is the parser's own ``on_header`` callback (one
    Python call per header), ``finish`` completes the head at ``on_headers_complete``. No I/O."""

    __slots__ = ("between", "head", "keep_underscored", "kinds", "size", "tokens", "trusted")

    def __init__(self, *, trusted: bool = False, keep_underscored: bool = False) -> None:
        self.trusted = False
        self.kinds = _REQUEST_KINDS
        self.keep_underscored = keep_underscored  # server.underscored_headers: keep
        self.trust(trusted)
        self.start()

    def trust(self, trusted: bool) -> None:
        """Whether this connection's peer is a proxy the operator trusts with X-Forwarded-* and Forwarded (see
        ``_TRUSTED_KINDS``): decided once, as the connection is made, by the front's shell."""
        self.trusted = trusted
        self.kinds = _TRUSTED_KINDS if trusted else _REQUEST_KINDS

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
        kinds = self.kinds
        lower = name.lower()
        kind = kinds.get(lower)
        if kind is None:
            kind = _unlisted(name, lower, self.trusted, kinds)
        if kind == PLAIN:  # (the common field: the table, or the decision it keeps, says so in one lookup)
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == HOST:
            head.hosts += 1
            head.host = value if head.hosts == 1 else None  # None: head_refusal, not the fast path, decides
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == COOKIE:
            head.cookie = value if head.cookie is None else head.cookie + b"; " + value
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == CONN:
            tokens = self.tokens
            if tokens is None:
                self.tokens = connection_tokens(value)
            else:  # (extended in place: a head of many Connection lines is linear, not quadratic)
                tokens.extend(connection_tokens(value))
        elif kind == XFF:
            head.forwarded_for = value if head.forwarded_for is None else head.forwarded_for + b", " + value
        elif kind == XFP:
            head.proto = value if head.proto is None else head.proto + b", " + value
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == XFH:
            head.forwarded_host = value
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == EXPECT:
            head.expect = value.strip().lower() == b"100-continue"
        elif kind == TE:
            # The parser took the chunked layer off; other codings stay, and stay said. Lines repeated are one
            # list (RFC 9110 §5.3): "gzip" then "chunked" is "gzip, chunked", a gzipped body, chunked.
            head.chunked = value if head.chunked is None else head.chunked + b", " + value
        elif kind == CONTENT_LENGTH:
            head.length = value
            head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == UPGRADE:
            head.upgrade = value
        elif kind == UNDERSCORED:  # (the rare kinds last: the common ones pay no comparison for them)
            if self.keep_underscored and _kept_underscored(lower):
                head.lines.extend((name, b": ", value, b"\r\n"))
        elif kind == MALFORMED:
            head.malformed = "whitespace between a field name and its colon (RFC 9112 §5.1)"
        # DROP: hop-by-hop, or X-Elastic-User-Id (only the front says who the user is)

    def finish(self, http11: bool, upgrade: bool) -> RequestHead:
        """``upgrade``: the parser saw a real upgrade request (Upgrade with Connection: upgrade). The reader is
        ready for the next head afterwards (``size`` and ``tokens`` describe that one: read them first)."""
        head = self.head
        if not upgrade:
            head.upgrade = None
        if head.malformed is not None:
            head.host = None  # (not the common request: head_refusal reads it, and refuses)
        tokens = self.tokens
        if tokens is None:
            head.keep_alive = http11
        else:
            head.keep_alive = b"close" not in tokens if http11 else b"keep-alive" in tokens
            named = set(tokens) - NOT_NAMES
            if named:
                head.lines = drop_named(head.lines, named)
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

    - HTTP/1.1 without Host, or with two Host lines: 400 (§3.2: "MUST respond with a 400"). A target with a
      fragment: 400 (§3: an invalid request-line SHOULD be).
    - Transfer-Encoding in HTTP/1.0, or with a last coding other than chunked: 400, and the connection closes
      (§6.1, §6.3: the body's end cannot be known, so nothing after it can be read as a request).
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
    if head.malformed is not None:
        return 400, f"bad request: {head.malformed}", url
    if version is not None and version not in ("1.0", "1.1"):
        return 400, f"HTTP/{version} is not supported (HTTP/1.1 or 1.0 only)", url
    if head.chunked is not None:
        if not http11:  # (§6.1: "MUST treat the message as if the framing is faulty ... and close the connection")
            return 400, "Transfer-Encoding in an HTTP/1.0 request: its framing cannot be trusted", url
        if connection_tokens(head.chunked)[-1] != b"chunked":  # (§6.3: its length cannot be known: 400, then close)
            return 400, "a Transfer-Encoding whose last coding is not chunked: the body's length is unknown", url
    if head.hosts > 1:
        return 400, "a request with more than one Host header", url
    if 0x23 in url:  # "#" (§3.2: a target has no fragment; a worker's router would read one as part of its path)
        return 400, "a request target with a fragment (#)", url
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
            if not authority or 0x40 in authority:  # "@"
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


def read_request(headers: list[tuple[bytes, bytes]], http11: bool, upgrade: bool, *, trusted: bool = False,
                 keep_underscored: bool = False) -> RequestHead:
    """A whole head at once (for tests and tools): what the reader makes of these headers."""
    reader = RequestReader(trusted=trusted, keep_underscored=keep_underscored)
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
