"""The library's executor helper: a thread pool for an app's blocking work (an ORM query, a template, a PDF)
that measures what its report's ``executor.queue_depth`` says — the calls waiting for a free thread.

    from elasticd.worker import run_sync
    async def report(request):
        pdf = await run_sync(request, render_pdf, order_id)   # in the worker's executor, counted

``setup(app)`` makes one per app with ``concurrency`` threads (``ELASTIC_CONCURRENCY``): the worker's
declared capacity is then also the number of blocking calls it runs at once, and a queue behind it is
pressure the pool reads. It is a ``concurrent.futures.ThreadPoolExecutor``, so
``loop.run_in_executor(executor(app), fn)`` works too. Until the app first uses it, the report leaves
``queue_depth`` out (a field that is always 0 is not a reading).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["WorkerExecutor"]

T = TypeVar("T")


class WorkerExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor that counts the calls submitted and not yet started (``waiting``)."""

    def __init__(self, max_workers: int) -> None:
        super().__init__(max_workers=max_workers, thread_name_prefix="elastic executor")
        self._count_lock = threading.Lock()
        self.waiting = 0
        self.used = False  # the app submitted something: queue_depth is a reading from then on

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        started = threading.Event()

        def run() -> T:
            with self._count_lock:
                started.set()
                self.waiting -= 1
            return fn(*args, **kwargs)

        with self._count_lock:
            self.waiting += 1
            self.used = True
        try:
            future = super().submit(run)
        except BaseException:  # shut down: it will never run
            with self._count_lock:
                self.waiting -= 1
            raise
        future.add_done_callback(lambda f: self._cancelled(f, started))
        return future

    def _cancelled(self, future: Future[Any], started: threading.Event) -> None:
        """A call cancelled before a thread took it (shutdown with cancel_futures) waits no more."""
        with self._count_lock:
            if not started.is_set():
                started.set()
                self.waiting -= 1
