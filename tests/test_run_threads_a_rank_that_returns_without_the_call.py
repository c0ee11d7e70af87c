"""run_threads with the `if rank == 0:` mistake names the rank that never made the call, at once, briefly.

A thread-rank whose body returns has left, as a real rank that exits: the ranks waiting in a synced call it
never made raise at once naming it, and ``RanksFailed`` shows the failing rank's traceback without
syncreward's own frames. Before, the waiting rank sat out run_threads' 60 s and the report was a stack of
about 25 internal frames that never said rank 1 made no synced call.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from syncreward import synced_reward
from syncreward.testing import RanksFailed, run_threads


def plain(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def test_run_threads_a_rank_that_returns_without_the_call_is_named_at_once() -> None:
    reward = synced_reward(plain)  # the default timeout: 1800 s

    def body(rank: int, world_size: int) -> Any:
        if rank == 0:  # the mistake: only rank 0 scores
            return reward([f"r{rank}"])
        return None

    t0 = time.monotonic()
    with pytest.raises(RanksFailed) as info:
        run_threads(body, 2, timeout=60)
    assert time.monotonic() - t0 < 10.0, "the waiting rank sat out run_threads' timeout"
    failures = info.value.failures
    assert set(failures) == {0}, failures
    report = failures[0]
    assert "rank 1 exited (its body returned) without making this synced call" in report, report
    assert "CommunicationError" in report, report
    assert "syncreward/_" not in report, report  # no internal frames
    assert "syncreward/backends" not in report, report
    assert len(report.splitlines()) < 20, report


def test_run_threads_a_rank_that_returns_after_its_calls_fails_nobody() -> None:
    reward = synced_reward(timeout=30)(plain)

    def body(rank: int, world_size: int) -> Any:
        first = reward([f"r{rank}"])
        if rank == 0:
            time.sleep(0.2)  # rank 1 has returned by now
            return first, reward([f"r{rank}"])  # a call rank 1 never makes
        return first

    with pytest.raises(RanksFailed) as info:
        run_threads(body, 2, timeout=60)
    assert set(info.value.failures) == {0}, info.value.failures
    assert "rank 1 exited (its body returned) without making this synced call" in info.value.failures[0]


def test_run_threads_ranks_that_all_return_after_the_same_calls_succeed() -> None:
    reward = synced_reward(timeout=30)(plain)
    got = run_threads(lambda rank, world_size: reward([f"r{rank}"] * (rank + 1)), 3, timeout=60)
    assert got == [[2.0], [2.0, 2.0], [2.0, 2.0, 2.0]]
