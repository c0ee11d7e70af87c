"""Synced rewards pickle, and a reward group's members stay one group on the other side.

Ray ships an actor class defined in the driver script by value (cloudpickle), with the synced rewards
its methods call; ``multiprocessing`` and ``copy.deepcopy`` pickle them by reference. Every synced
reward, a member of a ``synced_rewards`` group or not, must come back working -- and the members of a
group, unpickled together or one by one, must still share what the group's first call of a step
gathered.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from syncreward import synced_reward, synced_rewards
from syncreward.testing import run_ranks, run_threads

cloudpickle = pytest.importorskip("ray.cloudpickle")

SIZES = [2, 1, 3]  # uneven (an empty rank never shares a gathering: test_reward_groups)


def count(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(completions))] * len(completions)


def longest(completions: Any, **kwargs: Any) -> list[float]:
    top = max((len(c) for c in completions), default=0)
    return [float(top)] * len(completions)


# module-level, as users write them (the synced function under the function's own name): pickle names them


@synced_reward(timeout=30)
def standalone(completions: Any, **kwargs: Any) -> list[float]:
    return count(completions)


def member_count(completions: Any, **kwargs: Any) -> list[float]:
    return count(completions)


def member_longest(completions: Any, **kwargs: Any) -> list[float]:
    return longest(completions)


member_count, member_longest = synced_rewards(member_count, member_longest, timeout=30)


def by_value() -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """The same rewards made where pickle cannot name them, so cloudpickle ships them by value (as Ray
    ships a class defined in ``__main__``)."""

    def count(completions: Any, **kwargs: Any) -> list[float]:
        return [float(len(completions))] * len(completions)

    def longest(completions: Any, **kwargs: Any) -> list[float]:
        top = max((len(c) for c in completions), default=0)
        return [float(top)] * len(completions)

    return (synced_reward(timeout=30)(count), *synced_rewards(count, longest, timeout=30))


def batch(rank: int) -> list[str]:
    return ["x" * (rank + 2 * i + 1) for i in range(SIZES[rank])]


def expected(rank: int) -> tuple[list[float], list[float]]:
    everything = [c for r in range(len(SIZES)) for c in batch(r)]
    n = len(batch(rank))
    return [float(len(everything))] * n, [float(max(len(c) for c in everything))] * n


def hits(member: Any) -> int:
    """How many calls of ``member``'s group were scored on what an earlier call of the group gathered."""
    return int(member.__syncreward_spec__.impl.group.hits)


def score_on_threads(single: Any, first: Any, second: Any) -> None:
    """Call the rewards on 3 thread-ranks: right results, and ``second`` scored on what ``first`` gathered."""
    before = hits(second)

    def body(rank: int, world_size: int) -> Any:
        completions = batch(rank)
        return single(completions), first(completions), second(completions)

    got = run_threads(body, len(SIZES), timeout=60)
    for rank, (alone, a, b) in enumerate(got):
        assert (alone, a) == (expected(rank)[0],) * 2, f"rank {rank}: {got[rank]}"
        assert b == expected(rank)[1], f"rank {rank}: {got[rank]}"
    assert hits(second) - before == len(SIZES), "the second member gathered again: not one group"


ROUND_TRIPS: dict[str, Callable[[Any], Any]] = {
    "pickle": lambda obj: pickle.loads(pickle.dumps(obj)),
    "deepcopy": copy.deepcopy,
    "cloudpickle": lambda obj: cloudpickle.loads(cloudpickle.dumps(obj)),
}


@pytest.mark.parametrize("how", ROUND_TRIPS)
def test_module_level_synced_rewards_and_reward_group_members_survive_pickling(how: str) -> None:
    trip = ROUND_TRIPS[how]
    single, first, second = trip((standalone, member_count, member_longest))
    assert (single.__name__, first.__name__, second.__name__) == ("standalone", "member_count", "member_longest")
    score_on_threads(single, first, second)


@pytest.mark.parametrize("together", [True, False], ids=["together", "one-by-one"])
def test_reward_group_members_cloudpickled_by_value_stay_one_group(together: bool) -> None:
    rewards = by_value()
    if together:
        single, first, second = cloudpickle.loads(cloudpickle.dumps(rewards))
    else:
        single, first, second = (cloudpickle.loads(cloudpickle.dumps(r)) for r in rewards)
    assert first is not rewards[1], "shipped by value: a new function"
    score_on_threads(single, first, second)


def test_a_reward_group_member_unpickled_beside_the_original_members_joins_their_group() -> None:
    single, first, second = by_value()
    copied_second = cloudpickle.loads(cloudpickle.dumps(second))
    score_on_threads(single, first, copied_second)


def test_a_deepcopied_object_holding_reward_group_members_keeps_one_group() -> None:
    class Scorer:  # a trainer-side object holding its rewards, as TRL's trainer does in reward_funcs
        def __init__(self) -> None:
            self.reward_funcs = list(by_value())

    single, first, second = copy.deepcopy(Scorer()).reward_funcs
    score_on_threads(single, first, second)


def fresh_process_body(rank: int, world_size: int, blobs: list[bytes]) -> Any:
    import pickle as std_pickle  # what Ray's workers load cloudpickle's bytes with

    first, second = (std_pickle.loads(b) for b in blobs)
    before = hits(second)
    completions = batch(rank)
    return first(completions), second(completions), hits(second) - before


@pytest.mark.multiprocess
def test_reward_group_members_cloudpickled_one_by_one_form_one_group_in_fresh_processes() -> None:
    _, first, second = by_value()
    blobs = [cloudpickle.dumps(first), cloudpickle.dumps(second)]  # as Ray ships two remote functions
    got = run_ranks(fresh_process_body, len(SIZES), blobs, timeout=180)
    for rank, (a, b, hit) in enumerate(got):
        assert (a, b) == expected(rank), f"rank {rank}: {got[rank]}"
        assert hit == 1, f"rank {rank}: the second member gathered again ({hit} hits): not one group"
