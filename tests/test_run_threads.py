"""``syncreward.testing.run_threads``: the in-process test double keeps run_ranks' contract.

One section each (their notes open them): the contract; a thread-rank whose body returns without a synced
call the others make; async rewards and bodies; threads a thread-rank starts; nothing left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import threading
import time
import tracemalloc
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

import syncreward
from syncreward import Backend, _session, synced_reward
from syncreward.backends import _cache
from syncreward.testing import RanksFailed, ThreadBackend, ThreadGroup, run_ranks, run_threads


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


# ---------------------------------------------------------------------------------------------
# run_threads with the `if rank == 0:` mistake names the rank that never made the call, at once, briefly.
#
# A thread-rank whose body returns has left, as a real rank that exits: the ranks waiting in a synced call it
# never made raise at once naming it, and ``RanksFailed`` shows the failing rank's traceback without
# syncreward's own frames. Before, the waiting rank sat out run_threads' 60 s and the report was a stack of
# about 25 internal frames that never said rank 1 made no synced call.


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


# ---------------------------------------------------------------------------------------------
# Async rewards and async bodies under run_threads behave as on real ranks, at any world size.
#
# Each real rank has its own process, so its async steps never wait behind another rank's; the
# thread-ranks of one run_threads share a process, and must not either (a shared fixed-size pool of
# workers blocked in exchanges would wait for steps queued behind them).


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


# ---------------------------------------------------------------------------------------------
# Synced calls from threads a thread-rank starts behave as on real ranks, or raise; never local.
#
# On real ranks a helper thread of a rank's process is part of that rank (the backend is process-wide).
# Under :func:`~syncreward.testing.run_threads` a new thread starts with an empty context and belongs to
# no simulated rank: its synced calls raise :class:`~syncreward.BackendError` instead of scoring the
# helper's batch alone. With the rank's context copied into the thread, the call belongs to that rank.


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


# ---------------------------------------------------------------------------------------------
# The test double leaves nothing behind: a test suite runs ``run_threads`` thousands of times.
#
# Each rank's session (sequence numbers, turnstiles, size predictions) belongs to its backend; the registry
# is weak-keyed on the backend, but a session references its backend, so before ``run_threads`` released
# its backends at the end, 240 runs at W=4 kept 964 sessions (and ~9-76 MB) alive for good.

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
