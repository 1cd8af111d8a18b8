"""The one factory (seed 001 ``for_node``): a capacity block → the probe it asks for, or none.

``inflight`` (the default, also ``none`` and no block) is no probe object at all: admission then reads the
open-request count, the default path rather than a probe that reports the same thing. ``ratelimit`` is passive
(read off the 429 answers the front relays) and needs nothing running either. The config already refused an
unknown kind and a custom block naming no valid class (``config/capacity.py``); what can still fail is the build
itself (a module that does not import, a class that is no ``Probe``, a secret file that cannot be read): that is
a ``ProbeError``, and the caller skips that one probe with a warning while the others start.
"""

from __future__ import annotations

import importlib
from typing import Any

from elasticd.config.capacity import CLASS_RE
from elasticd.config.model import Capacity
from elasticd.probes.kinds import PrometheusProbe, RegistryProbe
from elasticd.probes.probe import Probe, ProbeSink, ProbeTarget

__all__ = ["BUILT_IN", "ProbeError", "build_probe", "probe_class"]

BUILT_IN: dict[str, type[Probe] | None] = {
    "inflight": None,
    "none": None,
    "ratelimit": None,
    "prometheus": PrometheusProbe,
    "registry": RegistryProbe,
}


class ProbeError(Exception):
    """A probe that cannot be built (its block passed the config's checks)."""


def probe_class(config: Capacity) -> type[Probe] | None:
    """The class a block asks for; None for no probe object. ProbeError for an unknown kind or a custom class
    that cannot be loaded."""
    if config.probe in BUILT_IN:
        return BUILT_IN[config.probe]
    if config.probe != "custom":
        raise ProbeError(f"{config.probe!r} is not a kind of probe")
    name = config.cls or ""
    if not CLASS_RE.match(name):  # (checked again before any import: the model may not come from a file)
        raise ProbeError(f"{name!r} is not a class name (\"package.module:Class\")")
    module_name, _, class_name = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import runs the module: anything can fail in it
        raise ProbeError(f"custom probe {name}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, class_name, None)
    if cls is Probe:
        raise ProbeError(f"custom probe {name}: that is the base class, which polls nothing: name a subclass")
    if not isinstance(cls, type) or not issubclass(cls, Probe):
        raise ProbeError(f"custom probe {name}: {class_name} in {module_name} is not a subclass of "
                         "elasticd.probes.probe.Probe")
    return cls


def build_probe(target: ProbeTarget, config: Capacity, sink: ProbeSink, **options: Any) -> Probe | None:
    """The probe ``config`` asks for, built for ``target`` (not started); None when it asks for none."""
    cls = probe_class(config)
    if cls is None:
        return None
    try:
        return cls(target, config, sink, **options)
    except ProbeError:
        raise
    except Exception as exc:  # a secret file that cannot be read, a custom class's constructor
        raise ProbeError(f"{type(exc).__name__}: {exc}" if not isinstance(exc, ValueError) else str(exc)) from None
