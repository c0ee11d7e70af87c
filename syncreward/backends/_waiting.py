"""A wait says what it waits for: a rate-limited warning while a rank waits long for its peers.

As torch's ``monitored_barrier`` and NCCL's watchdog do, a backend that waits for the other ranks logs
a warning (logger ``syncreward.backends._waiting``, a child of ``syncreward``; no handler attached) naming
the call, the ranks that have not arrived where it knows them, and how long it has waited. The first
warning comes after ``SYNCREWARD_WAIT_WARN_S`` seconds (default 60), then each time the wait has doubled
(60 s, 120 s, 240 s, ...): a stuck job says so within a minute, while a legitimately slow reward (the
others wait for the scoring rank) costs a handful of lines over the default ``timeout=1800``. A wait
whose ``timeout=`` comes before the first warning never logs: its error says it all.

The session names the call (:data:`CALL`, around every step); the backend only knows ranks. The session
also sets the call's ``timeout=`` as the user gave it (:data:`TIMEOUT`): a backend is handed the seconds
*left* of the call's deadline as its ``timeout`` (what its waits take), and every timeout message names
:func:`given` instead, the number the user set and the HINT says to raise.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from contextvars import ContextVar

from .._errors import seconds

__all__ = ["CALL", "TIMEOUT", "WaitLog", "given"]

log = logging.getLogger(__name__)

WARN_ENV = "SYNCREWARD_WAIT_WARN_S"
_DEFAULT_WARN_S = 60.0
# What the waits of this step are for (``synced call #3 of 'my_reward' on rank 1 while ...``): set by the
# session around every step, read only when a warning is due.
CALL: ContextVar[str] = ContextVar("syncreward_call", default="a synced call")
# The call's ``timeout=`` (``Deadline.timeout``), set by the session around every step beside CALL; None where a
# backend is driven outside a synced call.
TIMEOUT: ContextVar[float | None] = ContextVar("syncreward_timeout", default=None)


def given(timeout: float) -> float:
    """The ``timeout=`` a message names: the synced call's as the user set it, else the ``timeout`` handed.

    A backend waits ``timeout`` (the seconds left of the call's deadline) and words its timeouts, abort
    records and warnings with this: ``timeout=4``, not the 1 s left to a wait that began 3 s into the call.
    """
    call = TIMEOUT.get()
    return timeout if call is None else call


def _first_warning_s() -> float:
    try:
        return max(float(os.environ.get(WARN_ENV, _DEFAULT_WARN_S)), 0.0)
    except ValueError:
        return _DEFAULT_WARN_S


class WaitLog:
    """The warnings of one wait that started at ``started`` (``time.monotonic()``) and ends at ``timeout``."""

    __slots__ = ("_next", "_started", "_timeout")

    def __init__(self, timeout: float, started: float | None = None) -> None:
        self._started = time.monotonic() if started is None else started
        self._timeout = timeout
        first = _first_warning_s()
        self._next: float | None = self._started + first if first < timeout else None

    def due(self) -> bool:
        return self._next is not None and time.monotonic() >= self._next

    def warn(self, missing: Sequence[int] | None, waiting_for: str) -> None:
        """Log that this wait goes on: ``missing`` ranks (``None``: unknown) have not done ``waiting_for``."""
        waited = time.monotonic() - self._started
        who = f"rank(s) {list(missing)}" if missing else "which ranks is unknown"
        log.warning(
            "syncreward: %s has waited %.0fs of timeout=%ss for the other ranks to %s; not arrived: %s. HINT: a "
            "rank still scoring a slow reward is fine; a rank that hangs, exited or skipped this synced call makes "
            "this call fail at timeout= (set timeout= to what one call may take; docs/troubleshooting.md).",
            CALL.get(),
            waited,
            seconds(given(self._timeout)),
            waiting_for,
            who,
        )
        self._next = self._started + 2 * max(waited, 1e-3)
