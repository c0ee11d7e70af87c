"""One deadline per synced call: when the call must be over on this rank.

A call's :class:`Deadline` is made once, on the caller's thread, when the call opens (``_lifecycle``):
``timeout=`` seconds from then. Every wait of the call -- for its turn (``_turnstile``), for an async
step (``asyncio``), inside each collective (``_exchange.Link``, which hands the backend the seconds
:meth:`Deadline.left`) -- ends by that one moment; no layer starts a fresh ``timeout`` of its own (as
trio's ``fail_after`` or a gRPC deadline: a deadline travels, a timeout restarts).
"""

from __future__ import annotations

import time

__all__ = ["MIN_LEFT", "Deadline"]

MIN_LEFT = 1e-3
"""The seconds a transfer is given once the deadline has passed: it times out at once, naming who is missing."""


class Deadline:
    """A monotonic end time, and the ``timeout`` it was made from (which messages name)."""

    __slots__ = ("end", "timeout")

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.end = time.monotonic() + timeout

    def left(self) -> float:
        """Seconds until the deadline (at least :data:`MIN_LEFT`): what the next wait may take."""
        left = self.end - time.monotonic()  # (a comparison, not max(): this runs before every transfer)
        return left if left > MIN_LEFT else MIN_LEFT

    def passed(self) -> bool:
        return time.monotonic() >= self.end

    def __repr__(self) -> str:
        return f"Deadline(timeout={self.timeout:g}, left={self.end - time.monotonic():.3f})"
