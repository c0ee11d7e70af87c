"""Shard results: results scored on different ranks are combined by key and must agree in type."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _helpers import outcome

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_threads

BATCHES = [["r0-0", "r0-1"], ["r1-0", "r1-1"]]  # group_size=2: one group per rank, each scored by a different rank


def _run(reward: Any) -> list[tuple[str, Any]]:
    synced = synced_reward(mode="shard", group_size=2, timeout=3)(reward)

    def body(rank: int, world_size: int) -> tuple[str, Any]:
        return outcome(synced, BATCHES[rank])[:2]

    return run_threads(body, 2, timeout=60)


def test_shard_results_dict_key_order_differs_between_scoring_ranks() -> None:
    def reward(completions: Any, **kwargs: Any) -> dict[str, list[str]]:
        a = [f"a:{c}" for c in completions]
        b = [f"b:{c}" for c in completions]
        return {"a": a, "b": b} if completions[0].startswith("r0") else {"b": b, "a": a}

    results = _run(reward)
    problems = []
    for rank, (kind, value) in enumerate(results):
        want = {"a": [f"a:{c}" for c in BATCHES[rank]], "b": [f"b:{c}" for c in BATCHES[rank]]}
        if kind != "ok" or value != want:
            problems.append(f"rank {rank}: got {kind} {value!r}, expected {want!r}")
    assert not problems, "\n".join(problems)


def _list_or_array(completions: Any, **kwargs: Any) -> Any:
    values = [float(len(c)) for c in completions]
    return values if completions[0].startswith("r0") else np.array(values)


def _int_or_float_array(completions: Any, **kwargs: Any) -> Any:
    dtype = np.int64 if completions[0].startswith("r0") else np.float64
    return np.array([len(c) for c in completions], dtype=dtype)


@pytest.mark.parametrize("reward", [_list_or_array, _int_or_float_array], ids=["list-vs-ndarray", "int64-vs-float64"])
def test_shard_results_disagreeing_types_raise_on_every_rank(reward: Any) -> None:
    results = _run(reward)
    problems = [
        f"rank {rank}: {kind} {value!r}"
        for rank, (kind, value) in enumerate(results)
        if not isinstance(getattr(syncreward, kind, None), type)
        or not issubclass(getattr(syncreward, kind), syncreward.SyncRewardError)
    ]
    assert not problems, "scoring ranks returned different result types; every rank must raise:\n" + "\n".join(problems)
