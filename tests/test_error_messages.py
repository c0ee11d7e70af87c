"""Error messages: every transport failure names the synced call and speaks of calls, ranks and results.

With several rewards per step a user must tell from the message alone which one failed: each error a
synced call raises says ``synced call #N of 'my_reward'``, on which rank, in which phase, and never uses
the transport's words (scatter, channel, turn, abort records such as ``T1``). A timeout raises at
``timeout=`` (plus a short grace to name the missing ranks), and the test double ``run_threads`` says
what the torch backend says.
"""

from __future__ import annotations

import pickle
import re
import time
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks, run_threads

INTERNAL = re.compile(r"scatter|all_to_all|all_gather|channel|\bturns?\b|\bT\d|\bF\d|gloo", re.IGNORECASE)
TIMEOUT = 2.0


def my_reward(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def outcome(fn: Any) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        return {"kind": "ok", "value": fn(), "s": time.monotonic() - t0}
    except syncreward.SyncRewardError as e:
        return {
            "kind": type(e).__name__,
            "msg": str(e),
            "s": time.monotonic() - t0,
            "missing": list(getattr(e, "missing_ranks", ())),
            "pickled": pickle.loads(pickle.dumps(e)),
        }


def assert_user_words(o: dict[str, Any], kind: str) -> None:
    assert o["kind"] == kind, o
    assert "'my_reward'" in o["msg"], o["msg"]
    assert not INTERNAL.search(o["msg"]), o["msg"]
    clone = o["pickled"]
    assert type(clone).__name__ == kind
    assert str(clone) == o["msg"]
    assert list(getattr(clone, "missing_ranks", ())) == o["missing"]


# --------------------------------------------------------------------------------------------- torch (run_ranks)


def _skipped_call_body(rank: int, world_size: int, timeout: float) -> dict[str, Any]:
    """Rank 1 skips a call; it calls again later, after rank 0 gave up on it."""
    import torch.distributed as dist

    f = synced_reward(timeout=timeout)(my_reward)
    out = {"warmup": outcome(lambda: f(["w"]))}
    if rank == 0:
        out["timeout"] = outcome(lambda: f(["a"]))
        out["after"] = outcome(lambda: f(["b"]))
    else:
        time.sleep(timeout + 1.0)
        out["late"] = outcome(lambda: f(["x"]))
    dist.barrier()  # both processes stay until both are done
    return out  # the errors travel pickled, as Ray and multiprocessing ship them


@pytest.mark.multiprocess
def test_a_skipped_call_under_run_ranks_names_the_function_and_raises_at_the_timeout() -> None:
    r0, r1 = run_ranks(_skipped_call_body, 2, TIMEOUT, timeout=90)
    assert r0["warmup"]["kind"] == r1["warmup"]["kind"] == "ok"
    o = r0["timeout"]
    assert_user_words(o, "SyncTimeoutError")
    assert o["missing"] == [1]
    assert "synced call #1 of 'my_reward' timed out on rank 0" in o["msg"]
    assert "rank(s) [1] did not arrive within timeout=2s" in o["msg"]
    assert TIMEOUT - 0.1 < o["s"] < TIMEOUT + 1.5, o["s"]  # the exact figure is ~timeout + 0.25 s
    after = r0["after"]
    assert_user_words(after, "GroupBrokenError")
    assert after["s"] < 0.5
    assert "synced call #1 of 'my_reward' timed out" in after["msg"]  # what broke the group
    late = r1["late"]
    assert_user_words(late, "CommunicationError")
    assert "the other ranks had given up waiting for this rank" in late["msg"]
    assert "busy for longer than timeout=" in late["msg"]


def _exits_early_body(rank: int, world_size: int) -> dict[str, Any]:
    """Rank 1 makes one synced call fewer than rank 0 and exits normally."""
    f = synced_reward(timeout=30)(my_reward)
    out = {"warmup": outcome(lambda: f(["w"]))}
    if rank == 0:
        time.sleep(0.5)  # rank 1 is gone by now
        out["call"] = outcome(lambda: f(["a"]))
        out["after"] = outcome(lambda: f(["b"]))
    return out


@pytest.mark.multiprocess
def test_a_rank_that_exits_after_fewer_calls_is_named_as_the_likely_cause() -> None:
    r0, _ = run_ranks(_exits_early_body, 2, timeout=90)
    o = r0["call"]
    assert o["kind"] == "CommunicationError", o
    assert "'my_reward'" in o["msg"]
    assert not INTERNAL.search(o["msg"]), o["msg"]
    # its left record names it (run_ranks ends a rank with destroy_process_group()), not only a closed connection
    assert "rank 1 destroyed its process group without making this synced call" in o["msg"], o["msg"]
    assert "every rank must make the same synced calls" in o["msg"]
    assert "probably died" not in o["msg"]
    assert o["s"] < 5.0  # at once, not after timeout=30
    assert r0["after"]["kind"] == "GroupBrokenError"
    assert "without making this synced call" in r0["after"]["msg"]


# --------------------------------------------------------------------------------------------- run_threads


def test_a_skipped_call_under_run_threads_names_the_function_as_run_ranks_does() -> None:
    f = synced_reward(timeout=1.0)(my_reward)

    def body(rank: int, world_size: int) -> dict[str, Any]:
        out = {"warmup": outcome(lambda: f(["w"]))}
        if rank == 0:
            out["timeout"] = outcome(lambda: f(["a"]))
            out["after"] = outcome(lambda: f(["b"]))
        else:
            time.sleep(1.5)
            out["late"] = outcome(lambda: f(["x"]))
        return out

    r0, r1 = run_threads(body, 2, timeout=20)
    o = r0["timeout"]
    assert_user_words(o, "SyncTimeoutError")
    assert o["missing"] == [1]
    assert "synced call #1 of 'my_reward' timed out on rank 0 while sending its inputs" in o["msg"]
    assert "rank(s) [1] did not arrive within timeout=1s" in o["msg"]
    assert 0.9 < o["s"] < 1.0 + 1.5, o["s"]
    assert_user_words(r0["after"], "GroupBrokenError")
    late = r1["late"]  # the slow rank gets the torch backend's words and hint
    assert_user_words(late, "CommunicationError")
    assert "the other ranks had given up waiting for this rank" in late["msg"]
    assert "rank 0 waited 1s for rank(s) [1]" in late["msg"]
    assert "busy for longer than timeout=" in late["msg"]


@synced_reward(timeout=0.5)
def slow_reward(completions: Any, **kwargs: Any) -> list[float]:
    time.sleep(1.0)
    return [0.0] * len(completions)


def test_a_slow_reward_under_run_threads_says_which_call_waited_for_results() -> None:
    def body(rank: int, world_size: int) -> dict[str, Any]:
        return outcome(lambda: slow_reward([f"c{rank}"]))

    r0, r1 = run_threads(body, 2, timeout=20)
    assert r1["kind"] == "SyncTimeoutError", r1  # rank 1 waits for rank 0, which scores the batch
    assert "synced call #0 of 'slow_reward' timed out on rank 1 while waiting for its results" in r1["msg"]
    assert not INTERNAL.search(r1["msg"]), r1["msg"]
    assert r0["kind"] == "CommunicationError", r0
    assert "busy for longer than timeout=" in r0["msg"]
    assert "'slow_reward'" in r0["msg"]
    assert not INTERNAL.search(r0["msg"]), r0["msg"]


@synced_reward(timeout=0.5)
async def my_async_reward(completions: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def test_concurrent_async_calls_that_a_rank_never_joins_each_name_their_call() -> None:
    import asyncio

    def body(rank: int, world_size: int) -> list[dict[str, Any]]:
        if rank == 1:  # busy past the timeout (a rank that returns has left: it would be named at once)
            time.sleep(1.5)
            return []

        async def two() -> list[dict[str, Any]]:
            async def one(c: str) -> dict[str, Any]:
                t0 = time.monotonic()
                try:
                    return {"kind": "ok", "value": await my_async_reward([c])}
                except syncreward.SyncRewardError as e:
                    return {"kind": type(e).__name__, "msg": str(e), "s": time.monotonic() - t0}

            return list(await asyncio.gather(one("a"), one("b")))

        return asyncio.run(two())

    first, second = run_threads(body, 2, timeout=20)[0]
    assert first["kind"] == "SyncTimeoutError", first
    assert "synced call #0 of 'my_async_reward' timed out on rank 0" in first["msg"]
    assert second["kind"] in ("GroupBrokenError", "SyncTimeoutError"), second
    assert "synced call #1 of 'my_async_reward'" in second["msg"]
    for o in (first, second):
        assert not INTERNAL.search(o["msg"]), o["msg"]
        assert o["s"] < 0.5 + 1.5


def test_a_call_that_could_not_start_before_its_timeout_says_so_in_user_words() -> None:
    """An async call queued behind a stuck one runs out of its own deadline first (one deadline per call):
    its message must read as the one for the stuck call does, with no word of the library's insides."""
    from syncreward._errors import stuck_error

    msg = str(stuck_error("synced call #1 of 'my_async_reward'", 0.4987))
    assert msg.startswith("synced call #1 of 'my_async_reward' could not start within its timeout=0.5s"), msg
    assert not INTERNAL.search(msg), msg
