"""A MismatchError over per-sample columns says which column differs between ranks, and how.

The ranks' column lists are shown in full; a line per differing column says what to fix without comparing
them by eye: ``column 'scores' is a numpy array on rank 0 and a list on rank 1``, ``column 'solution'
is passed on rank 0 but not on rank 1``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from syncreward import MismatchError, synced_reward
from syncreward.testing import run_threads


@synced_reward(timeout=30)
def reward(completions: Any, **kwargs: Any) -> list[float]:
    _ = kwargs  # it may read its **kwargs, so every column reaching them travels and is checked
    return [1.0] * len(completions)


def mismatch_messages(columns_of_rank: Any, world_size: int) -> list[str]:
    def body(rank: int, world_size: int) -> str:
        with pytest.raises(MismatchError) as info:
            reward(completions=["a"], **columns_of_rank(rank))  # one place: only the columns differ
        return str(info.value)

    messages = run_threads(body, world_size, timeout=60)
    assert len(set(messages)) == 1, messages  # every rank says the same
    return messages


def test_mismatch_names_a_column_that_is_an_array_on_one_rank_and_a_list_on_another() -> None:
    (msg, _) = mismatch_messages(lambda rank: {"scores": np.array([1.0]) if rank == 0 else [1.0]}, 2)
    assert "\n  column 'scores' is a numpy array on rank 0 and a list on rank 1\n" in msg, msg
    assert "column 'completions'" not in msg


def test_mismatch_names_a_kwargs_column_missing_on_one_rank() -> None:
    (msg, _) = mismatch_messages(lambda rank: {"solution": ["x"]} if rank == 0 else {}, 2)
    assert "\n  column 'solution' is passed on rank 0 but not on rank 1\n" in msg, msg


def test_mismatch_names_every_differing_column_on_three_ranks() -> None:
    def columns(rank: int) -> dict[str, Any]:
        return [{"scores": [1.0]}, {"scores": (1.0,), "extra": [2]}, {}][rank]

    msg = mismatch_messages(columns, 3)[0]
    assert "column 'scores' is a list on rank 0 and a tuple on rank 1, and not passed on rank 2" in msg, msg
    assert "column 'extra' is passed on rank 1 but not on ranks 0, 2" in msg, msg


def test_mismatch_names_a_column_whose_name_holds_a_comma_and_a_colon() -> None:
    """The ranks' columns travel as (name, container) pairs: no name can be mistaken for the list's punctuation."""
    (msg, _) = mismatch_messages(lambda rank: {"score, v2:list": np.array([1.0]) if rank == 0 else [1.0]}, 2)
    assert "\n  column 'score, v2:list' is a numpy array on rank 0 and a list on rank 1\n" in msg, msg
