"""The latch and the turnstiles: how one session orders its calls' turns.

A :class:`Turnstile` runs one turn's work per sequence number, strictly in sequence order (one per channel of a
session), so concurrent ``async`` calls issue their collectives in the same order on every rank while
their function bodies overlap. Work waits for its turn without holding a thread: sync callers wait on a
condition and run their work themselves; async callers hand the work over, and whoever finishes the
previous turn starts it on a worker thread (``_workers.POOL``). The :class:`Latch` is shared by a
session's turnstiles: once broken, all waiting work and every later turn fails at once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from ._deadline import Deadline
from ._errors import GroupBrokenError, reason_of, stuck_error
from ._outcome import Error, Outcome
from ._workers import POOL

__all__ = ["Latch", "Turnstile"]

T = TypeVar("T")


class Latch:
    """Broken once, for good: the first reason a session can no longer agree with its peers."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def error(self, call: str) -> GroupBrokenError:
        """The error of ``call`` (``synced call #3 of 'my_reward'``), which cannot run once the latch broke."""
        return GroupBrokenError(
            f"{call} cannot be paired with the other ranks: syncreward's group is unusable since an earlier failure "
            f"({self.reason}). HINT: the ranks are no longer in step; restart the job (torchrun --max-restarts can "
            "do it)."
        )


class Turnstile:
    """Runs one turn's work per sequence number, strictly in sequence order (one channel of a session)."""

    def __init__(self, latch: Latch, on_break: Callable[[str], None]) -> None:
        # ``with self._lock`` guards the state; ``_cv`` over the same lock is only waited on and notified where
        # a thread waits (``_sleepers``): most turns come with nobody waiting. An RLock, not a Lock: a
        # condition re-takes a Lock after its wait in an acquire() a Ctrl-C can interrupt, and the
        # ``with`` block would then release the lock another thread holds; an RLock's re-take cannot be
        # interrupted (and is owned: it is never released by another thread)
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._sleepers = 0
        self._next = 0
        self._busy = False
        self._pending: dict[int, Callable[[bool], None]] = {}
        self._latch = latch
        self._on_break = on_break

    def run(self, seq: int, work: Callable[[], Outcome[T]], deadline: Deadline, call: str) -> Outcome[T]:
        """Wait (in this thread) for ``seq``'s turn, run ``work`` here, release the turn; the work's outcome.

        A broken latch, or a turn that does not come by the call's ``deadline``, is an ``Error`` (the
        latter breaks the session). ``call`` names the call in errors (:func:`call_words`).
        """
        with self._lock:
            while not (self._next == seq and not self._busy) and self._latch.reason is None:
                left = deadline.end - time.monotonic()
                if left <= 0:
                    break
                self._sleepers += 1
                try:
                    self._cv.wait(left)
                finally:
                    self._sleepers -= 1
            ready = self._next == seq and not self._busy and self._latch.reason is None
            if ready:
                self._busy = True
            broken = self._latch.reason is not None
        if broken:
            return Error(self._latch.error(call))
        if not ready:
            error = stuck_error(call, deadline.timeout)
            self._on_break(reason_of(error))
            return Error(error)
        try:
            return work()
        finally:
            self._release(seq)

    def wait_past(self, seq: int, deadline: Deadline) -> bool:
        """Wait until ``seq``'s turn is over (run, or skipped); ``False`` at the ``deadline`` or a broken latch."""
        with self._lock:
            while self._next <= seq and self._latch.reason is None:
                left = deadline.end - time.monotonic()
                if left <= 0:
                    return False
                self._sleepers += 1
                try:
                    self._cv.wait(left)
                finally:
                    self._sleepers -= 1
            return self._next > seq

    def submit(self, seq: int, work: Callable[[], Outcome[T]], call: str) -> Future[Outcome[T]]:
        """Run ``work`` on a worker thread when ``seq``'s turn comes; never blocks the caller.

        The future's result is the work's outcome (a broken latch, or what escaped the work, as an ``Error``).
        """
        fut: Future[Outcome[T]] = Future()

        def job(holds_turn: bool = True) -> None:
            try:
                if not fut.set_running_or_notify_cancel():
                    return
                try:
                    fut.set_result(Error(self._latch.error(call)) if self._latch.reason is not None else work())
                except BaseException as e:
                    fut.set_result(Error(e))
            finally:
                if holds_turn:
                    self._release(seq)

        with self._lock:
            if self._latch.reason is not None:  # fails at once, without touching the turn order
                POOL.submit(job, False)
                return fut
            if self._next == seq and not self._busy:
                self._busy = True
                start = True
            else:
                self._pending[seq] = job
                start = False
        if start:
            POOL.submit(job, True)
        return fut

    def idle(self) -> bool:
        """No work runs or waits on this channel."""
        with self._lock:
            return not self._busy and not self._pending

    def withdraw(self, seq: int) -> bool:
        """Take back submitted work that has not started; whether it was still waiting."""
        with self._lock:
            return self._pending.pop(seq, None) is not None

    def _release(self, seq: int) -> None:
        with self._lock:
            self._next = seq + 1
            self._busy = False
            job = self._pending.pop(self._next, None)
            if job is not None:
                self._busy = True
            if self._sleepers:
                self._cv.notify_all()
        if job is not None:
            POOL.submit(job, True)

    def wake_all(self) -> None:
        """The latch broke: fail all waiting work now."""
        with self._lock:
            jobs = list(self._pending.items())
            self._pending.clear()
            self._cv.notify_all()
        for _, job in sorted(jobs, key=lambda item: item[0]):  # each fails at once (latched); none holds a turn
            POOL.submit(job, False)
