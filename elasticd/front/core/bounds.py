"""The bounds on what a worker feeds the front, and on what the front spends on one worker. Pure: no I/O.

Every tenant is hostile: its worker (or node) may answer with garbage or an endless head, hold connections open,
or never answer, and the front is shared by every tenant. So each input a worker controls has a bound here, with
why it is that size, and one refusal past it, counted by reason (``elasticd_upstream_refusals_total``):

- its answer's head (the status line, the header lines, interim 1xx heads): ``MAX_HEAD_BYTES`` and
  ``MAX_HEAD_FIELDS`` (``http1.ResponseReader``, ``answer.AnswerRelay``), ``MAX_INTERIM`` interim heads, and the
  front's ``request_timeout`` from its first byte (``connection.ClientRelay.head_overdue``): 502, or 504 for the
  time, and the worker's connection closed;
- a chunked body's bytes that carry no body (a chunk-size line with its extensions, the trailer):
  ``MAX_FRAMING_BYTES``, and the trailer's lines ``MAX_HEAD_FIELDS``: the answer has begun, so the client's
  connection is cut, and the worker's closed;
- its connections: at most ``connection_bound`` open at once (of its group's ``concurrency``), ``idle_bound`` of
  them kept idle; a request past the bound waits for one (``next_connection``), at most ``MAX_WAITING`` per
  worker and at most ``request_timeout`` (504); past ``MAX_WAITING``, 503 with Retry-After.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CONNECTIONS", "CONNECTIONS_PER_SLOT", "DEFAULT_CONCURRENCY", "FRAMING", "HEAD_FIELDS", "HEAD_SIZE",
           "HEAD_TIME", "INTERIM", "MALFORMED", "MAX_CONNECTIONS", "MAX_FRAMING_BYTES", "MAX_HEAD_BYTES",
           "MAX_HEAD_FIELDS", "MAX_INTERIM", "MAX_WAITING", "MIN_CONNECTIONS", "OPEN", "REFUSE", "WAIT",
           "AnswerRefused", "connection_bound", "idle_bound", "next_connection"]

# ------------------------------------------------------------------ a worker's answer

# Bytes of a head: the client's request head (431 past it: the front's ``max_header_bytes`` by default) and a
# worker's answer head (502 past it). nginx refuses a request head past 4 x 8 KiB and an answer head past 4-8 KiB
# (proxy_buffer_size); a real answer head is a few hundred bytes, so this leaves room for many cookies and still
# caps what one exchange can make the front buffer for a head.
MAX_HEAD_BYTES: Final = 32 << 10
# Header lines of an answer head (and of a chunked body's trailer). Each is a Python call and four list entries on
# the front; a real head has a few dozen (Apache caps a request at 100, Node.js at 2000, Go has no count).
MAX_HEAD_FIELDS: Final = 256
# Interim (1xx) heads before the final one: 103 Early Hints is sent once or twice, 100 Continue once (the front
# never forwards Expect, so a worker has no reason to); each interim head restarts the head's clock, so without a
# count a worker could hold a request with an interim head every request_timeout, for ever.
MAX_INTERIM: Final = 8
# Bytes of a chunked body that carry no body byte: a chunk-size line is a few bytes (hex and CRLF), but llhttp
# reads chunk extensions of any length and httptools buffers each trailer line whole; past this the stream is
# framing with no content, from a worker that answers nobody.
MAX_FRAMING_BYTES: Final = 32 << 10

# Why an answer was refused: the ``reason`` label of elasticd_upstream_refusals_total.
HEAD_SIZE: Final = "head_size"  # its head is over MAX_HEAD_BYTES
HEAD_FIELDS: Final = "head_fields"  # its head has more than MAX_HEAD_FIELDS lines
HEAD_TIME: Final = "head_time"  # its head did not arrive whole within request_timeout of its first byte (504)
INTERIM: Final = "interim"  # more than MAX_INTERIM interim heads
FRAMING: Final = "framing"  # chunk-size lines or a trailer over MAX_FRAMING_BYTES, or a trailer of too many lines
MALFORMED: Final = "malformed"  # not HTTP/1.1 the parser can read
CONNECTIONS: Final = "connections"  # a request refused: MAX_WAITING requests already wait for this worker (503)


class AnswerRefused(Exception):
    """Raised inside the parser's callbacks when a worker's answer passes a bound: ``reason`` one of the constants
    above, ``why`` what it sent, as the logs and the client's 502 say it ("sent an answer head over ...")."""

    def __init__(self, reason: str, why: str) -> None:
        super().__init__(why)
        self.reason = reason
        self.why = why


# ------------------------------------------------------------------ connections to a worker

DEFAULT_CONCURRENCY: Final = 8  # a group's concurrency when the route does not say (the config's default)
# Connections per request a worker serves at once: ``concurrency`` carrying requests, as many again queued in its
# accept backlog so it picks the next request up the moment one ends. More would only wait in the worker's kernel
# queue instead of the front's, each holding a file descriptor of the front's.
CONNECTIONS_PER_SLOT: Final = 2
MIN_CONNECTIONS: Final = 8  # a worker of concurrency 1 still gets a few (a retry, answers ending as others begin)
MAX_CONNECTIONS: Final = 1024  # whatever the concurrency says (it may be 100000): the front's descriptors are shared
# Requests waiting for a connection to one worker (each also bounded by request_timeout): a worker that accepts
# and never answers holds its bound's connections, and what comes after waits here, not in new connections.
MAX_WAITING: Final = 1024

# next_connection's decisions.
OPEN: Final = 0  # open a new connection to the worker
WAIT: Final = 1  # wait for one of its connections to come free (or to close)
REFUSE: Final = 2  # answer 503: too many wait already


def connection_bound(concurrency: int) -> int:
    """The most connections the front keeps open to one worker of a group of ``concurrency`` (tunnels aside: each
    is one client's connection, bounded by the client side)."""
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, CONNECTIONS_PER_SLOT * concurrency))


def idle_bound(concurrency: int) -> int:
    """The most kept idle for reuse: half the bound, as many as the worker serves at once (a burst opens the rest,
    and they close as it ends)."""
    return connection_bound(concurrency) // 2


def next_connection(open_conns: int, connecting: int, waiting: int, bound: int) -> int:
    """A request for a worker with no idle connection: OPEN one while those open and being opened are under
    ``bound``; else WAIT for one, unless ``MAX_WAITING`` requests wait already: REFUSE."""
    if open_conns + connecting < bound:
        return OPEN
    if waiting < MAX_WAITING:
        return WAIT
    return REFUSE
