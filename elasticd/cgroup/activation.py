"""The daemon's cgroup side: claim the base, keep every tenant's and app's cgroup in line with the config,
and remove what the config no longer names once it is empty.

The decisions are elsewhere and pure (``mode.decide``, ``limits.limit_writes``); this module sequences the
tree's I/O over a config. With enforcement off it answers every call with a no-op, so the daemon does not
ask "are cgroups enforced?" at each step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from elasticd.cgroup.mode import ModeDecision, decide, probe
from elasticd.cgroup.tree import CgroupTree
from elasticd.config.model import CgroupSettings, Config, Resources

__all__ = ["Activation", "CgroupRefused"]

log = logging.getLogger("elasticd.cgroup")


def _configured(config: Config, tenant: str, app: str) -> bool:
    return tenant in config.tenants and app in config.tenants[tenant].apps


class CgroupRefused(Exception):
    """``cgroups.mode: required`` and the base cannot be used: elasticd must not start."""


class Activation:
    __slots__ = ("base", "decision", "tree")

    def __init__(self) -> None:
        self.tree: CgroupTree | None = None
        self.decision: ModeDecision | None = None
        self.base: str | None = None

    @property
    def enforced(self) -> bool:
        return self.tree is not None

    def claim(self, settings: CgroupSettings, keeper_base: str | None = None,
              keeper_refused: str | None = None) -> None:
        """Probe the base, decide by the mode, and set it up (moving elasticd to <base>/server when the base
        is its own cgroup; ``keeper_base``: the keeper's unit's cgroup, the base unless the configuration names one).
        Raises CgroupRefused when the mode is ``required`` and it cannot be done."""
        found = probe(settings, keeper_base=keeper_base, keeper_refused=keeper_refused)
        decision = decide(settings.mode, found)
        self.decision = decision
        self.base = str(found.base) if found.base is not None else None
        if decision.refuse:
            raise CgroupRefused(decision.refuse)
        if decision.warning:
            log.warning("%s", decision.warning)
        if not decision.enforce:
            return
        assert found.base is not None
        tree = CgroupTree(found.base, found.base_is_own)
        try:
            tree.setup()
        except OSError as exc:
            message = f"cannot set up the cgroup base {found.base}: {exc}"
            if settings.mode == "required":
                raise CgroupRefused(message) from None
            log.warning("%s; serving without enforcement", message)
            self.decision = ModeDecision(enforce=False, refuse=None, warning=message)
            return
        self.tree = tree
        log.info("cgroups enforced under %s", found.base)

    def tenants_by_cgroup(self) -> dict[int, str]:
        """The tenant of each group and leaf made, by cgroup id (empty when cgroups are not enforced)."""
        return self.tree.tenant_by_cgroup_id if self.tree is not None else {}

    def leaf(self, tenant: str, app: str) -> str | None:
        return str(self.tree.leaf(tenant, app)) if self.tree is not None else None

    def write(self, config: Config, resources_of: Callable[[str], Resources],
              only: Collection[str] | None = None) -> list[str]:
        """Create the leaves and write the limits of every tenant, or of ``only`` these (a reload's changed ones:
        config/changes.py), so a reload changes them in place."""
        tree = self.tree
        if tree is None:
            return []
        problems: list[str] = []
        for tenant in config.tenants.values():
            if only is not None and tenant.name not in only:
                continue
            try:
                tree.ensure_tenant(tenant.name)
                for app in tenant.apps.values():
                    tree.ensure_app(tenant.name, app.name, tenant_ready=True)
            except OSError as exc:
                problems.append(f"tenant {tenant.name}: cannot create its cgroups: {exc}")
                continue
            problems.extend(tree.apply_limits(tenant.name, resources_of(tenant.name),
                                              [app.root for app in tenant.apps.values()], tenant_ready=True))
        return problems

    def controllers(self, config: Config, only: Collection[str] | None = None) -> dict[str, frozenset[str]]:
        """Per tenant (or ``only`` these: the ones an activation wrote), the controllers its group has (whose
        limits the kernel enforces there)."""
        tree = self.tree
        if tree is None:
            return {}
        return {name: tree.controllers_of(name) for name in config.tenants if only is None or name in only}

    def write_tenant(self, config: Config, tenant: str, resources: Resources) -> list[str]:
        if self.tree is None:
            return ["cgroups are not enforced: the limits are recorded but no kernel file was written"]
        return self.tree.apply_limits(tenant, resources, [app.root for app in config.tenants[tenant].apps.values()])

    async def remove_dropped(self, old: Config, current: Callable[[], Config],
                             busy: Callable[[str, str], bool] = lambda tenant, app: False, retry: float = 0.25,
                             max_retry: float = 5.0) -> None:
        """After their workers are gone: the leaves of removed apps, then the groups of removed tenants. An
        rmdir refused with EBUSY (a process still on its way out) is retried, with backoff, until it succeeds.
        An app configured again meanwhile (``current()``, read before each leaf), or whose leaf still holds a
        worker of ours (``busy``), is left alone: its leaf is not killed, nor removed."""
        tree = self.tree
        if tree is None:
            return
        delay = retry
        while True:
            pending = False
            for tenant, app in old.apps():
                if _configured(current(), tenant.name, app.name) or busy(tenant.name, app.name):
                    continue
                await self.drain_leaf(tenant.name, app.name)
                if not _configured(current(), tenant.name, app.name):  # drain_leaf waited: look again
                    pending = not tree.remove_app(tenant.name, app.name) or pending
            for name in old.tenants:
                if name not in current().tenants and not any(busy(name, app) for app in old.tenants[name].apps):
                    pending = not tree.remove_tenant(name) or pending
            if not pending:
                return
            await asyncio.sleep(delay)
            delay = min(delay * 2, max_retry)

    async def remove_stale(self, config: Config) -> None:
        """At start: groups an earlier run left for tenants or apps no longer configured."""
        tree = self.tree
        if tree is None:
            return
        for tenant in tree.inner_tenants():
            known = config.tenants.get(tenant)
            for app in tree.inner_apps(tenant):
                if known is None or app not in known.apps:
                    await self.drain_leaf(tenant, app)
                    tree.remove_app(tenant, app)
            if known is None:
                tree.remove_tenant(tenant)

    async def drain_leaf(self, tenant: str, app: str, timeout: float = 5.0) -> None:
        """Kill whatever a worker left behind in its leaf (a daemonised grandchild) and wait for the leaf to
        empty: cgroup.kill is asynchronous, and a populated cgroup cannot be removed (EBUSY)."""
        if self.tree is None or not self.tree.kill_leaf(tenant, app):
            return
        deadline = time.monotonic() + timeout
        while self.tree.populated(tenant, app) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    async def drain_all(self, config: Config) -> None:
        await asyncio.gather(*(self.drain_leaf(t.name, a.name) for t, a in config.apps()))

    def sampler_targets(self, config: Config) -> dict[tuple[str, ...], str]:
        if self.tree is None:
            return {}
        # (Joined as strings: the names are the validated config's, and 12,000 pathlib joins were a tenth of a
        # reload of 10,000 apps.)
        base = str(self.tree.tenants_dir)
        targets: dict[tuple[str, ...], str] = {}
        for tenant in config.tenants.values():
            directory = f"{base}/{tenant.name}"
            targets[("tenant", tenant.name)] = directory
            for app in tenant.apps.values():
                targets[("app", tenant.name, app.name)] = f"{directory}/{app.name}"
        return targets

    def describe(self, mode: str) -> dict[str, Any]:
        return {
            "mode": mode,
            "enforced": self.tree is not None,
            "base": self.base,
            "missing_controllers": list(self.tree.missing) if self.tree is not None else [],
            "warning": self.decision.warning if self.decision is not None else None,
        }
