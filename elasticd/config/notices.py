"""What an operator is told about a configuration that is valid but deserves a word, with no I/O: tenants whose
isolation is weak, and server keys a running daemon takes over only at its next start."""

from __future__ import annotations

from elasticd.config.model import Config

__all__ = ["RESTART_ONLY_KEYS", "UNIT_STOP_TIMEOUT", "balancer_warnings", "isolation_warnings", "restart_only_changes"]

UNIT_STOP_TIMEOUT = 60.0  # packaging/systemd/elasticd.service's TimeoutStopSec

# Server keys a running daemon cannot take over in place (its sockets, its cgroup base, its sampler's tick).
RESTART_ONLY_KEYS = ("listen", "metrics_listen", "admin_socket", "admin_group", "runtime_dir", "cgroups",
                     "sample_interval", "agent_listen")


def balancer_warnings(config: Config) -> list[str]:
    """A stop_drain nothing hears, or one the unit's stop timeout does not leave room for."""
    server = config.server
    if server.stop_drain <= 0:
        return []
    if server.agent_listen is None:
        return ["server.stop_drain is set without server.agent_listen: no balancer hears the drain, so a stop does "
                "not wait for it"]
    # A stop takes at most the drain, the front's grace and the workers' (each stop_timeout).
    if server.stop_drain + 2 * server.stop_timeout >= UNIT_STOP_TIMEOUT:
        return [f"server.stop_drain ({server.stop_drain:g}s) and twice stop_timeout ({server.stop_timeout:g}s: the "
                f"front's grace, then the workers') are not under the shipped unit's TimeoutStopSec "
                f"({UNIT_STOP_TIMEOUT:g}s): systemd may kill elasticd before its workers stop (unless a drop-in "
                "raised it)"]
    return []


def isolation_warnings(config: Config) -> list[str]:
    """What an operator must hear about tenants' isolation: one running as root, one with a user but no view of its
    own, two sharing a user."""
    warnings = [f"tenant {t.name} runs as root: its workers can undo their own limits (give it a user:)"
                for t in config.tenants.values() if t.run_as is None or t.run_as.uid == 0]
    warnings += [f"tenant {t.name} is not isolated (isolation: {{enabled: false}}): its workers see every other "
                 "tenant's world-readable files and every process of the host, and share the host's /tmp"
                 for t in config.tenants.values() if t.run_as is not None and t.run_as.uid != 0 and t.isolation is None]
    by_uid: dict[int, list[str]] = {}
    users: dict[int, str] = {}
    for tenant in config.tenants.values():
        if tenant.run_as is not None and tenant.run_as.uid != 0:
            by_uid.setdefault(tenant.run_as.uid, []).append(tenant.name)
            users[tenant.run_as.uid] = tenant.run_as.user
    for uid, names in by_uid.items():  # (each isolated or not: a uid is one to the kernel)
        if len(names) > 1:
            warnings.append(f"tenants {', '.join(names)} share the user {users[uid]} (uid {uid}): they can signal "
                            "each other's workers and read each other's files")
    return warnings


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """Server keys a reload changed that a running daemon cannot take over: said once, applied at the next start."""
    return [f"server.{key} changed: it takes effect when elasticd restarts"
            for key in RESTART_ONLY_KEYS if getattr(old.server, key) != getattr(new.server, key)]
