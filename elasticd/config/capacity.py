"""The capacity sections of the configuration: a group's ``capacity:`` block, its ``nodes:`` and
``server.registry``. Validation only (the probes themselves are ``elasticd/probes/``): every kind of probe and
every key a kind takes is known here, so a wrong block is refused when the file is read, naming key and line.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Final
from urllib.parse import urlsplit

from elasticd.config.model import PROBE_KINDS, Capacity, Node, Registry
from elasticd.config.walk import (
    Walk,
    absolute_path,
    duration,
    duration_or_zero,
    integer,
    join,
    kind,
    string,
)

__all__ = ["CLASS_RE", "capacity_block", "nodes_list", "registry_section"]

# A custom probe's class: a dotted module path and a class name. Checked before anything is imported, so a
# config cannot name a file path, a relative import or an attribute chain.
CLASS_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
_NODE_NAME_RE: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\[\]-]{0,127}$")
_APP_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}/[a-z0-9][a-z0-9_-]{0,62}$")

_COMMON: Final = ("probe", "type", "interval", "max_age", "limit", "wait")
_KEYS: Final[dict[str, tuple[str, ...]]] = {
    "inflight": _COMMON,
    "ratelimit": _COMMON,
    "prometheus": (*_COMMON, "path", "url", "running", "waiting"),
    "registry": (*_COMMON, "url", "secret_file", "key_file", "app", "max_skew"),
    "custom": (),  # any key: the block goes to the class verbatim
}


def capacity_block(walk: Walk, node: Any, path: str, line: int | None, *, for_node: bool) -> Capacity | None:
    """A ``capacity:`` block (``for_node``: a node's, read over HTTP; else a group's, each worker read on its own
    socket). None for an absent block."""
    if node is None:
        return None
    m = walk.mapping(node, path, line, None)
    if not isinstance(node, dict):
        return None
    if "probe" in m and "type" in m:
        walk.error(f"{path}.type", walk.key_line(m, "type"), "is an alias of probe: give one of them")
    key = "probe" if "probe" in m else "type"
    probe = m.get(key) if m.get(key) is not None else "inflight"  # (null: the default, as for any key)
    if probe not in PROBE_KINDS:
        walk.error(join(path, key), walk.key_line(m, key) or line,
                   f"{kind(probe)} is not a kind of probe (expected one of: {', '.join(PROBE_KINDS)})")
        return None
    probe = "inflight" if probe == "none" else str(probe)
    allowed = _KEYS[probe]
    if allowed:
        for k in m:
            if k not in allowed:
                walk.error(join(path, k), walk.key_line(m, k),
                           f"unknown key for {probe} probes (expected one of: {', '.join(allowed)})")
    d = Capacity()
    capacity = Capacity(
        probe=probe,
        interval=walk.value(m, "interval", path, _positive_duration, d.interval),
        max_age=walk.value(m, "max_age", path, duration_or_zero, d.max_age),
        limit=walk.value(m, "limit", path, integer(1, 1_000_000), None),
        wait=walk.value(m, "wait", path, duration, d.wait),
        block=dict(m),
    )
    if probe == "prometheus":
        url = walk.value(m, "url", path, _url, None)
        if url is not None and not for_node:
            walk.error(f"{path}.url", walk.key_line(m, "url"),
                       "a worker is probed on its own socket: give its path (e.g. /metrics), not a URL")
        return replace(capacity, path=walk.value(m, "path", path, _url_path, d.path), url=url,
                        running=walk.value(m, "running", path, _names, ()),
                        waiting=walk.value(m, "waiting", path, _names, ()))
    if probe == "registry":
        if not for_node:
            walk.error(join(path, key), walk.key_line(m, key) or line,
                       "a registry probe reads another elasticd: it describes a node (nodes:), not a worker")
        url = walk.value(m, "url", path, _url, None)
        secret_file = walk.value(m, "secret_file", path, absolute_path, None)
        for name, value in (("url", url), ("secret_file", secret_file)):
            if value is None and m.get(name) is None:  # (absent or null: a bad value was said already)
                walk.error(f"{path}.{name}", line, "missing: a registry probe needs a url and a secret_file")
        return replace(capacity, url=url, secret_file=secret_file,
                        key_file=walk.value(m, "key_file", path, absolute_path, None),
                        app=walk.value(m, "app", path, _app, None),
                        max_skew=walk.value(m, "max_skew", path, duration, d.max_skew))
    if probe == "custom":
        cls = walk.value(m, "class", path, _class_name, None)
        if cls is None and m.get("class") is None:
            walk.error(f"{path}.class", line, 'missing: a custom probe names its class ("module:Class")')
        return replace(capacity, cls=cls)
    return capacity


def nodes_list(walk: Walk, node: Any, path: str, line: int | None, default: Capacity | None) -> tuple[Node, ...]:
    """``nodes:``: a non-empty list of ``{url, name?, capacity?}``; ``default``: the group's own capacity block,
    for the nodes that have none."""
    if not isinstance(node, list) or not node:
        what = "an empty list" if node == [] else kind(node) if node is not None else "missing"
        walk.error(path, line, f"must be a non-empty list of nodes ({{url: http://HOST:PORT}}), not {what}")
        return ()
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, item in enumerate(node):
        ipath, iline = f"{path}[{i}]", walk.item_line(node, i) or line
        m = walk.mapping(item, ipath, iline, ("url", "name", "capacity"))
        if not isinstance(item, dict):
            continue
        url = walk.value(m, "url", ipath, _node_url, None)
        if url is None:
            if m.get("url") is None:
                walk.error(f"{ipath}.url", iline, "missing: a node is an HTTP upstream (url: http://HOST:PORT)")
            continue
        host, port, text = url
        name = walk.value(m, "name", ipath, _node_name, None) or _address(host, port)
        if name in seen:
            walk.error(f"{ipath}.name" if "name" in m else f"{ipath}.url", walk.key_line(m, "name") or iline,
                       f'"{name}" names two nodes of the group (give each a name:)')
            continue
        seen.add(name)
        capacity = capacity_block(walk, m.get("capacity"), f"{ipath}.capacity", walk.key_line(m, "capacity"),
                                  for_node=True)
        nodes.append(Node(name, host, port, text, capacity if capacity is not None else default))
    return tuple(nodes)


def registry_section(walk: Walk, server: dict[Any, Any]) -> Registry | None:
    """``server.registry: {secret_file, ttl, key_file, instance}``. The secret's length is checked where it is
    read (the daemon, at start and at each reload: a refused secret refuses the reload)."""
    if server.get("registry") is None:
        return None
    line = walk.key_line(server, "registry")
    m = walk.mapping(server["registry"], "server.registry", line, ("secret_file", "ttl", "key_file", "instance"))
    if not isinstance(server["registry"], dict):
        return None
    secret_file = walk.value(m, "secret_file", "server.registry", absolute_path, None)
    if secret_file is None:
        if m.get("secret_file") is None:
            walk.error("server.registry.secret_file", line, "missing: the registry is signed with a secret")
        return None
    return Registry(secret_file, ttl=walk.value(m, "ttl", "server.registry", _positive_duration, 10.0),
                    key_file=walk.value(m, "key_file", "server.registry", absolute_path, None),
                    instance=walk.value(m, "instance", "server.registry", _instance, None))


# --------------------------------------------------------------------------------------------- scalars


def _positive_duration(value: Any) -> float:
    seconds = duration(value)
    if seconds <= 0:
        raise ValueError(f"{kind(value)} must be more than 0")
    return seconds


def _url(value: Any) -> str:
    text = string(value).strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f'"{text}" is not an http:// or https:// URL')
    try:
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError:
        raise ValueError(f'"{text}" has no valid port') from None
    return text


def _url_path(value: Any) -> str:
    text = string(value)
    if not text.startswith("/") or any(c in text for c in " \r\n\t\0#"):
        raise ValueError(f'"{text}" is not a URL path (starting with /, no spaces)')
    return text


def _node_url(value: Any) -> tuple[str, int, str]:
    text = string(value).strip()
    parts = urlsplit(text)
    if parts.scheme == "https":
        raise ValueError(f'"{text}": the front speaks plain HTTP to its upstreams (put TLS in front of the node, '
                         "or reach it over a private network)")
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f'"{text}" is not http://HOST:PORT')
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f'"{text}": a node is a host and a port (requests keep their own path)')
    try:
        port = parts.port or 80
    except ValueError:
        raise ValueError(f'"{text}" has no valid port') from None
    return parts.hostname, port, f"http://{_address(parts.hostname, port)}"


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _node_name(value: Any) -> str:
    text = string(value)
    if not _NODE_NAME_RE.match(text):
        raise ValueError(f'"{text}" is not a node name (letters, digits, ".", ":", "_", "-"; at most 128)')
    return text


def _names(value: Any) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(v, str) and v.strip() for v in items):
        raise ValueError(f"{kind(value)} is not a metric name or a list of them")
    return tuple(str(v).strip() for v in items)


def _app(value: Any) -> str:
    text = string(value)
    if not _APP_RE.match(text):
        raise ValueError(f'"{text}" is not TENANT/APP')
    return text


def _class_name(value: Any) -> str:
    text = string(value)
    if not CLASS_RE.match(text):
        raise ValueError(f'"{text}" is not a class name ("package.module:Class")')
    return text


def _instance(value: Any) -> str:
    text = string(value)
    if not text or not text.isprintable() or len(text) > 253:
        raise ValueError(f'"{text}" is not an instance name (printable, at most 253 characters)')
    return text

