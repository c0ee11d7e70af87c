"""Concurrent synced calls on one event loop: many at once, and a sync call made while async ones are pending."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks, run_threads


async def _echo(completions: Any, idx: Any, **kwargs: Any) -> list[Any]:
    # the first call's reward is the slowest: the later calls are ready to send their results first
    await asyncio.sleep(2.0 if 0 in list(idx) else 0.001)
    return [[c, i, len(completions)] for c, i in zip(completions, idx, strict=True)]


def _many_async_calls_body(rank: int, world_size: int, n: int) -> list[Any]:
    f = synced_reward(timeout=20)(_echo)

    async def go() -> list[Any]:
        return list(await asyncio.gather(*(f([f"r{rank}-{j}"], [j]) for j in range(n)), return_exceptions=True))

    return [repr(r) if isinstance(r, BaseException) else r for r in asyncio.run(go())]


@pytest.mark.multiprocess
def test_concurrency_100_async_calls_complete() -> None:
    """TRL gathers every async reward of a step at once; 100 pending synced calls must not starve each other.

    The first call's reward is slow, so the 99 later calls are done scoring first and wait for its results
    exchange; none may take the resources (threads) that the first call needs to finish.
    """
    n = 100
    results = run_ranks(_many_async_calls_body, 2, n, timeout=120)
    problems = []
    for rank, got in enumerate(results):
        for j, value in enumerate(got):
            if value != [[f"r{rank}-{j}", j, 2]]:
                problems.append(f"rank {rank}, call {j}: {value!r}")
    assert not problems, f"{len(problems)} of {2 * n} calls went wrong, e.g.:\n" + "\n".join(problems[:6])


def _base(completions: Any, **kwargs: Any) -> list[str]:
    return [f"{c}/{len(completions)}" for c in completions]


async def _abase(completions: Any, **kwargs: Any) -> list[str]:
    await asyncio.sleep(0.05)
    return _base(completions)


def test_concurrency_sync_call_on_loop_with_pending_async_call_raises() -> None:
    """A sync synced call blocking the event loop while an async synced call is pending on it.

    The pending async call can only finish on the loop that the sync call blocks, so the sync call must
    fail fast (on every rank), and the async call must still complete correctly.
    """
    batches = [["a", "bb"], ["ccc"]]
    async_synced = synced_reward(timeout=10)(_abase)
    sync_synced = synced_reward(timeout=10)(_base)

    async def blocking_caller(completions: Any) -> tuple[str, str, float]:
        t0 = time.monotonic()
        try:
            value = sync_synced(completions)
            return "ok", repr(value), time.monotonic() - t0
        except syncreward.SyncRewardError as e:
            return "SyncRewardError", f"{type(e).__name__}: {e}", time.monotonic() - t0
        except Exception as e:
            return "other", f"{type(e).__name__}: {e}", time.monotonic() - t0

    def body(rank: int, world_size: int) -> tuple[Any, Any]:
        async def go() -> list[Any]:
            return list(
                await asyncio.gather(
                    async_synced(batches[rank]), blocking_caller(batches[rank]), return_exceptions=True
                )
            )

        pending, blocking = asyncio.run(go())
        return (repr(pending) if isinstance(pending, BaseException) else pending), blocking

    problems = []
    want = [["a/3", "bb/3"], ["ccc/3"]]
    for rank, (pending, (kind, info, seconds)) in enumerate(run_threads(body, 2, timeout=60)):
        if kind != "SyncRewardError":
            problems.append(f"rank {rank}: the sync call on the loop gave {kind}: {info}")
        if seconds > 4.0:
            problems.append(f"rank {rank}: the sync call on the loop took {seconds:.1f}s ({kind}: {info[:200]})")
        if pending != want[rank]:
            problems.append(f"rank {rank}: the pending async call gave {pending!r}, expected {want[rank]!r}")
    assert not problems, "\n".join(problems)
