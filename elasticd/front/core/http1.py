"""The HTTP/1.1 rules of the proxy, as pure functions over parsed heads: no sockets, no clock (h11-style).

httptools (a C parser) finds the message boundaries and hands over (name, value) pairs; these functions
decide what crosses the proxy and how each body is framed, and build the bytes to send (the two heads are read in
``request_head.py`` and ``response_head.py``, on what they share, ``fields.py``; this module names the whole, as the
front's modules import it):

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

from elasticd.front.core.fields import CHUNK, EOF, LENGTH, NONE, is_http11
from elasticd.front.core.request_head import (
    RequestHead,
    RequestReader,
    head_refusal,
    oversize_status,
    read_request,
    upstream_head,
)
from elasticd.front.core.response_head import ResponseHead, ResponseReader, chunk, plain, read_response, status_line

__all__ = ["CHUNK", "EOF", "LENGTH", "NONE", "RequestHead", "RequestReader", "ResponseHead", "ResponseReader",
           "chunk", "head_refusal", "is_http11", "oversize_status", "plain", "read_request", "read_response",
           "status_line", "upstream_head"]
