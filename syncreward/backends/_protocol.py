"""The contract between syncreward and a transport: two collectives on byte buffers, optional extras.

:class:`Backend` is what every transport implements. A transport may also offer any of the capabilities
:class:`Scatters`, :class:`Gathers`, :class:`ReceivesMany`, :class:`Abandons`, :class:`Aborts` and
:class:`Releases`, each one method (``Gathers``: three); syncreward asks :func:`scatters`, :func:`gathers`,
:func:`receives_many`, :func:`abandons`, :func:`aborts` and :func:`releases` whether a backend has one: a method of the
backend's class answers once per class; an object whose class has none is asked itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Abandons",
    "Aborts",
    "Backend",
    "Gathers",
    "ReceivesMany",
    "Releases",
    "Scatters",
    "abandons",
    "aborts",
    "gathers",
    "receives_many",
    "releases",
    "scatters",
]


@runtime_checkable
class Backend(Protocol):
    """A transport between the ranks of one group.

    syncreward needs only two collectives. Both must be called by every rank of the group, in the same
    order per ``channel``; the two channels (0 and 1) must be independent (operations on one may
    interleave with operations on the other), which lets concurrent ``async`` synced calls overlap.

    An implementation raises ``syncreward.SyncTimeoutError`` when the others do not arrive within
    ``timeout`` seconds and ``syncreward.CommunicationError`` when the transport fails. ``timeout`` is what
    is left of the synced call's deadline (its ``timeout=`` counts from the call's start), so a later wait
    of a call gets less than the user's ``timeout=``; syncreward's own backends name the user's number in
    their messages (``backends._waiting.given``). It need not
    remember failures: syncreward stops using a backend after any such error (every later call raises
    ``syncreward.GroupBrokenError`` without touching it).

    A backend may also offer the optional capabilities below (:class:`Scatters`, :class:`Gathers`,
    :class:`ReceivesMany`, :class:`Abandons`, :class:`Aborts`, :class:`Releases`): found by their methods' names
    and signatures, no base class needed.

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


@runtime_checkable
class Scatters(Protocol):
    """A backend with a scatter: ``mode="main"`` sends its results in it (W - 1 messages).

    Without it, the same bytes go through ``all_to_all``.
    """

    def scatter(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        """Rank ``root`` sends each rank (itself included) its ``size``-byte block of ``send``.

        ``send`` holds ``world_size`` blocks in rank order on ``root`` (other ranks pass an empty array);
        every rank returns its own block.
        """
        ...


@runtime_checkable
class Gathers(Protocol):
    """A backend with a gather to one rank, and ``send``/``recv`` of exact byte counts between two ranks.

    A gather sends W - 1 messages, where an ``all_to_all`` sends W(W - 1).

    With it, ``mode="main"``'s inbound is one gather of equal blocks to the scoring rank, and a payload larger
    than its block sends the rest to that rank alone (docs/internals.md): a non-scoring rank talks to the
    scoring rank only. Without it, the same bytes go through ``all_to_all`` (``_exchange.Link.gather``).
    """

    def gather(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        """Every rank sends rank ``root`` one ``size``-byte block (``send``, uint8, exactly ``size`` bytes).

        ``root`` returns the ``world_size`` blocks back to back, in rank order (its own included); every
        other rank returns an empty array.
        """
        ...

    def send(self, data: np.ndarray, dst: int, *, channel: int, timeout: float) -> None:
        """Send rank ``dst`` the bytes ``data`` (uint8); it receives them with a ``recv`` of exactly that size."""
        ...

    def recv(self, size: int, src: int, *, channel: int, timeout: float) -> np.ndarray:
        """Receive exactly ``size`` bytes that rank ``src`` sends this rank (uint8)."""
        ...


@runtime_checkable
class ReceivesMany(Protocol):
    """A :class:`Gathers` backend whose point-to-point receives from several ranks can run at once.

    ``main``'s scoring rank receives every payload too large for its gather block this way; without it,
    with ``Gathers.recv``, one rank after another (each sender then waits for the ones before it).
    """

    def recv_many(self, sizes: Mapping[int, int], *, channel: int, timeout: float) -> dict[int, np.ndarray]:
        """Receive exactly ``sizes[src]`` bytes from each rank ``src`` (each sent with ``send``), all at once.

        Returns the received bytes by rank; ``timeout`` bounds the whole.
        """
        ...


@runtime_checkable
class Abandons(Protocol):
    """A backend whose exchanges can be made to return at once, so that no process's exit waits on a peer.

    Without it, a worker waiting in an exchange at exit holds the exit until the exchange's ``timeout``.
    """

    def abandon(self, reason: str) -> None:
        """From now on every exchange in progress or started later raises at once.

        The peers waiting in it should learn ``reason``. syncreward calls it at interpreter exit
        (``reason`` is ``"rank 0 is exiting"``), before the worker threads are joined.
        """
        ...


@runtime_checkable
class Aborts(Protocol):
    """A backend that can tell the peers at once that this rank failed on its own, outside the collective.

    Without it, a rank whose step fails locally (a ``MemoryError`` building a receive buffer) leaves the
    peers waiting in that exchange until its ``timeout``.
    """

    def abort(self, reason: str) -> None:
        """This rank failed inside a step and will not complete it: the peers' exchanges should raise.

        Every peer waiting in an exchange of this group, or starting one later, should raise at once with
        ``reason`` (``synced call #3 of 'f' raised MemoryError on rank 1 while sending its inputs: ...``).
        Best effort and never blocking: syncreward calls it with the failure in hand, then raises it.
        """
        ...


@runtime_checkable
class Releases(Protocol):
    """A backend that holds resources of its own (the torch backend's gloo groups)."""

    def release(self) -> None:
        """Let go of them: the backend cache calls it once the backend's job or process group is gone, or at exit."""
        ...


_capabilities: dict[tuple[type, type], bool] = {}  # (backend class, capability) -> whether the class has it
_METHOD: dict[type, tuple[str, ...]] = {  # each one's methods
    Scatters: ("scatter",),
    Gathers: ("gather", "send", "recv"),
    ReceivesMany: ("recv_many",),
    Abandons: ("abandon",),
    Aborts: ("abort",),
    Releases: ("release",),
}


def _has(backend: object, kind: type) -> bool:
    """Whether ``backend`` has capability ``kind``.

    A method of the backend's class answers for all its objects, decided once per class. Where the class
    has none, the object itself is asked, on every call (one attribute lookup): a wrapper may forward to
    the backend it wraps (``__getattr__``) or copy its methods onto itself, so two objects of one class
    can differ.
    """
    cls = type(backend)
    key = (cls, kind)
    on_class = _capabilities.get(key)
    names = _METHOD[kind]
    if on_class is None:
        on_class = _capabilities[key] = all(callable(getattr(cls, n, None)) for n in names)
    return on_class or all(callable(getattr(backend, n, None)) for n in names)


def scatters(backend: object) -> Scatters | None:
    """``backend`` if it has a :class:`Scatters` capability, else None."""
    return backend if _has(backend, Scatters) else None  # type: ignore[return-value]


def gathers(backend: object) -> Gathers | None:
    """``backend`` if it has a :class:`Gathers` capability, else None."""
    return backend if _has(backend, Gathers) else None  # type: ignore[return-value]


def receives_many(backend: object) -> ReceivesMany | None:
    """``backend`` if it has a :class:`ReceivesMany` capability, else None."""
    return backend if _has(backend, ReceivesMany) else None  # type: ignore[return-value]


def abandons(backend: object) -> Abandons | None:
    """``backend`` if it has an :class:`Abandons` capability, else None."""
    return backend if _has(backend, Abandons) else None  # type: ignore[return-value]


def aborts(backend: object) -> Aborts | None:
    """``backend`` if it has an :class:`Aborts` capability, else None."""
    return backend if _has(backend, Aborts) else None  # type: ignore[return-value]


def releases(backend: object) -> Releases | None:
    """``backend`` if it has a :class:`Releases` capability, else None."""
    return backend if _has(backend, Releases) else None  # type: ignore[return-value]
