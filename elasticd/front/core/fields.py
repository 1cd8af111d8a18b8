"""What both directions of the proxy's HTTP/1.1 share (pure): how a body's end is known, the hop-by-hop fields that
never cross (RFC 9110 §7.6.1), the kinds a header is read as, and Connection's tokens. ``request_head.py`` and
``response_head.py`` read the two heads; ``http1.py`` says what the whole does."""

from __future__ import annotations

from typing import Any, Final

__all__ = ["CHUNK", "EOF", "HOP", "LENGTH", "NONE", "NOT_NAMES", "connection_tokens", "drop_named", "is_http11"]

# Framing of a body (how its end is known).
NONE: Final = 0
LENGTH: Final = 1
CHUNK: Final = 2
EOF: Final = 3

HOP: Final = (b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
              b"te", b"trailer", b"trailers", b"transfer-encoding", b"upgrade")
# The kinds a header is read as (each direction's table maps a lower-case name to one; a response's absent: PLAIN).
PLAIN: Final = 0  # passed on as it is
HOST: Final = 1
COOKIE: Final = 2
CONN: Final = 3
XFF: Final = 4
XFP: Final = 5
XFH: Final = 6
EXPECT: Final = 7
TE: Final = 8
CONTENT_LENGTH: Final = 9
UPGRADE: Final = 10
DROP: Final = 11
LOGIN: Final = 12
RETRY: Final = 13  # Retry-After: passed on, and read as a back-off when the answer is a 429
UNDERSCORED: Final = 14  # a request's name with "_" (request_head.py says why it is dropped)
MALFORMED: Final = 15  # a request's name no parser should have passed
NOT_NAMES: Final = frozenset({b"close", b"keep-alive", b"upgrade", b""})  # Connection tokens that name no header
# The decisions kept per field name (the request side's table and the answer side's): at most NAMES_KEPT names, each of
# at most NAME_KEPT bytes. Real names are few and short (the longest common ones under 40 bytes); random ones from a
# hostile client or worker are decided each time, and 4,096 names of a head's size each would otherwise keep tens of
# MiB in the front for its life.
NAMES_KEPT: Final = 4096
NAME_KEPT: Final = 64


def is_http11(parser: Any, tokens: list[bytes] | None) -> bool:
    """The message's version is 1.1, asking the parser as cheaply as it can be asked (at the end of a head).

    ``get_http_version`` formats a string (~0.3 µs); ``should_keep_alive`` is a plain C flag that is True
    without a keep-alive token only for HTTP/1.1, so the string is only made for the rarer cases."""
    if parser.should_keep_alive() and (tokens is None or b"keep-alive" not in tokens):
        return True
    return bool(parser.get_http_version() == "1.1")


def drop_named(lines: list[bytes], names: set[bytes]) -> list[bytes]:
    """Without the header lines ``Connection`` named (lines are (name, ": ", value, CRLF) pieces)."""
    kept: list[bytes] = []
    for i in range(0, len(lines), 4):
        if lines[i].lower() not in names:
            kept.extend(lines[i:i + 4])
    return kept


def connection_tokens(value: bytes) -> list[bytes]:
    return [token.strip().lower() for token in value.split(b",")]


