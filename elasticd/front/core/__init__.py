"""The front's sans-I/O core: no socket, no clock read, no event loop (time is passed in).

- ``connection``: one client connection's relay — its bytes in, effects and bytes out (pipelining, upgrade,
  draining, pausing, parse errors);
- ``answer``: one worker connection's relay — the worker's bytes in, the client's bytes and effects out (answered,
  release or close the connection, upgraded, failed);
- ``relay``: the phase table every request moves along, and the decisions at its edges (retry once, 499,
  504 or a cut, the lingering close);
- ``exchange``: one request and its answer, the only writer of its phase;
- ``dispatch``: where a request goes (route, quota, sticky lookup, placement), ``Forward`` or ``Refuse``;
- ``http1``: request and response framing over httptools, and what is refused (RFC 9112);
- ``routing``: Host → app;
- ``quota``: per-tenant concurrency gates and token buckets;
- ``sticky``: the surface (user → worker), the cookie, placement on the routable workers;
- ``counters``: forward counters per worker and per route, and the open-requests dict;
- ``bounds``: what a worker may feed the front (its answer's head, interim heads, chunked framing) and how many
  connections the front keeps to it, with the decision at the bound.

The asyncio shell (``front/server.py``, ``client.py``, ``upstream.py``) imports these; they never import it.
"""
