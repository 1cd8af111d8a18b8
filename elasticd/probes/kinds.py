"""The built-in probes (seed 001): ``prometheus`` reads a worker's or a node's own metrics, ``registry`` another
elasticd's signed snapshot. ``inflight`` and ``ratelimit`` have no probe object (``factory``)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from elasticd.config.model import Capacity
from elasticd.probes.exposition import DEFAULT_RUNNING, DEFAULT_WAITING, used_of
from elasticd.probes.probe import Probe, ProbeSink, ProbeTarget
from elasticd.probes.registry_check import Refused, check_snapshot
from elasticd.probes.registry_snapshot import SIGNATURE_HEADER, node_load, read_secret

__all__ = ["PrometheusProbe", "RegistryProbe", "read_key_file", "read_secret_file"]

log = logging.getLogger("elasticd.probes")


class PrometheusProbe(Probe):
    """used = running + waiting, summed across label series (vLLM, SGLang and TGI names by default); limit =
    the block's ``limit`` or the group's concurrency. A non-2xx answer, or no such metric, forgets."""

    source: ClassVar[str | None] = "prometheus"

    def __init__(self, target: ProbeTarget, config: Capacity, sink: ProbeSink, **options: Any) -> None:
        super().__init__(target, config, sink, **options)
        self.url = config.url or (f"{target.url.rstrip('/')}{config.path}" if target.url
                                  else f"http://localhost{config.path}")
        # The seed's engines' names unless the block names its own (then only those: an app's own gauge is not
        # summed with a vLLM queue it does not have).
        named = bool(config.running or config.waiting)
        self.running = config.running or (() if named else DEFAULT_RUNNING)
        self.waiting = config.waiting or (() if named else DEFAULT_WAITING)

    async def poll(self) -> None:
        status, body, _ = await self.fetch(self.url, {"Accept": "text/plain"})
        if not 200 <= status < 300:
            self.forget("unreachable", f"HTTP {status} from {self.url}")
            return
        used = used_of(body.decode("utf-8", "replace"), self.running, self.waiting)
        if used is None:
            self.forget("no metric", f"none of {', '.join((*self.running, *self.waiting))} in {self.url}")
            return
        self.report(used, self.target.limit)


class RegistryProbe(Probe):
    """Another elasticd's ``GET /v1/registry``: refused (and the reading forgotten) when unreachable, badly
    signed, too big (its bytes or JSON values, before parsing; its apps, groups or workers after), malformed, from
    the future, stale or replayed (``registry_check``, in that order); accepted, the node's reading is its app's
    load, believed until the snapshot's own ttl runs out. Its read is every probe's (``Probe.fetch``)."""

    source: ClassVar[str | None] = "registry"

    def __init__(self, target: ProbeTarget, config: Capacity, sink: ProbeSink, **options: Any) -> None:
        super().__init__(target, config, sink, **options)
        assert config.url is not None and config.secret_file is not None  # (the config refuses a block without)
        self.url = config.url
        self.secret = read_secret_file(config.secret_file)  # at build: a bad secret skips this probe, said
        self.key = read_key_file(config.key_file) if config.key_file is not None else None
        tenant, _, app = (config.app or f"{target.tenant}/{target.app}").partition("/")
        self.app = (tenant, app)
        self.last_accepted: float | None = None

    async def poll(self) -> None:
        # Read again at each poll (two small files): a secret rotated on both hosts, and reloaded there, is the one
        # in force here too, with no restart. One that cannot be read now forgets the reading, as any failure.
        config = self.config
        assert config.secret_file is not None
        try:
            self.secret = read_secret_file(config.secret_file)
            self.key = read_key_file(config.key_file) if config.key_file is not None else None
        except ValueError as exc:
            self.forget("no secret", str(exc))
            return
        headers = {"Accept": "application/json"}
        if self.key is not None:
            headers["Authorization"] = f"Bearer {self.key}"
        status, body, answer = await self.fetch(self.url, headers)
        verdict = check_snapshot(status, body, answer.get(SIGNATURE_HEADER), self.secret, self.clock(),
                                 self.last_accepted, self.config.max_skew)
        if isinstance(verdict, Refused):
            self.forget(verdict.state, verdict.detail)
            return
        load = node_load(verdict.snapshot, *self.app)
        if load is None:
            self.forget("no such app", f"{'/'.join(self.app)} has no healthy worker in {self.url}'s snapshot")
            return
        if self.is_stopped:
            return
        self.last_accepted = verdict.generated_at
        self.report(load[0], load[1], at=verdict.generated_at, expires_at=verdict.expires_at)


def read_secret_file(path: str) -> bytes:
    """The registry's shared secret (at least 32 bytes); ValueError naming the file otherwise."""
    try:
        with open(path, "rb") as file:
            data = file.read(1 << 16)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the registry secret: {exc.strerror or exc}") from None
    return read_secret(data, path)


def read_key_file(path: str) -> str:
    """A bearer key (its first line); ValueError naming the file when unreadable, empty or not printable ASCII."""
    try:
        with open(path, "rb") as file:
            first = file.read(4096).split(b"\n", 1)[0].strip()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the registry key: {exc.strerror or exc}") from None
    if not first or not all(33 <= c < 127 for c in first):
        raise ValueError(f"{path}: the registry key must be one line of printable ASCII, without spaces")
    return first.decode("ascii")


