"""A backend wrapper has the optional methods of the backend it wraps, whichever that backend is.

A user may wrap a backend to count or log its collectives, forwarding everything else (``__getattr__``)
or copying the wrapped backend's methods onto itself. Whether it has ``scatter`` (or ``abandon``,
``release``) is then the wrapped backend's answer, which differs between two objects of the wrapper's
class: no answer may be remembered for a class that does not define the method itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncreward import synced_reward
from syncreward.backends import resolve_backend
from syncreward.testing import run_threads


class Forwarding:
    """Counts the collectives; everything it does not define is the wrapped backend's."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls = 0

    @property
    def rank(self) -> int:
        return self.inner.rank  # type: ignore[no-any-return]

    @property
    def world_size(self) -> int:
        return self.inner.world_size  # type: ignore[no-any-return]

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        self.calls += 1
        return self.inner.all_gather(row, channel=channel, timeout=timeout)  # type: ignore[no-any-return]

    def all_to_all(self, send: np.ndarray, send_counts: Any, recv_counts: Any, *, channel: int, timeout: float) -> Any:
        self.calls += 1
        return self.inner.all_to_all(send, send_counts, recv_counts, channel=channel, timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class Copying:
    """Copies the wrapped backend's collectives, and its ``scatter`` where it has one."""

    def __init__(self, inner: Any) -> None:
        self.rank, self.world_size = inner.rank, inner.world_size
        self.all_gather, self.all_to_all = inner.all_gather, inner.all_to_all
        if hasattr(inner, "scatter"):
            self.scatter = inner.scatter


class Bare:
    """Only the two collectives of the backend it wraps: no optional method."""

    def __init__(self, inner: Any) -> None:
        self.rank, self.world_size = inner.rank, inner.world_size
        self.all_gather, self.all_to_all = inner.all_gather, inner.all_to_all


def _scores(wrap: Any) -> Any:
    """Two calls on 2 thread-ranks, each rank's backend ``wrap(its ThreadBackend)``, which has a ``scatter``."""

    def body(rank: int, world_size: int) -> Any:
        backend = wrap(resolve_backend("auto"))

        @synced_reward(backend=backend, timeout=60)
        def reward(completions: list[str]) -> list[int]:
            return [len(c) for c in completions]

        return [reward(["a" * (rank + 1)] * (rank + 1)) for _ in range(2)]

    return run_threads(body, 2, timeout=120)


EXPECTED = [[[1], [1]], [[2, 2], [2, 2]]]


def test_a_forwarding_backend_wrapper_has_the_optional_methods_of_the_backend_it_wraps() -> None:
    assert _scores(Forwarding) == EXPECTED  # wraps a ThreadBackend: it scatters
    # the same wrapper class around a backend without scatter: its results go through all_to_all
    assert _scores(lambda b: Forwarding(Bare(b))) == EXPECTED


def test_a_copying_backend_wrapper_has_the_optional_methods_of_the_backend_it_wraps() -> None:
    assert _scores(Copying) == EXPECTED  # it copied the ThreadBackend's scatter
    assert _scores(lambda b: Copying(Bare(b))) == EXPECTED  # the same class, with no scatter to copy
