"""Synced calls from threads a thread-rank starts behave as on real ranks, or raise; never local.

On real ranks a helper thread of a rank's process is part of that rank (the backend is process-wide).
Under :func:`~syncreward.testing.run_threads` a new thread starts with an empty context and belongs to
no simulated rank: its synced calls raise :class:`~syncreward.BackendError` instead of scoring the
helper's batch alone. With the rank's context copied into the thread, the call belongs to that rank.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_threads


@synced_reward(timeout=10)
def batch_size(completions: Any, **kwargs: Any) -> list[float]:
    """The size of the batch it scores: 2.0 per sample alone, 4.0 synced over two ranks of 2."""
    return [float(len(completions))] * len(completions)


def test_helper_thread_synced_call_raises_instead_of_scoring_locally() -> None:
    def body(rank: int, world_size: int) -> str:
        with ThreadPoolExecutor(1) as pool, pytest.raises(syncreward.BackendError) as info:
            pool.submit(batch_size, ["a", "b"]).result()
        return str(info.value)

    for message in run_threads(body, 2, timeout=20):
        assert "not one of run_threads' ranks" in message
        assert "contextvars.copy_context().run" in message


def test_plain_threading_thread_synced_call_raises() -> None:
    def body(rank: int, world_size: int) -> str:
        seen: list[BaseException] = []

        def helper() -> None:
            try:
                batch_size(["a", "b"])
            except BaseException as e:
                seen.append(e)

        t = threading.Thread(target=helper)
        t.start()
        t.join(10)
        assert len(seen) == 1
        return type(seen[0]).__name__

    assert run_threads(body, 2, timeout=20) == ["BackendError", "BackendError"]


def test_helper_thread_with_copied_context_belongs_to_its_rank() -> None:
    def body(rank: int, world_size: int) -> Any:
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(contextvars.copy_context().run, batch_size, ["a", "b"]).result()

    assert run_threads(body, 2, timeout=20) == [[4.0, 4.0], [4.0, 4.0]]


def test_asyncio_to_thread_copies_the_context_so_the_call_belongs_to_the_rank() -> None:
    def body(rank: int, world_size: int) -> Any:
        async def main() -> Any:
            return await asyncio.to_thread(batch_size, ["a", "b"])

        return asyncio.run(main())

    assert run_threads(body, 2, timeout=20) == [[4.0, 4.0], [4.0, 4.0]]


def test_two_threads_of_one_rank_at_once_raise_mismatch_as_in_production() -> None:
    @synced_reward(timeout=10)
    def slow(completions: Any, **kwargs: Any) -> list[float]:
        time.sleep(0.3)  # keeps the first call in flight while the second one starts
        return [float(len(completions))] * len(completions)

    start = threading.Barrier(4)  # both helpers of both ranks start together

    def body(rank: int, world_size: int) -> list[str]:
        def helper() -> str:
            start.wait(10)
            try:
                slow(["a", "b"])
            except syncreward.SyncRewardError as e:
                return type(e).__name__
            return "ok"

        with ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(contextvars.copy_context().run, helper) for _ in range(2)]
            return sorted(f.result() for f in futures)

    outcomes = run_threads(body, 2, timeout=30)
    assert all("MismatchError" in rank for rank in outcomes), outcomes


def test_a_synced_call_outside_run_threads_is_local_again() -> None:
    run_threads(lambda rank, world_size: batch_size(["a"]), 2, timeout=20)
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(batch_size, ["a", "b"]).result() == [2.0, 2.0]


def test_nested_run_threads_keep_the_check_until_the_last_one_ends() -> None:
    inner_done = threading.Event()
    outer_may_end = threading.Event()

    def inner(rank: int, world_size: int) -> Any:
        return batch_size(["a", "b"])

    def outer(rank: int, world_size: int) -> Any:
        if rank == 0:
            got = run_threads(inner, 2, timeout=20)
            inner_done.set()
            outer_may_end.wait(10)
            return got
        inner_done.wait(10)
        # the outer run is still active after the inner one ended
        with ThreadPoolExecutor(1) as pool, pytest.raises(syncreward.BackendError):
            pool.submit(batch_size, ["a", "b"]).result()
        outer_may_end.set()
        return None

    assert run_threads(outer, 2, timeout=30)[0] == [[4.0, 4.0], [4.0, 4.0]]
