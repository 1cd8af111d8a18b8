"""What an operator is told about a configuration that is valid but deserves a word, with no I/O: tenants whose
isolation is weak, and server keys a running daemon takes over only at its next start."""

from __future__ import annotations

from elasticd.config.model import Config

__all__ = ["RESTART_ONLY_KEYS", "UNIT_STOP_TIMEOUT", "balancer_warnings", "few", "isolation_warnings",
           "restart_only_changes"]

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


# A condition met by many tenants is one line: its count and the first few names (a host of 2,000 tenants
# without user: was 2,000 lines at each start).
FEW = 5


def few(names: list[str]) -> str:
    """The first FEW names, and how many more: "a, b, c, d, e and 995 more"."""
    shown = ", ".join(names[:FEW])
    return shown if len(names) <= FEW else f"{shown} and {len(names) - FEW} more"


def isolation_warnings(config: Config) -> list[str]:
    """What an operator must hear about tenants' isolation: tenants running as root, tenants with a user but no
    view of their own, tenants sharing a user. One line per condition, however many tenants meet it."""
    warnings = []
    as_root = [t.name for t in config.tenants.values() if t.run_as is None or t.run_as.uid == 0]
    if len(as_root) == 1:
        warnings.append(f"tenant {as_root[0]} runs as root: its workers can undo their own limits (give it a user:)")
    elif as_root:
        warnings.append(f"{len(as_root)} tenants run as root: {few(as_root)}: their workers can undo their own "
                        "limits (give each a user:)")
    open_view = [t.name for t in config.tenants.values()
                 if t.run_as is not None and t.run_as.uid != 0 and t.isolation is None]
    if open_view:
        who = (f"tenant {open_view[0]} is not isolated (isolation: {{enabled: false}})" if len(open_view) == 1 else
               f"{len(open_view)} tenants are not isolated (isolation: {{enabled: false}}): {few(open_view)}")
        warnings.append(f"{who}: their workers see every other tenant's world-readable files and every process of "
                        "the host, and share the host's /tmp")
    by_uid: dict[int, list[str]] = {}
    users: dict[int, str] = {}
    for tenant in config.tenants.values():
        if tenant.run_as is not None and tenant.run_as.uid != 0:
            by_uid.setdefault(tenant.run_as.uid, []).append(tenant.name)
            users[tenant.run_as.uid] = tenant.run_as.user
    shared = [(uid, names) for uid, names in by_uid.items() if len(names) > 1]  # (isolated or not: one uid)
    if len(shared) == 1:
        uid, names = shared[0]
        warnings.append(f"tenants {few(names)} share the user {users[uid]} (uid {uid}): they can signal each other's "
                        "workers and read each other's files")
    elif shared:
        cases = [f"{users[uid]} (uid {uid}) by {few(names)}" for uid, names in shared]
        shown = "; ".join(cases[:FEW]) + (f"; and {len(cases) - FEW} more users" if len(cases) > FEW else "")
        warnings.append(f"{len(shared)} users are each shared by several tenants: {shown}: tenants sharing a user "
                        "can signal each other's workers and read each other's files")
    return warnings


def restart_only_changes(old: Config, new: Config) -> list[str]:
    """Server keys a reload changed that a running daemon cannot take over: said once, applied at the next start."""
    return [f"server.{key} changed: it takes effect when elasticd restarts"
            for key in RESTART_ONLY_KEYS if getattr(old.server, key) != getattr(new.server, key)]
