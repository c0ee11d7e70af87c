"""A rank that fails after a call's last exchange (reading its results) makes its next synced call raise everywhere.

Rank 1 fails rebuilding its results (out of memory, a device copy that fails, Ctrl-C in that instant):
it raises its own exception, and the scoring rank, which had sent the results, returns them. That call
is over on every rank, so nothing else can be told in it without a round of its own; the rule instead
(docs/reliability.md): rank 1's **next** synced call raises on every rank -- rank 1 a ``SyncRewardError``
"rank 1 failed to read the results of synced call #1 of 'plain': MemoryError: ...", the others a
``RemoteError`` from rank 1 with those words -- and the call after that works again on every rank, paired
and with the right results (sequence numbers, size predictions and reward groups stay in step).
Before, the others never learned of it.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from _helpers import outcome

from syncreward import synced_reward, synced_rewards
from syncreward._modes import _base, shard
from syncreward.testing import run_ranks, run_threads

FAILING = 1


def plain(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c) + len(completions)) for c in completions]


def _out_of_memory(*args: Any, **kwargs: Any) -> Any:
    raise MemoryError("injected: cannot rebuild the results")


# where each mode rebuilds a rank's results from what it received, after its last exchange
REBUILD = {"main": (_base, "rebuild_result"), "shard": (shard, "reassemble")}


def _calls(rank: int, reward: Any, fail_now: Any) -> dict[str, Any]:
    comps = [f"r{rank}s{i}" for i in range(rank + 2)]
    out = {"warmup": outcome(reward, comps)}
    with fail_now():
        out["failing"] = outcome(reward, comps)
    out["next"] = outcome(reward, comps)
    out["after"] = outcome(reward, comps)
    return out


def _check(results: list[dict[str, Any]]) -> None:
    for rank, res in enumerate(results):
        assert res["warmup"][0] == "ok", (rank, res)
        if rank == FAILING:
            assert res["failing"][0] == "MemoryError", res["failing"]
        else:
            assert res["failing"] == ("ok", res["warmup"][1], res["failing"][2]), (rank, res["failing"])
        kind, info, seconds = res["next"]
        if rank == FAILING:
            assert kind == "SyncRewardError", res["next"]
            message = info
        else:
            assert kind == "RemoteError", (rank, res["next"])
            origin, exc_type, message = info
            assert origin == FAILING, (rank, info)
            assert exc_type == "syncreward.SyncRewardError", (rank, info)
        assert f"rank {FAILING} failed to read the results of synced call #1 of 'plain'" in message, (rank, message)
        assert "MemoryError: injected: cannot rebuild the results" in message, (rank, message)
        assert seconds < 5.0, (rank, res["next"])
        assert res["after"] == ("ok", res["warmup"][1], res["after"][2]), (rank, res["after"])  # paired, right


@pytest.mark.parametrize("mode", list(REBUILD))
def test_failing_to_read_results_raises_at_the_next_call_on_every_rank_on_thread_ranks(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    module, name = REBUILD[mode]
    original = getattr(module, name)
    failing: set[int] = set()

    def maybe_fail(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == f"syncreward-rank{FAILING}" and FAILING in failing:
            _out_of_memory()
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, maybe_fail)
    options: dict[str, Any] = {"group_size": 1} if mode == "shard" else {}
    reward = synced_reward(mode=mode, timeout=30, **options)(plain)

    def body(rank: int, world_size: int) -> dict[str, Any]:
        class Failing:
            def __enter__(self) -> None:
                if rank == FAILING:
                    failing.add(rank)

            def __exit__(self, *exc: Any) -> None:
                failing.discard(rank)

        return _calls(rank, reward, Failing)

    _check(run_threads(body, 3, timeout=60))


class _FailingRebuild:
    """On rank 1: ``main``'s result rebuild runs out of memory while the context is open."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.original = _base.rebuild_result

    def __enter__(self) -> None:
        if self.rank == FAILING:
            _base.rebuild_result = _out_of_memory

    def __exit__(self, *exc: Any) -> None:
        _base.rebuild_result = self.original


def _ranks_body(rank: int, world_size: int) -> dict[str, Any]:
    reward = synced_reward(timeout=60)(plain)
    return _calls(rank, reward, lambda: _FailingRebuild(rank))


@pytest.mark.multiprocess
def test_failing_to_read_results_raises_at_the_next_call_on_every_rank() -> None:
    _check(run_ranks(_ranks_body, 3, timeout=120))


def scaled(completions: Any, **kwargs: Any) -> list[float]:
    return [2.0 * len(c) for c in completions]


def shifted(completions: Any, **kwargs: Any) -> list[float]:
    return [len(c) + 0.5 for c in completions]


@pytest.mark.parametrize(
    ("group_mode", "fails_in"), [("main", "the group"), ("main", "another reward"), ("replicate", "another reward")]
)
def test_failing_to_read_results_raises_at_the_next_call_on_every_rank_when_it_is_a_reward_group_hit(
    monkeypatch: pytest.MonkeyPatch, group_mode: str, fails_in: str
) -> None:
    """The next call is a reward group's hit on every rank (no inbound exchange): rank 1 must hit too, and
    its failure travel in the hit's result exchange. Before, rank 1 gathered (its call was a miss) while the
    others waited for results: every rank waited until timeout= and the group broke."""
    original = _base.rebuild_result
    failing: set[int] = set()

    def maybe_fail(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == f"syncreward-rank{FAILING}" and FAILING in failing:
            _out_of_memory()
        return original(*args, **kwargs)

    monkeypatch.setattr(_base, "rebuild_result", maybe_fail)
    first, second, third = synced_rewards(scaled, shifted, plain, mode=group_mode, timeout=30)
    other = synced_reward(timeout=30)(plain)
    failing_reward, failing_name = (first, "scaled") if fails_in == "the group" else (other, "plain")

    def body(rank: int, world_size: int) -> dict[str, Any]:
        out = {"warmup": outcome(first, [f"r{rank}w{i}" for i in range(rank + 2)])}
        comps = [f"r{rank}s{i}" for i in range(rank + 2)]
        if fails_in == "another reward":
            out["first"] = outcome(first, comps)  # the group keeps these columns (a miss); then another reward
        if rank == FAILING:
            failing.add(rank)
        out["failing"] = outcome(failing_reward, comps)
        failing.discard(rank)
        out["next"] = outcome(second, comps)  # a hit on every rank
        out["after"] = outcome(third, comps)  # a hit again: the call after works
        fresh = [f"r{rank}t{i}" for i in range(rank + 2)]
        out["step"] = [outcome(f, fresh) for f in (first, second, third)]  # a new step: a miss, then hits
        return out

    results = run_threads(body, 3, timeout=120)
    for rank, res in enumerate(results):
        n, total = rank + 2, sum(r + 2 for r in range(len(results)))
        kind, info, seconds = res["next"]
        if rank == FAILING:
            assert res["failing"][0] == "MemoryError", res["failing"]
            assert kind == "SyncRewardError", res["next"]
            message = info
        else:
            assert res["failing"][0] == "ok", (rank, res["failing"])
            assert kind == "RemoteError", (rank, res["next"])
            origin, exc_type, message = info
            assert (origin, exc_type) == (FAILING, "syncreward.SyncRewardError"), (rank, info)
        assert f"rank {FAILING} failed to read the results of synced call #" in message, (rank, message)
        assert f"of {failing_name!r}: MemoryError" in message, (rank, message)
        assert seconds < 5.0, (rank, res["next"])  # not timeout=30
        assert res["after"][:2] == ("ok", [float(len(f"r{rank}s0") + total)] * n), (rank, res["after"])
        assert [r[:2] for r in res["step"]] == [
            ("ok", [2.0 * len(f"r{rank}t0")] * n),
            ("ok", [len(f"r{rank}t0") + 0.5] * n),
            ("ok", [float(len(f"r{rank}t0") + total)] * n),
        ], (rank, res["step"])
