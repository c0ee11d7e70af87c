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

from syncreward import synced_reward
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

