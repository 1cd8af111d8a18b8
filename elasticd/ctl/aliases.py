"""The ADR-0010 aliases: each is an elasticctl command with its value in place (elastic-limitcpu acme 50% is
elasticctl limit acme --cpu 50%)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from .client import DEFAULT_SOCKET
from .commands import main

__all__ = ["highcpu_main", "highio_main", "highram_main", "limitcpu_main", "limitio_main", "limitram_main"]


def _alias(prog: str, value_help: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--socket", default=os.environ.get("ELASTIC_ADMIN_SOCKET", DEFAULT_SOCKET))
    p.add_argument("--persist", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("tenant")
    if value_help:
        p.add_argument("value", help=value_help)
    return p


def _common(args: argparse.Namespace) -> list[str]:
    return [*(["--persist"] if args.persist else []), *(["--json"] if args.json else [])]


def limitcpu_main(argv: list[str] | None = None) -> int:
    args = _alias("elastic-limitcpu", 'percent of one CPU, e.g. 50%%, or "max"').parse_args(argv)
    return main(["--socket", args.socket, "limit", args.tenant, "--cpu", args.value, *_common(args)])


def limitram_main(argv: list[str] | None = None) -> int:
    args = _alias("elastic-limitram", 'bytes with K/M/G/T, e.g. 1G, or "max"').parse_args(argv)
    return main(["--socket", args.socket, "limit", args.tenant, "--memory", args.value, *_common(args)])


def limitio_main(argv: list[str] | None = None) -> int:
    p = _alias("elastic-limitio", None)
    p.add_argument("--read", metavar="RATE")
    p.add_argument("--write", metavar="RATE")
    p.add_argument("--weight", type=int, metavar="N")
    args = p.parse_args(argv)
    extra = [*(["--io-read", args.read] if args.read else []), *(["--io-write", args.write] if args.write else []),
             *(["--io-weight", str(args.weight)] if args.weight is not None else [])]
    if not extra:
        p.error("give at least one of --read, --write, --weight")
    return main(["--socket", args.socket, "limit", args.tenant, *extra, *_common(args)])


def _high_alias(sort: str) -> Callable[[list[str] | None], int]:
    def run(argv: list[str] | None = None) -> int:
        p = argparse.ArgumentParser(prog=f"elastic-high{dict(cpu='cpu', memory='ram', io='io')[sort]}")
        p.add_argument("--socket", default=os.environ.get("ELASTIC_ADMIN_SOCKET", DEFAULT_SOCKET))
        p.add_argument("--interval-ms", dest="interval_ms", default="1000", metavar="N")
        p.add_argument("--apps", action="store_true")
        p.add_argument("--json", action="store_true")
        args = p.parse_args(argv)
        extra = [*(["--apps"] if args.apps else []), *(["--json"] if args.json else [])]
        return main(["--socket", args.socket, "high", "--sort", sort, "--interval-ms", args.interval_ms, *extra])
    return run


highcpu_main = _high_alias("cpu")
highram_main = _high_alias("memory")
highio_main = _high_alias("io")
