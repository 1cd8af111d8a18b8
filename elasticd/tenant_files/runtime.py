"""The daemon's side of ``PUT|GET|DELETE /v1/tenants/{tenant}/config``: one change at a time, validated against the
whole configuration before anything is written, written whole (store.py), then applied as a reload of that one
file (the parse cache keeps every other file's tenants, and only the changed tenant's cgroup files are written).

The order, and why:
1. The body is read and shaped (document.py): a bad body is a 400 and touches nothing.
2. Under the daemon's reload lock (so no reload, limit --persist or other panel call interleaves):
   a. the tenant may not be defined in another file (409, naming it), nor already exist for ``add`` (409);
   b. the whole configuration is loaded as it would be with this file changed (the loader's overlay): invalid is
      a 422 with every error, file and line, and nothing written;
   c. the file is written (or removed), its old text kept aside;
   d. the configuration is loaded again from disk and applied; should that fail (another file edited by hand in
      between), the file is put back as it was, and the running configuration stays.
A remove's workers are drained and stopped, and its cgroups removed, by the reload that applies it (in the
background: the reply says how many are stopping).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from elasticd.config.model import Config
from elasticd.config.walk import ConfigError, ConfigIssue
from elasticd.tenant_files.document import BodyError, check_name, parse_body, tenant_file_name, tenant_text
from elasticd.tenant_files.store import remove_file, restore, write_file

__all__ = ["TenantChange", "TenantFiles", "TenantReply"]

log = logging.getLogger("elasticd.tenants")


@dataclass(slots=True)
class TenantReply:
    status: int
    body: dict[str, Any]


@dataclass(slots=True)
class TenantChange:
    """One tenant's file, as a panel wants it: ``text`` None removes it."""

    tenant: str
    path: Path
    text: str | None
    aside: Path
    create_only: bool = False
    offset: int | None = None  # the lines before the body in ``text`` (its errors name the body's own lines)
    backup: Path | None = None
    existed: bool = field(default=False)

    def conflict(self, config: Config) -> tuple[int, str] | None:
        """Why the running configuration refuses this change before it is validated: (status, reason)."""
        defined = config.tenants.get(self.tenant)
        file = config.file_of(self.tenant) if defined is not None else None
        if file is not None and Path(file) != self.path:
            return 409, (f"tenant {self.tenant} is defined in {file}, not in its own file {self.path}: change it "
                         "there (or move it to its own file, then reload)")
        if self.create_only and (defined is not None or self.path.exists()):
            return 409, f"tenant {self.tenant} exists already ({self.path}): elasticctl tenant set replaces it"
        if self.text is None and defined is None:
            return 404, f'no tenant "{self.tenant}" in the running configuration'
        return None

    def commit(self) -> None:
        self.existed = self.path.exists()
        if self.text is None:
            self.backup = remove_file(self.path, self.aside)
        else:
            self.backup = write_file(self.path, self.text, self.aside)

    def in_body(self, error: ConfigError) -> str:
        """The loader's errors, those of this file naming the body's own lines ("the body sent, line N")."""
        said = []
        for issue in error.issues:
            if issue.file == str(self.path) and self.offset is not None and issue.line is not None \
                    and issue.line > self.offset:
                issue = ConfigIssue(issue.path, issue.line - self.offset, issue.message,
                                    f"the body sent for {self.path}")
            said.append(str(issue))
        return "\n".join(said)

    def undo(self) -> None:
        restore(self.path, self.backup if self.existed else None)


class TenantFiles:
    """``apply(change)``: the daemon's reload with that change (returns a ReloadResult-shaped outcome)."""

    __slots__ = ("_apply", "_config", "_workers_of")

    def __init__(self, config: Callable[[], Config], apply: Callable[[TenantChange], Awaitable[Any]],
                 workers_of: Callable[[str], int]) -> None:
        self._config = config
        self._apply = apply
        self._workers_of = workers_of

    def _change(self, tenant: str, text: str | None, create_only: bool = False) -> TenantChange | TenantReply:
        server = self._config().server
        if server.tenant_config_dir is None:
            return TenantReply(409, {"error": "server.tenant_config_dir is not set: elasticd manages no tenant file "
                                              "(set it, with an include: that covers it, and reload)"})
        path = Path(server.tenant_config_dir) / tenant_file_name(tenant)
        return TenantChange(tenant, path, text, Path(server.state_dir) / "tenant-files", create_only)

    async def put(self, tenant: str, raw: bytes, content_type: str, create_only: bool) -> TenantReply:
        try:
            check_name(tenant)
            body = parse_body(raw, content_type)
        except BodyError as exc:
            return TenantReply(400, {"error": str(exc)})
        how = "elasticctl tenant add" if create_only else "elasticctl tenant set"
        text, offset = tenant_text(tenant, raw, body, how)
        change = self._change(tenant, text, create_only)
        if isinstance(change, TenantReply):
            return change
        change.offset = offset
        outcome = await self._apply(change)
        if not outcome.ok:
            return TenantReply(outcome.status, {"error": outcome.error, "problems": outcome.problems})
        log.info("tenant %s: %s %s (backup %s)", tenant, "written to" if change.existed else "created in", change.path,
                 change.backup)
        return TenantReply(200 if change.existed else 201, {
            "tenant": tenant, "file": str(change.path), "created": not change.existed,
            "backup": str(change.backup) if change.backup is not None else None,
            "applied": {"cgroups_written": outcome.written, "problems": outcome.problems}})

    async def delete(self, tenant: str) -> TenantReply:
        try:
            check_name(tenant)
        except BodyError as exc:
            return TenantReply(400, {"error": str(exc)})
        change = self._change(tenant, None)
        if isinstance(change, TenantReply):
            return change
        stopping = self._workers_of(tenant)
        outcome = await self._apply(change)
        if not outcome.ok:
            return TenantReply(outcome.status, {"error": outcome.error, "problems": outcome.problems})
        log.info("tenant %s: removed (its file %s, backup %s); %d workers draining", tenant, change.path,
                 change.backup, stopping)
        return TenantReply(200, {"tenant": tenant, "removed": str(change.path),
                                 "backup": str(change.backup) if change.backup is not None else None,
                                 "workers_stopping": stopping,
                                 "applied": {"problems": outcome.problems}})

    async def get(self, tenant: str) -> TenantReply:
        config = self._config()
        if tenant not in config.tenants:
            return TenantReply(404, {"error": f'no tenant "{tenant}" in the running configuration'})
        file = config.file_of(tenant)
        managed = config.server.tenant_config_dir is not None and \
            Path(file) == Path(config.server.tenant_config_dir) / tenant_file_name(tenant)
        try:
            doc = await asyncio.to_thread(_read_yaml, file)
            mapping = doc["tenants"][tenant]
        except (OSError, KeyError, TypeError, ValueError) as exc:
            return TenantReply(409, {"error": f"{file} no longer holds tenant {tenant} as loaded ({exc}): reload"})
        return TenantReply(200, {"tenant": tenant, "file": file, "managed": managed, "config": mapping})


def _read_yaml(path: str) -> Any:
    with open(path, encoding="utf-8") as handle:
        return YAML(typ="safe", pure=True).load(handle)
