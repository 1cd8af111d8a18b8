"""elasticd's own crash under load: SIGKILL of the daemon while clients send requests flat out and a logged-in user
holds in-process state, then a start as systemd's restart does it (the tests' notify socket keeps the store: the
front's socket and the state's memfd, passed back as LISTEN_FDS; RestartSec= is not waited).

    .venv/bin/python benchmarks/crash_bench.py [--workers 4] [--clients 4] [--seconds 3] [--repo PATH]

Two runs: with the keeper in a process of its own (as elasticd-keeper.service runs it: ``--keeper SOCKET``), and
with elasticd's own keeper, tied to its life (what a start without ``--keeper`` does, and what every worker was
before the keeper: elasticd's child, killed with it). ``--repo``: run the daemon of another checkout (the "before";
it runs the second way only, having no keeper). Per run it prints: the time from the kill to the first answer of the
new instance, the requests answered and failed (by kind: refused, reset, 5xx…), the workers kept (the same pids),
and the user's counter (kept: it goes on; lost: it starts again at 1).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from harness import PYTHON, Daemon, browse  # noqa: E402

APP = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {{min_workers: {workers}, max_workers: {workers}}}
"""


class Clients:
    def __init__(self, d: Daemon, count: int) -> None:
        self.d = d
        self.stop = threading.Event()
        self.outcomes: list[tuple[float, str]] = []
        self.threads = [threading.Thread(target=self._run) for _ in range(count)]

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                code, _, _ = browse(self.d, "/")
                kind = str(code)
            except ConnectionRefusedError:
                kind = "refused"
            except ConnectionResetError:
                kind = "reset"
            except (OSError, http.client.HTTPException) as error:
                kind = type(error).__name__
            self.outcomes.append((time.monotonic(), kind))

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)


def _pids(d: Daemon) -> set[int]:
    return {w["pid"] for w in d.workers("acme", "shop", "green") if w["state"] == "running"}


def _counter(d: Daemon, cookie: str) -> int:
    code, body, _ = browse(d, "/counter", cookie)
    return json.loads(body)["count"] if code == 200 else -1


def run(args: argparse.Namespace, with_keeper: bool, repo: Path) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="crash-") as tmp:
        where = Path(tmp)
        keeper = None
        daemon_args: tuple[str, ...] = ()
        env = {**os.environ, "PYTHONPATH": str(repo)}
        if with_keeper:
            path = where / "keeper" / "keeper.sock"
            keeper = subprocess.Popen([PYTHON, "-m", "elasticd.keeper", "--socket", str(path), "--orphan-bound", "60"],
                                      env=env, stderr=subprocess.DEVNULL)
            while not path.exists():
                time.sleep(0.02)
            daemon_args = ("--keeper", str(path))
        os.environ["PYTHONPATH"] = str(repo)  # (the harness starts the daemon with this process's environment)
        d = Daemon(where, APP.format(root=where, workers=args.workers), args=daemon_args)
        try:
            d.start()
            deadline = time.monotonic() + 60
            while len(_pids(d)) < args.workers:
                assert time.monotonic() < deadline, "the workers did not start"
                time.sleep(0.1)
            before = _pids(d)
            _, _, cookie = browse(d, "/")
            browse(d, "/login?name=ada", cookie)
            for _ in range(3):
                _counter(d, cookie)
            time.sleep(1.5)  # (the kept state is written at most once a second)
            with Clients(d, args.clients) as clients:
                time.sleep(args.seconds)
                killed = time.monotonic()
                d.crash()
                time.sleep(args.seconds)
            first = min((at for at, kind in clients.outcomes if at > killed and kind == "200"), default=None)
            deadline = time.monotonic() + 60
            while len(_pids(d)) < args.workers and time.monotonic() < deadline:
                time.sleep(0.1)
            after = _pids(d)
            failed: dict[str, int] = {}
            for _, kind in clients.outcomes:
                if kind != "200":
                    failed[kind] = failed.get(kind, 0) + 1
            return {"serving_again": None if first is None else first - killed,
                    "answered": sum(1 for _, kind in clients.outcomes if kind == "200"), "failed": failed,
                    "kept": len(before & after), "workers": len(before), "counter": _counter(d, cookie)}
        finally:
            d.stop()
            d.kill_leftovers()
            if keeper is not None:
                keeper.send_signal(signal.SIGTERM)
                keeper.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0, help="load before the kill, and after it")
    parser.add_argument("--repo", type=Path, default=REPO, help="the checkout whose daemon runs (the before)")
    args = parser.parse_args()
    runs = [("keeper in its own unit", True), ("own keeper (tied to elasticd)", False)]
    if args.repo != REPO:
        runs = [("that checkout's elasticd (its workers its children, or its own keeper's)", False)]
    print(f"{args.workers} workers, {args.clients} clients flat out, SIGKILL of elasticd {args.seconds:g}s in, "
          f"then a start with the store's descriptors ({args.repo})")
    for name, with_keeper in runs:
        result = run(args, with_keeper, args.repo.resolve())
        again = result["serving_again"]
        print(f"  {name}:")
        print(f"    serving again after   {again * 1000:.0f} ms" if isinstance(again, float) else
              "    serving again after   never")
        print(f"    requests              {result['answered']} answered, failed: {result['failed'] or 'none'}")
        print(f"    workers kept          {result['kept']} of {result['workers']} (the same pids)")
        print(f"    the user's counter    {result['counter']} (4: kept; 1: its state lost)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
