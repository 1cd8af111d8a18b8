"""``GET /v1/registry`` on ``metrics_listen``: this host's signed capacity snapshot, for another elasticd that
routes to this one as a node (its ``registry`` probe; seed 001).

The body is the canonical JSON of ``registry_snapshot.snapshot`` — each app group's workers, whether they are
healthy, their open requests, their limit and their own capacity reading; no URL, no socket path, no secret —
signed with HMAC-SHA256 in ``X-Elastic-Registry-Signature``. With a ``key_file``, a reader must also send
``Authorization: Bearer <key>`` (compared in constant time). The secret and the key are read by the daemon at
start and at each reload (``read_registry``): a refused one refuses the reload, and the running ones stay.
"""

from __future__ import annotations

import hmac
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from elasticd.config.model import Registry
from elasticd.probes.kinds import read_key_file, read_secret_file
from elasticd.probes.registry_snapshot import SIGNATURE_HEADER, canonical, sign, snapshot

__all__ = ["Publisher", "RegistryPage", "read_registry"]

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


@dataclass(frozen=True, slots=True)
class Publisher:
    """What the page signs with, as read from ``server.registry``."""

    secret: bytes
    key: str | None
    ttl: float
    instance: str


def read_registry(settings: Registry | None) -> Publisher | None:
    """``server.registry``'s secret (at least 32 bytes) and key, read now; ValueError naming the file."""
    if settings is None:
        return None
    key = read_key_file(settings.key_file) if settings.key_file is not None else None
    return Publisher(read_secret_file(settings.secret_file), key, settings.ttl,
                     settings.instance or socket.gethostname())


class RegistryPage:
    __slots__ = ("_apps", "_wall", "publisher")

    def __init__(self, apps: Callable[[], Sequence[dict[str, Any]]], wall: Callable[[], float] = time.time) -> None:
        self._apps = apps
        self._wall = wall
        self.publisher: Publisher | None = None  # swapped by the daemon at start and at each reload

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/registry", self._registry)

    async def _registry(self, request: web.Request) -> web.Response:
        publisher = self.publisher
        if publisher is None:
            return web.json_response({"error": "no registry here: server.registry is not set"}, status=404,
                                     headers=_HEADERS)
        if publisher.key is not None:
            given = request.headers.get("Authorization", "")
            expected = f"Bearer {publisher.key}"
            if not hmac.compare_digest(given.encode("latin-1", "replace"), expected.encode()):
                return web.json_response({"error": "the registry needs its bearer key (Authorization: Bearer …)"},
                                         status=401, headers={**_HEADERS, "WWW-Authenticate": "Bearer"})
        body = canonical(snapshot(publisher.instance, round(self._wall(), 3), publisher.ttl, self._apps()))
        return web.Response(body=body, content_type="application/json",
                            headers={**_HEADERS, SIGNATURE_HEADER: sign(publisher.secret, body)})
