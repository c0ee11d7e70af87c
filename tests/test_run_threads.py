"""``syncreward.testing.run_threads``: the in-process test double keeps run_ranks' contract."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import numpy as np
import pytest

import syncreward
from syncreward import Backend, synced_reward
from syncreward.testing import RanksFailed, ThreadBackend, ThreadGroup, run_threads


@synced_reward(timeout=5)
def centred(completions: Any, **kwargs: Any) -> list[float]:
    mean = sum(map(len, completions)) / len(completions)
    return [len(c) - mean for c in completions]


def test_run_threads_docstring_example() -> None:
    batches = [["a", "bb"], [], ["ccc", "dddd", "eeeee"]]
    got = run_threads(lambda rank, world_size: centred(batches[rank]), 3, timeout=10)
    assert got == [[-2.0, -1.0], [], [0.0, 1.0, 2.0]]


def test_run_threads_auto_backend_is_the_thread_rank_also_in_coroutines() -> None:
    def body(rank: int, world_size: int, extra: str) -> Any:
        be = syncreward.resolve_backend("auto")

        async def inner() -> Backend:
            return syncreward.resolve_backend("auto")

        assert asyncio.run(inner()) is be
        return type(be).__name__, be.rank, be.world_size, extra

    assert run_threads(body, 2, "x", timeout=10) == [("ThreadBackend", 0, 2, "x"), ("ThreadBackend", 1, 2, "x")]
    assert syncreward.resolve_backend("auto").world_size == 1  # nothing leaks into the calling thread


def test_run_threads_rank_that_raises_breaks_the_group_and_others_fail_fast() -> None:
    def body(rank: int, world_size: int) -> Any:
        if rank == 0:
            raise ValueError("rank zero gives up")
        t0 = time.monotonic()
        with pytest.raises(syncreward.CommunicationError):
            synced_reward(timeout=30)(centred.__wrapped__)(["a"])  # type: ignore[attr-defined]
        return time.monotonic() - t0

    t0 = time.monotonic()
    with pytest.raises(RanksFailed) as info:
        run_threads(body, 2, timeout=20)
    assert time.monotonic() - t0 < 5
    assert list(info.value.failures) == [0]
    assert "rank zero gives up" in info.value.failures[0]


def test_run_threads_timeout_in_the_exchange_is_a_sync_timeout_error() -> None:
    def body(rank: int, world_size: int) -> Any:
        if rank == 1:  # alive but busy past the timeout (a rank that returns has left: it would be named at once)
            time.sleep(1.5)
            return None
        with pytest.raises(syncreward.SyncTimeoutError) as info:
            synced_reward(timeout=0.5)(centred.__wrapped__)(["a"])  # type: ignore[attr-defined]
        return info.value.missing_ranks

    assert run_threads(body, 2, timeout=10) == [(1,), None]


def test_run_threads_reports_the_stack_of_a_hung_rank() -> None:
    def sleepy_rank_body(rank: int, world_size: int) -> None:
        if rank == 1:
            time.sleep(3)

    with pytest.raises(RanksFailed) as info:
        run_threads(sleepy_rank_body, 2, timeout=0.5)
    assert list(info.value.failures) == [1]
    assert "did not finish" in info.value.failures[1]
    assert "sleepy_rank_body" in info.value.failures[1]


def test_thread_backend_checks_the_protocol() -> None:
    def body(rank: int, world_size: int) -> Any:
        be = syncreward.resolve_backend("auto")
        assert isinstance(be, ThreadBackend)
        send = np.arange(4, dtype=np.uint8)
        # rank 1 expects 3 bytes from rank 0, which sends it 2
        recv = [2, 2] if rank == 0 else [3, 2]
        try:
            be.all_to_all(send, [2, 2], recv, channel=0, timeout=5)
        except syncreward.CommunicationError:
            return "raised"
        return "ok"

    with pytest.raises(RanksFailed) as info:
        run_threads(body, 2, timeout=10)
    assert list(info.value.failures) == [1]
    assert "sends 2 bytes to rank 1, which expects 3" in info.value.failures[1]


def test_thread_backend_channels_are_independent() -> None:
    def body(rank: int, world_size: int) -> Any:
        be = syncreward.resolve_backend("auto")
        # rank 0 goes channel 1 then 0, rank 1 channel 0 then 1: works only if the channels are independent
        order = (1, 0) if rank == 0 else (0, 1)
        out = {}

        def one(channel: int) -> None:
            out[channel] = be.all_gather(np.array([rank, channel], dtype=np.int64), channel=channel, timeout=5)

        threads = [threading.Thread(target=one, args=(c,)) for c in order]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {c: v.tolist() for c, v in out.items()}

    for value in run_threads(body, 2, timeout=10):
        assert value == {0: [[0, 0], [1, 0]], 1: [[0, 1], [1, 1]]}
    assert isinstance(ThreadGroup(2).backends()[1], Backend)
