"""Run-time limits (ADR-0010): squeeze or free a tenant now, and choose whether it outlives elasticd.

An override lives in memory, is written to the tenant's cgroup files at once and again after every reload,
and ends with the process. ``persist`` instead writes the operator's values into the config file (see
``persist``) and reloads through the same path as ``systemctl reload``: under systemd, through systemd
itself, so its view of the service and the RELOADING=1/READY=1 pair stay right. The persisted value then
comes from the file, so it stops being an override.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from elasticd.cgroup.discovery import parse_proc_cgroup
from elasticd.config import Config, ConfigError, Resources
from elasticd.limits.overrides import clear_overrides, describe, effective, parse_clear_request, parse_limit_request
from elasticd.limits.persist import LimitEdit, PersistError, persist_limits

__all__ = ["LimitsReply", "RuntimeLimits", "systemd_unit"]

log = logging.getLogger("elasticd.limits")


class _Reloaded(Protocol):
    ok: bool
    error: str | None


@dataclass(slots=True)
class LimitsReply:
    status: int
    body: dict[str, Any] = field(default_factory=dict)


class RuntimeLimits:
    __slots__ = ("_config", "_lock", "_reload", "_write", "config_path", "overrides")

    def __init__(self, config: Callable[[], Config], config_path: str,
                 write: Callable[[str], list[str]], reload: Callable[[], Awaitable[_Reloaded]]) -> None:
        self._config = config
        self.config_path = config_path
        self._write = write  # writes one tenant's effective limits to its cgroup; returns the problems
        self._reload = reload  # the daemon's own reload (used when systemd is not our manager)
        self._lock = asyncio.Lock()
        self.overrides: dict[str, dict[str, Any]] = {}

    def resources_of(self, tenant: str) -> Resources:
        return effective(self._config().tenants[tenant].resources, self.overrides.get(tenant, {}))

    def describe(self, tenant: str) -> dict[str, Any]:
        return describe(self._config().tenants[tenant].resources, self.overrides.get(tenant, {}))

    def forget_removed(self, config: Config) -> None:
        for tenant in list(self.overrides):
            if tenant not in config.tenants:
                del self.overrides[tenant]

    async def set(self, tenant: str, body: Any) -> LimitsReply:
        """Validate everything first: nothing is applied unless the whole request is valid."""
        try:
            request = parse_limit_request(body)
        except ConfigError as exc:
            return LimitsReply(400, {"error": str(exc)})
        if (unknown := self._unknown(tenant)) is not None:
            return unknown
        async with self._lock:
            if request.persist:
                return await self._persist(tenant, request.typed, frozenset(request.values))
            self.overrides.setdefault(tenant, {}).update(request.values)
            problems = self._write(tenant)
            log.info("tenant %s: limits overridden until elasticd restarts: %s", tenant,
                     ", ".join(f"{k}={v}" for k, v in request.typed.items()))
            return LimitsReply(200, self._reply(tenant, problems, persisted=False))

    async def clear(self, tenant: str, names: str | None) -> LimitsReply:
        """Take overrides away (``names``: the ``limits`` query; None or empty: all of them) and write the
        config's values to the tenant's cgroup at once. The file is never touched: a persisted value is the file's.
        """
        try:
            chosen = parse_clear_request(names)
        except ConfigError as exc:
            return LimitsReply(400, {"error": str(exc)})
        if (unknown := self._unknown(tenant)) is not None:
            return unknown
        async with self._lock:
            remaining, cleared = clear_overrides(self.overrides.get(tenant, {}), chosen)
            if remaining:
                self.overrides[tenant] = remaining
            else:
                self.overrides.pop(tenant, None)
            problems = self._write(tenant) if cleared else []
            if cleared:
                log.info("tenant %s: overrides cleared, back to the config: %s", tenant, ", ".join(cleared))
            body = self._reply(tenant, problems, persisted=False)
            body["cleared"] = cleared
            return LimitsReply(200, body)

    def _unknown(self, tenant: str) -> LimitsReply | None:
        if tenant in self._config().tenants:
            return None
        return LimitsReply(404, {"error": f'no tenant "{tenant}" in the running configuration'})

    async def _persist(self, tenant: str, typed: Mapping[str, Any], attrs: frozenset[str]) -> LimitsReply:
        fields: dict[str, Any] = {k: (v if k == "io_weight" else str(v)) for k, v in typed.items()}
        edit = LimitEdit(**fields)
        try:
            config = self._config()
            file = config.file_of(tenant)
            # A tenant's own file: its lock and backups go aside, where they neither match an include nor stay
            # behind when the tenant is removed.
            aside = None if file == config.source else Path(config.server.state_dir) / "tenant-files"
            result = await asyncio.to_thread(persist_limits, file, tenant, edit, aside=aside)
        except PersistError as exc:
            return LimitsReply(422, {"error": str(exc)})
        # The file carries these now: an override on top would hide a later edit of the file.
        remaining = {k: v for k, v in self.overrides.get(tenant, {}).items() if k not in attrs}
        self.overrides[tenant] = remaining
        log.info("tenant %s: limits persisted to %s (backup %s), reloading", tenant, result.path, result.backup)
        error = await self._reload_as_systemd_would()
        if error:
            return LimitsReply(500, {"error": f"persisted to {result.path}, but the reload failed: {error}"})
        body = self._reply(tenant, [], persisted=True)
        body["backup"] = str(result.backup) if result.backup is not None else None  # None: file already said so
        return LimitsReply(200, body)

    async def _reload_as_systemd_would(self) -> str | None:
        unit = systemd_unit(os.environ)
        if unit is None:
            outcome = await self._reload()
            return None if outcome.ok else (outcome.error or "refused")
        # systemctl runs our ExecReload (elasticctl reload → POST /v1/reload), which this event loop serves
        # while we wait here; nothing is held across the await that the reload needs.
        process = await asyncio.create_subprocess_exec(
            "systemctl", "reload", unit, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await process.communicate()
        if process.returncode != 0:
            return f"systemctl reload {unit} exited {process.returncode}: {output.decode(errors='replace').strip()}"
        return None

    def _reply(self, tenant: str, problems: list[str], *, persisted: bool) -> dict[str, Any]:
        return {"tenant": tenant, "persisted": persisted, "limits": self.describe(tenant), "problems": problems}


def systemd_unit(environ: os._Environ[str] | dict[str, str], proc: str = "/proc") -> str | None:
    """The service unit systemd runs us as, or None outside systemd. INVOCATION_ID is set by systemd for
    every unit it starts; the unit's name is the ``*.service`` component of our cgroup path."""
    if not environ.get("INVOCATION_ID"):
        return None
    try:
        text = Path(proc, "self", "cgroup").read_text()
    except OSError:
        return None
    path = parse_proc_cgroup(text) or ""
    units = [part for part in path.split("/") if part.endswith(".service")]
    return units[-1] if units else None
