"""The contract between syncreward and a transport: two collectives on byte buffers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = ["Backend"]


@runtime_checkable
class Backend(Protocol):
    """A transport between the ranks of one group.

    syncreward needs only two collectives. Both must be called by every rank of the group, in the same
    order per ``channel``; the two channels (0 and 1) must be independent (operations on one may
    interleave with operations on the other), which lets concurrent ``async`` synced calls overlap.

    An implementation raises ``syncreward.SyncTimeoutError`` when the others do not arrive within
    ``timeout`` seconds and ``syncreward.CommunicationError`` when the transport fails. It need not
    remember failures: syncreward stops using a backend after any such error (every later call raises
    ``syncreward.GroupBrokenError`` without touching it).

    A backend may also offer ``scatter(send, size, *, root, channel, timeout)``: rank ``root`` sends each
    rank (itself included) its ``size``-byte block of ``send`` (``world_size`` blocks in rank order; other
    ranks pass an empty array) and every rank returns its block. ``mode="main"`` then sends its results
    in it (W - 1 messages); without it, the same bytes go through ``all_to_all``.

    A backend may also offer ``abandon(reason)``: from then on every exchange in progress or started
    later raises at once (the peers waiting in it should learn ``reason``). syncreward calls it at
    interpreter exit (``reason`` is ``"rank 0 is exiting"``), before the worker threads are joined, so
    that no process's exit waits on a peer; without it, a worker waiting in an exchange holds the exit
    until the exchange's ``timeout``.

    Example:
        A third-party backend needs no base class (this one is a group of one rank):

        ```python
        class MyBackend:
            rank = 0
            world_size = 1

            def all_gather(self, row, *, channel, timeout):
                return row[None, :]

            def all_to_all(self, send, send_counts, recv_counts, *, channel, timeout):
                return send
        ```
    """

    @property
    def rank(self) -> int:
        """This process's rank within the group (0-based)."""
        ...

    @property
    def world_size(self) -> int:
        """Number of ranks in the group."""
        ...

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        """Gather a fixed-length int64 row from every rank; return a ``(world_size, len(row))`` array."""
        ...

    def all_to_all(
        self,
        send: np.ndarray,
        send_counts: Sequence[int],
        recv_counts: Sequence[int],
        *,
        channel: int,
        timeout: float,
    ) -> np.ndarray:
        """Exchange variable-size byte blocks.

        ``send`` (uint8) holds ``send_counts[d]`` bytes for each destination ``d`` back to back; the result
        (uint8) holds ``recv_counts[s]`` bytes from each source ``s`` back to back, in rank order.
        """
        ...
