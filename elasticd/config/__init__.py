"""The configuration: a YAML file in, a validated immutable model out.

- ``model``: the immutable dataclasses every part of elasticd reads;
- ``units``: sizes, CPU percentages and durations as operators write them;
- ``walk``: issues with key path and line, and the scalar readers;
- ``load``: the sections, ``parse_config`` and ``load_config``;
- ``checks``: checks across the whole document (domains, socket paths, app roots).

Validation is pure (text in, model or ``ConfigError`` out) and reports every problem of a file at once, each
naming its key path and line. Reload and ``--check`` go through the same function, so "valid" means one thing.
Cores import ``elasticd.config.model`` (no YAML library); this package's names are for the shells.
"""

from elasticd.config.checks import root_refusal
from elasticd.config.load import NAME_RE, RESOURCE_FIELDS, ResourceField, load_config, parse_config
from elasticd.config.model import (
    Address,
    App,
    CgroupSettings,
    Config,
    Group,
    PoolSettings,
    Quotas,
    Resources,
    RunAs,
    Server,
    Tenant,
)
from elasticd.config.walk import ConfigError, ConfigIssue

__all__ = ["NAME_RE", "RESOURCE_FIELDS", "Address", "App", "CgroupSettings", "Config", "ConfigError", "ConfigIssue",
           "Group", "PoolSettings", "Quotas", "ResourceField", "Resources", "RunAs", "Server", "Tenant", "load_config",
           "parse_config", "root_refusal"]
