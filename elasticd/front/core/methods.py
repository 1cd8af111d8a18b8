"""Request methods the parser does not know (pure).

A method is any token (RFC 9110 §9.1: "the method token is case-sensitive", extension methods are registered and
unregistered alike), and an intermediary forwards a method it does not recognise. httptools knows a fixed list: the
llhttp of PyPI's 0.9 (GET … QUERY), the http-parser of Debian's 0.1.1 (GET … SOURCE, no QUERY), and answers
anything else ``HttpParserInvalidMethodError`` (``FOO``, ``-BLARGH``, a WebDAV or version-control extension).

How the front forwards one anyway (``ClientRelay._unknown_method``): the parser stops at the method, so the front
reads that request's method token itself, and gives a fresh parser the same bytes with ``PLACEHOLDER`` in its place.
Framing a request's body does not depend on its method (RFC 9112 §6: Content-Length or Transfer-Encoding alone;
only CONNECT differs, and it is a known method), so the parser reads the rest of the request exactly as it would
have; the worker gets the method the client sent. Why not a request line read by the front for every request:
the common path stays the parser's alone (no Python pass over each request line), and the cost falls on the rare
request only (a parser made, ~1 µs). httptools does not say where in a read it stopped: for an unknown method
behind other requests in the same read (pipelined), the relay finds where they ended by walking their heads and
Content-Length bodies again (``RequestReading._past_requests``); were that walk and the parser ever to disagree, the
request is answered 501 and the connection closes rather than read from a guessed place.
"""

from __future__ import annotations

from typing import Final

__all__ = ["MAX_METHOD", "MORE", "PLACEHOLDER", "WHOLE", "read_method"]

PLACEHOLDER: Final = b"GET"
MAX_METHOD: Final = 64  # bytes: a longer token is no method anyone registers (nginx's own bound is 32)

_TCHAR: Final = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")

# read_method's answers besides a method
WHOLE: Final = 0
MORE: Final = -1  # the token is not whole yet: wait for more bytes (the bytes so far are kept)


def read_method(data: bytes) -> tuple[int, bytes, int, str]:
    """The method token at the start of ``data`` (a request's first bytes, after the empty lines RFC 9112 §2.2 lets
    a server ignore): (WHOLE, the token, where it ends, ""); (MORE, b"", 0, "") while no space has ended it yet; or
    (status, b"", 0, why) for bytes that are no request (400) or a token past ``MAX_METHOD`` (501)."""
    # Any CR and LF bytes before it, as the parser skips them (llhttp and http-parser alike): a CRLF cut by a read's
    # end leaves a lone LF at the start of the next.
    start = len(data) - len(data.lstrip(b"\r\n"))
    end = data.find(b" ", start, start + MAX_METHOD + 1)
    token = data[start:start + MAX_METHOD + 1] if end < 0 else data[start:end]
    if any(byte not in _TCHAR for byte in token) or (end >= 0 and not token):
        return 400, b"", 0, "bad request: a request method is a token (RFC 9110 §9.1)"
    if end < 0:
        if len(token) > MAX_METHOD:
            return 501, b"", 0, f"a request method over {MAX_METHOD} bytes is not supported"
        return MORE, b"", 0, ""
    return WHOLE, token, end, ""
