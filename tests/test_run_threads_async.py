"""Async rewards and async bodies under run_threads behave as on real ranks, at any world size.

Each real rank has its own process, so its async steps never wait behind another rank's; the
thread-ranks of one run_threads share a process, and must not either (a shared fixed-size pool of
workers blocked in exchanges would wait for steps queued behind them).
"""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest

from syncreward import synced_reward
from syncreward.testing import RanksFailed, run_ranks, run_threads


@synced_reward(timeout=10)
async def async_size(completions: Any, **kwargs: Any) -> list[float]:
    await asyncio.sleep(0)
    return [float(len(completions))] * len(completions)


def test_seventeen_thread_ranks_each_make_one_async_call() -> None:
    def body(rank: int, world_size: int) -> Any:
        return asyncio.run(async_size(["a"]))

    assert run_threads(body, 17, timeout=30) == [[17.0]] * 17


def test_nine_thread_ranks_each_gather_four_async_calls() -> None:
    def body(rank: int, world_size: int) -> Any:
        async def main() -> Any:
            return await asyncio.gather(*(async_size(["a"] * (k + 1)) for k in range(4)))

        return asyncio.run(main())

    assert run_threads(body, 9, timeout=30) == [[[9.0 * (k + 1)] * (k + 1) for k in range(4)]] * 9


def test_async_body_runs_to_completion_on_its_rank() -> None:
    async def body(rank: int, world_size: int, extra: str) -> Any:
        return await async_size(["a", "b"]), extra

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "coroutine was never awaited"
        assert run_threads(body, 2, "x", timeout=20) == [([4.0, 4.0], "x")] * 2


def test_body_returning_a_coroutine_runs_it() -> None:
    def body(rank: int, world_size: int) -> Any:
        return async_size(["a"] * (rank + 1))

    assert run_threads(body, 2, timeout=20) == [[3.0], [3.0, 3.0]]


def test_async_body_that_raises_is_a_rank_failure() -> None:
    async def body(rank: int, world_size: int) -> None:
        if rank == 1:
            raise ValueError("async rank one gives up")
        await asyncio.sleep(0)

    with pytest.raises(RanksFailed) as info:
        run_threads(body, 2, timeout=20)
    assert list(info.value.failures) == [1]
    assert "async rank one gives up" in info.value.failures[1]


async def _async_rank_body(rank: int, world_size: int) -> Any:
    return await async_size(["a"] * (rank + 1))


@pytest.mark.multiprocess
def test_run_ranks_runs_an_async_body_too() -> None:
    """The contract run_threads shares: an ``async def`` body works on real ranks as well."""
    assert run_ranks(_async_rank_body, 2, timeout=120) == [[3.0], [3.0, 3.0]]
