"""The test double leaves nothing behind: a test suite runs ``run_threads`` thousands of times.

Each rank's session (sequence numbers, turnstiles, size predictions) belongs to its backend; the registry
is weak-keyed on the backend, but a session references its backend, so before ``run_threads`` released
its backends at the end, 240 runs at W=4 kept 964 sessions (and ~9-76 MB) alive for good.
"""

from __future__ import annotations

import contextlib
import gc
import time
import tracemalloc
from typing import Any

from syncreward import _session, synced_reward
from syncreward.backends import _cache
from syncreward.testing import RanksFailed, ThreadGroup, run_threads

RUNS = 60


@synced_reward(timeout=20)
def lengths(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


@synced_reward(timeout=20)
async def async_lengths(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def body(rank: int, world_size: int) -> list[float]:
    import asyncio

    return lengths([f"r{rank}" * 50] * 8) + asyncio.run(async_lengths(["x" * rank]))


def _live_sessions(at_most: int | None = None, wait: float = 10.0) -> int:
    """Live sessions; with ``at_most``, given ``wait`` seconds to fall to it (a failed run's worker thread may
    still be finishing its step on a loaded machine: that is not a leak, a session kept for good is)."""
    deadline = time.monotonic() + wait
    while True:
        gc.collect()
        live = sum(type(o) is _session.Session for o in gc.get_objects())
        if at_most is None or live <= at_most or time.monotonic() >= deadline:
            return live
        time.sleep(0.05)


def test_run_threads_cleanup_leaves_no_session_behind() -> None:
    run_threads(body, 4, timeout=60)  # warm-up: pools, caches
    before = _live_sessions()
    tracemalloc.start()
    try:
        first = tracemalloc.get_traced_memory()[0]
        for _ in range(RUNS):
            run_threads(body, 4, timeout=60)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - first
    finally:
        tracemalloc.stop()
    assert _live_sessions(at_most=before) <= before, "sessions of finished run_threads calls are still alive"
    assert grown < 2 * 2**20, f"{RUNS} runs of run_threads(W=4) kept {grown / 2**20:.1f} MiB"


def test_run_threads_cleanup_also_after_a_failing_rank() -> None:
    def fails(rank: int, world_size: int) -> Any:
        if rank == 1:
            raise ValueError("rank 1 fails")
        return lengths(["a"])

    before = _live_sessions()
    for _ in range(5):
        with contextlib.suppress(RanksFailed):
            run_threads(fails, 3, timeout=30)
    assert _live_sessions(at_most=before) <= before


class _Slotted:
    """A backend that cannot be weakly referenced: its session is kept in the registry's strong table."""

    __slots__ = ("_backend",)

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    rank = property(lambda self: self._backend.rank)
    world_size = property(lambda self: self._backend.world_size)

    def all_gather(self, row: Any, *, channel: int, timeout: float) -> Any:
        return self._backend.all_gather(row, channel=channel, timeout=timeout)

    def all_to_all(self, send: Any, send_counts: Any, recv_counts: Any, *, channel: int, timeout: float) -> Any:
        return self._backend.all_to_all(send, send_counts, recv_counts, channel=channel, timeout=timeout)


def test_run_threads_cleanup_a_released_backend_that_cannot_be_weakly_referenced_leaves_the_registry() -> None:
    backend = _Slotted(ThreadGroup(1).backends()[0])
    session = _session.session_for(backend, "f")  # type: ignore[arg-type]
    assert _session._strong[id(backend)][1] is session
    _cache.release(backend)
    assert id(backend) not in _session._strong
