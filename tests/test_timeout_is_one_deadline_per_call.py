"""``timeout=`` is one deadline per call: every wait of a call shares it, none starts a clock of its own.

In both cases rank 1's call waits twice, each wait shorter than ``timeout`` and both together longer:
first for rank 0 to arrive (``LATE`` s), then for rank 0 to score (``SCORING`` s). With a clock per
wait the call returned after ``LATE + SCORING`` s; with one deadline it raises ``SyncTimeoutError``
at ``timeout`` (naming rank 0, which has not sent its results), not later.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks, run_threads

TIMEOUT = 4.0
LATE = 3.0  # rank 0 calls this much later than rank 1
SCORING = 3.0  # and scores this long: each wait < TIMEOUT, together > TIMEOUT
MARGIN = 1.5  # a hang detector's margin: rank 1 raises well before LATE + SCORING


def _slow(completions: list[str]) -> list[float]:
    time.sleep(SCORING)  # runs on rank 0 only (mode="main")
    return [1.0] * len(completions)


async def _slow_async(completions: list[str]) -> list[float]:
    await asyncio.sleep(SCORING)
    return [2.0] * len(completions)


def _timed(fn: Any) -> tuple[str, Any, float]:
    t0 = time.monotonic()
    try:
        return "ok", fn(), time.monotonic() - t0
    except syncreward.SyncTimeoutError as e:
        return "SyncTimeoutError", e.missing_ranks, time.monotonic() - t0
    except syncreward.SyncRewardError as e:
        return type(e).__name__, str(e)[:200], time.monotonic() - t0


def test_timeout_is_one_deadline_per_call_across_the_inbound_and_result_waits() -> None:
    reward = synced_reward(timeout=TIMEOUT)(_slow)

    def body(rank: int, world_size: int) -> tuple[str, Any, float]:
        if rank == 0:
            time.sleep(LATE)
        return _timed(lambda: reward([f"c{rank}"]))

    got = run_threads(body, 2, timeout=60)
    kind, missing, seconds = got[1]
    assert (kind, missing) == ("SyncTimeoutError", (0,)), got
    assert TIMEOUT - 0.2 < seconds < TIMEOUT + MARGIN, got  # not LATE + SCORING
    assert got[0][0] != "ok", got  # rank 0's results never reached rank 1: it does not report success either


def test_timeout_is_one_deadline_per_call_across_the_turn_wait_and_the_async_wait() -> None:
    """Two async calls at once: rank 1's second call waits for its turn behind the first, then for its results."""
    reward = synced_reward(timeout=TIMEOUT)(_slow_async)

    async def both(rank: int) -> list[tuple[str, Any, float]]:
        async def one(i: int) -> tuple[str, Any, float]:
            t0 = time.monotonic()
            try:
                return "ok", await reward([f"c{rank}.{i}"]), time.monotonic() - t0
            except syncreward.SyncTimeoutError as e:
                return "SyncTimeoutError", e.missing_ranks, time.monotonic() - t0
            except syncreward.SyncRewardError as e:
                return type(e).__name__, str(e)[:200], time.monotonic() - t0

        return list(await asyncio.gather(one(0), one(1)))

    def body(rank: int, world_size: int) -> list[tuple[str, Any, float]]:
        if rank == 0:
            time.sleep(LATE)
        return asyncio.run(both(rank))

    got = run_threads(body, 2, timeout=60)
    for kind, _, seconds in got[1]:
        assert kind in ("SyncTimeoutError", "GroupBrokenError"), got  # the first to time out breaks the group
        assert seconds < TIMEOUT + MARGIN, got  # not LATE + SCORING
    assert any(kind == "SyncTimeoutError" for kind, _, _ in got[1]), got


def _attempt(reward: Any, completions: list[str]) -> tuple[str, str]:
    """One call: ``("ok", "")``, or the synced error's type name and message."""
    try:
        reward(completions)
        return "ok", ""
    except syncreward.SyncRewardError as e:
        return type(e).__name__, str(e)


@pytest.fixture(scope="module")
def later_wait() -> list[tuple[str, str]]:
    """Rank 0 calls LATE s after rank 1 and scores SCORING s: rank 1 times out in its results wait, with 1 s left."""
    reward = synced_reward(timeout=TIMEOUT)(_slow)

    def body(rank: int, world_size: int) -> tuple[str, str]:
        if rank == 0:
            time.sleep(LATE)
        return _attempt(reward, [f"c{rank}"])

    return run_threads(body, 2, timeout=60)


def test_a_timeout_in_a_later_wait_of_the_call_names_the_timeout_given_not_the_seconds_left(
    later_wait: list[tuple[str, str]],
) -> None:
    """Rank 1 waits LATE s for rank 0's inputs, then times out waiting for its results: its message names
    ``timeout=4s`` (what the user set, what the HINT says to raise), not the 1 s its last wait had left."""
    kind, message = later_wait[1]
    assert kind == "SyncTimeoutError", later_wait
    assert f"did not arrive within timeout={TIMEOUT:g}s" in message, later_wait


def test_a_late_rank_is_told_the_timeout_given_not_the_seconds_the_waiting_rank_had_left(
    later_wait: list[tuple[str, str]],
) -> None:
    """Rank 0, sending its results after rank 1 gave up, reads rank 1's record: ``rank 1 waited 4s`` (not 1s)."""
    kind, message = later_wait[0]
    assert kind == "CommunicationError", later_wait
    assert f"rank 1 waited {TIMEOUT:g}s for rank(s) [0]" in message, later_wait


def _later_wait_on_gloo_body(rank: int, world_size: int) -> tuple[str, str]:
    reward = synced_reward(timeout=TIMEOUT)(_slow_on_rank0)
    reward([f"w{rank}"])  # the set-up and a first call, so that the call below times out inside an exchange
    if rank == 0:
        time.sleep(LATE)
    return _attempt(reward, [f"c{rank}"])


def _slow_on_rank0(completions: list[str]) -> list[float]:
    if completions[0].startswith("c"):
        time.sleep(SCORING)  # the second call only (scored on rank 0)
    return [1.0] * len(completions)


def test_a_timeout_in_a_later_wait_names_the_timeout_given_on_gloo_ranks_too() -> None:
    """The torch backend: rank 1's error and the record rank 0 reads late both name ``timeout=4``."""
    got = run_ranks(_later_wait_on_gloo_body, 2, timeout=120)
    kind, message = got[1]
    assert kind == "SyncTimeoutError", got
    assert f"did not arrive within timeout={TIMEOUT:g}s" in message, got
    kind, message = got[0]
    assert kind == "CommunicationError", got
    assert f"(rank 1 waited {TIMEOUT:g}s for rank(s) [0])" in message, got  # (was: waited 1s, the seconds left)


def _stalled_senders_body(rank: int, world_size: int) -> tuple[str, Any, float]:
    from syncreward.backends.torch_distributed import TorchDistributedBackend

    if rank:  # every other rank's payload goes point to point (more than a first call's block): and stalls
        send = TorchDistributedBackend.send

        def stalled(self: Any, *args: Any, **kwargs: Any) -> None:
            time.sleep(3 * TIMEOUT)
            send(self, *args, **kwargs)

        TorchDistributedBackend.send = stalled  # type: ignore[method-assign]
    reward = synced_reward(timeout=TIMEOUT)(_lengths)
    return _timed(lambda: reward(["y" * 5000]))


def _lengths(completions: list[str]) -> list[float]:
    return [float(len(c)) for c in completions]


def test_timeout_is_one_deadline_per_call_across_mains_point_to_point_receives() -> None:
    """The scoring rank of ``main`` waits for several ranks' point-to-point payloads under one deadline: where every
    sender stalls it raises at ``timeout``, not once per sender, naming the senders it waited for."""
    got = run_ranks(_stalled_senders_body, 3, timeout=180)
    kind, missing, seconds = got[0]
    assert (kind, missing) == ("SyncTimeoutError", (1, 2)), got  # (gloo's point-to-point timeout is a timeout too)
    assert TIMEOUT - 0.2 < seconds < TIMEOUT + 2 * MARGIN, got  # not 2 x TIMEOUT
    assert all(kind != "ok" for kind, _, _ in got[1:]), got
