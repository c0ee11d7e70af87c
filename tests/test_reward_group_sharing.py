"""Reward groups share a gathering only where every rank provably agrees that the inputs are the same.

A member call is scored on what an earlier member gathered only when its columns are the very objects
that call sent, with the lengths they had then, and every rank's columns could prove that (non-empty
lists, arrays, tensors: never an empty column or a tuple, which the interpreter may share). Anything
else gathers again -- and gives the results of the plain function on the global batch.
"""

from __future__ import annotations

from typing import Any

import pytest

from syncreward import synced_rewards
from syncreward.testing import run_threads

EMPTY: list[str] = []  # one empty list object, reused: as "the same object" as the empty tuple


def count(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(completions))] * len(completions)


def longest(completions: Any, **kwargs: Any) -> list[float]:
    top = max((len(c) for c in completions), default=0)
    return [float(top)] * len(completions)


def test_a_column_appended_to_between_two_members_is_gathered_again() -> None:
    def body(rank: int, world_size: int) -> Any:
        a, b = synced_rewards(count, longest, timeout=5)
        completions = ["x" * (rank + 1)] * 2
        first = a(completions=completions)
        completions.append("y" * 9)  # the same list object, now longer
        return first, b(completions=completions)

    got = run_threads(body, 2, timeout=30)
    assert got == [([4.0, 4.0], [9.0] * 3), ([4.0, 4.0], [9.0] * 3)]


@pytest.mark.parametrize("empty", [(), EMPTY], ids=["empty-tuple", "same-empty-list"])
def test_an_empty_rank_never_takes_a_later_call_for_the_same_inputs(empty: Any) -> None:
    """Rank 1 has no samples and passes the same empty object every time; the others pass new data."""

    def body(rank: int, world_size: int) -> Any:
        a, b = synced_rewards(count, longest, timeout=5)
        out = []
        for step in range(2):
            data = type(empty)("z" * (step + 2) for _ in range(3)) if rank == 0 else empty
            out += [a(completions=data), b(completions=data)]
        return out

    got = run_threads(body, 2, timeout=30)
    assert got[0] == [[3.0] * 3, [2.0] * 3, [3.0] * 3, [3.0] * 3]
    assert got[1] == [[]] * 4


def test_tuple_columns_are_scored_right_at_every_step() -> None:
    def body(rank: int, world_size: int) -> Any:
        a, b = synced_rewards(count, longest, timeout=5)
        out = []
        for step in range(3):
            data = ("w" * (step + rank + 1),) * (rank + 1)
            out.append((a(completions=data), b(completions=data)))
        return out

    got = run_threads(body, 2, timeout=30)
    assert got[1] == [([3.0, 3.0], [float(step + 2)] * 2) for step in range(3)]


class Opaque:
    """An object the wire does not carry without pickle: left behind when it only reaches ``**kwargs``."""

    def __init__(self, size: int) -> None:
        self.size = size


def needs_images(completions: Any, images: Any, **kwargs: Any) -> list[float]:
    return [float(sum(i.size for i in images))] * len(completions)


def test_a_member_naming_a_column_an_earlier_member_left_behind_gets_it() -> None:
    """The first member takes ``images`` through ``**kwargs`` (left behind); the second names it."""

    def body(rank: int, world_size: int) -> Any:
        a, b = synced_rewards(count, needs_images, allow_pickle=True, timeout=5)
        kw = {"completions": ["c"] * (rank + 1), "images": [Opaque(10 * (rank + 1))] * (rank + 1)}
        return a(**kw), b(**kw)

    got = run_threads(body, 2, timeout=30)
    assert got == [([3.0], [50.0]), ([3.0, 3.0], [50.0, 50.0])]
