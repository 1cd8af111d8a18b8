"""A worker that tells what it sees of the host: tests/test_isolation.py runs it as an isolated tenant.

GET / answers JSON: the pids in /proc, and for each path in $PROBE_PATHS (colon-separated) whether it exists, can be
read (a file opened, a directory listed) and can be written (a file made in it, or the file opened for writing). It
also leaves a marker in /tmp. On SIGTERM it writes ``stopped-gracefully`` in its directory, then exits: the test
checks that a stop reaches the command itself, not only the sandbox around it. Standard library only."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socketserver
import sys


def _can_read(path: str) -> bool:
    try:
        if os.path.isdir(path):
            os.listdir(path)
        else:
            with open(path, "rb") as f:
                f.read(1)
    except OSError:
        return False
    return True


def _can_write(path: str) -> bool:
    try:
        if os.path.isdir(path):
            probe = os.path.join(path, f".probe-{os.getpid()}")
            with open(probe, "w") as f:
                f.write("x")
            os.unlink(probe)
        else:
            with open(path, "ab"):
                pass
    except OSError:
        return False
    return True


def observe() -> dict[str, object]:
    paths = [p for p in os.environ.get("PROBE_PATHS", "").split(":") if p]
    seen = {p: {"exists": os.path.lexists(p), "read": _can_read(p), "write": _can_write(p)} for p in paths}
    with open("/tmp/probe-marker", "w") as f:
        f.write(os.environ.get("ELASTIC_WORKER_ID", "?"))
    return {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "paths": seen, "uid": os.getuid(),
            "cgroup": open("/proc/self/cgroup").read().strip()}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(observe()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:  # (a Unix socket's peer has no host to print)
        return "unix"

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def main() -> None:
    path = os.environ["ELASTIC_LISTEN"].removeprefix("unix:")

    def stop(signum: int, frame: object) -> None:
        with open("stopped-gracefully", "w") as f:
            f.write(str(signum))
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    server = Server(path, Handler)
    print(f"probe listening on {path}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
