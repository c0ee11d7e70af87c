"""In one process a synced reward's result is checked as on several ranks.

A wrong-length or scalar result used to be returned as is in a single process and fail only on 2 ranks;
now the same code fails the same way at any world size, and a right result is returned untouched (the
very object). The check costs under 1 us a call (``python benchmarks/bench_exchange.py --row overhead``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_threads

WRONG = {
    "too_short": (lambda n: [0.0] * (n - 1), syncreward.ResultLengthError),
    "scalar": (lambda n: 1.0, syncreward.InputError),
    "none": (lambda n: None, syncreward.InputError),
    "dict_value_too_long": (lambda n: {"a": [0.0] * n, "b": [0.0] * (n + 1)}, syncreward.ResultLengthError),
    "dict_scalar_value": (lambda n: {"a": [0.0] * n, "b": 2.0}, syncreward.InputError),
    "array_too_long": (lambda n: np.zeros(n + 1), syncreward.ResultLengthError),
    "tensor_0d": (lambda n: torch.tensor(1.0), syncreward.InputError),
}
RIGHT = {
    "list": lambda n: [0.0] * n,
    "tuple": lambda n: (0.0,) * n,
    "list_with_none": lambda n: [None] * n,
    "array": lambda n: np.zeros(n),
    "tensor": lambda n: torch.zeros(n, 2),
    "dict": lambda n: {"a": [0.0] * n, "b": np.ones(n)},
}


def _reward(make: Any) -> Any:
    def reward(completions: Any, **kwargs: Any) -> Any:
        return make(len(completions))

    return reward


@pytest.mark.parametrize("case", list(WRONG))
def test_single_process_result_checked_like_on_ranks(case: str) -> None:
    make, error = WRONG[case]
    synced = synced_reward(_reward(make))
    with pytest.raises(error, match=r"synced function '\S*reward' returned"):
        synced(completions=["a", "b", "c"], trainer_state=None)
    with pytest.raises(error, match=r"synced function '\S*reward' returned"):
        synced(["a", "b", "c"])  # positionally too
    # the same reward on 2 thread-ranks fails with the same type on the scoring rank
    got = run_threads(lambda rank, ws: _kind(lambda: synced(completions=["a", "b"])), 2, timeout=60)
    assert got[0] == error.__name__


def _kind(fn: Any) -> str:
    try:
        fn()
    except Exception as e:
        return type(e).__name__
    return "ok"


@pytest.mark.parametrize("case", list(WRONG))
def test_single_process_async_result_checked(case: str) -> None:
    make, error = WRONG[case]

    @synced_reward
    async def reward(completions: Any, **kwargs: Any) -> Any:
        return make(len(completions))

    with pytest.raises(error):
        asyncio.run(reward(completions=["a", "b", "c"]))


@pytest.mark.parametrize("case", list(RIGHT))
def test_single_process_right_result_returned_as_is(case: str) -> None:
    results: list[Any] = []

    def reward(completions: Any, **kwargs: Any) -> Any:
        results.append(RIGHT[case](len(completions)))
        return results[-1]

    assert synced_reward(reward)(completions=["a", "b", "c"]) is results[-1]


def test_single_process_result_checked_against_the_column_not_a_shared_argument() -> None:
    @synced_reward(shared=["weights"])
    def reward(weights: Any, completions: Any, **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)

    assert reward([0.5], ["a", "b"]) == [1.0, 1.0]  # weights (shared, 1 long) is not the batch
    assert reward(weights=[0.5], completions=["a", "b"], trainer_state=None) == [1.0, 1.0]
