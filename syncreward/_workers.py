"""Worker threads for the steps of async synced calls: each step starts at once, never queued.

A session's turnstile (``_turnstile``) hands a step to :data:`POOL` only once the step's turn has come;
the step then runs on an idle worker or on a new thread, so no step ever waits behind busy workers.
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["POOL", "Workers"]


class Workers:
    """Threads for the steps of async calls: a job starts at once, on an idle worker or else on a new one.

    A step is handed over only once its turn has come, but it may then wait in an exchange for a step of
    *another* session of this process -- the thread-ranks of :func:`syncreward.testing.run_threads` are
    sessions of one process -- so no job may queue behind busy workers (a fixed-size pool deadlocks once
    every worker waits for a step queued behind them). A session runs at most one step per channel at a
    time, so the threads busy at once are at most two per active session. Up to ``keep`` idle workers
    stay; the others end after ``linger`` seconds idle. At interpreter exit, idle workers end and busy
    ones finish their step first (what ``ThreadPoolExecutor`` does), so an abandoned call still completes
    its exchanges.
    """

    def __init__(self, keep: int = 16, linger: float = 5.0) -> None:
        self.keep = keep
        self.linger = linger
        self._reset()
        threading._register_atexit(self._stop)  # type: ignore[attr-defined]  # as ThreadPoolExecutor does
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)  # the workers are not in the child

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = 0  # workers waiting for a job, less the jobs already queued for them
        self._stopping = False
        self._started = 0

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` now on a worker thread; its exceptions are dropped (it reports its own)."""
        job = functools.partial(fn, *args)
        with self._lock:
            if self._idle > 0:
                self._idle -= 1
                self._jobs.put(job)
                return
            self._started += 1
            name = f"syncreward_{self._started}"
        # Never a daemon (a thread started from a daemon thread, such as TRL's event-loop thread, would be
        # one): interpreter exit joins the workers, so no step and nothing it references outlives
        # finalisation -- a daemon worker frozen there keeps gloo's threads alive and the process aborts at
        # exit ("terminate called without an active exception"). The job goes in a box the worker empties:
        # ``Thread`` keeps its ``args`` for the thread's whole life.
        threading.Thread(target=self._work, args=([job],), name=name, daemon=False).start()

    def _work(self, box: list[Callable[[], None]]) -> None:
        job: Callable[[], None] | None = box.pop()
        while job is not None:
            with contextlib.suppress(BaseException):  # a job sets its own future; the worker stays alive
                job()
            del job
            job = self._next()

    def _next(self) -> Callable[[], None] | None:
        with self._lock:
            if self._stopping:
                return None
            self._idle += 1
        while True:
            try:
                return self._jobs.get(timeout=self.linger)  # None: the interpreter is exiting
            except queue.Empty:
                with self._lock:  # a job is queued only under the lock, with _idle already taken
                    if self._jobs.empty() and self._idle > self.keep:
                        self._idle -= 1
                        return None

    def _stop(self) -> None:
        with self._lock:
            self._stopping = True
            for _ in range(self._idle):
                self._jobs.put(None)
            self._idle = 0


POOL = Workers()
"""Where the steps of async calls run once their turn has come (never before), each at once on its own thread."""
