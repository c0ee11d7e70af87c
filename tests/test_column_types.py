"""Column types at the edges: objects the wire cannot carry, masked arrays, 2-D object arrays, many columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _helpers import outcome

import syncreward
from syncreward import NotSynced, synced_reward
from syncreward.testing import run_threads


class Thing:
    """Not plain data: the wire format refuses it without allow_pickle."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __repr__(self) -> str:
        return f"Thing({self.x})"


def _is_sync_reward_error(kind: str) -> bool:
    cls = getattr(syncreward, kind, None)
    return isinstance(cls, type) and issubclass(cls, syncreward.SyncRewardError)


@pytest.mark.parametrize("where", ["every-rank", "rank-0-only"])
def test_non_plain_object_in_named_column_raises_on_every_rank(where: str) -> None:
    def reward(completions: Any, objs: Any, **kwargs: Any) -> list[int]:
        return [len(objs)] * len(completions)

    synced = synced_reward(timeout=3)(reward)

    def body(rank: int, world_size: int) -> tuple[str, Any]:
        objs = [Thing(rank), Thing(rank)] if rank == 0 or where == "every-rank" else [rank, rank]
        return outcome(synced, [f"c{rank}a", f"c{rank}b"], objs=objs)[:2]

    results = run_threads(body, 2, timeout=60)
    problems = [
        f"rank {rank}: {kind} {info!r}" for rank, (kind, info) in enumerate(results) if not _is_sync_reward_error(kind)
    ]
    assert not problems, f"a named column holding Thing objects on {where}; every rank must raise:\n" + "\n".join(
        problems
    )


def _things_in_a_dict(completions: Any, **kwargs: Any) -> dict[str, list[Thing]]:
    return {"acc": [Thing(len(c)) for c in completions]}


def _things_in_a_list(completions: Any, **kwargs: Any) -> list[Thing]:
    return [Thing(len(c)) for c in completions]


def _lengths(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def _sent_by(how: str, reward: Any) -> Any:
    """A synced ``reward`` whose results travel between ranks (main, shard, or a reward group's later member)."""
    if how == "group":  # the later member is a hit: scored on what the first gathered, only its results travel
        first, later = syncreward.synced_rewards(_lengths, reward, timeout=10)
        return lambda completions: (first(completions), later(completions))[1]
    if how == "shard":  # group_size=1 on 1 + 2 samples: rank 0 scores rank 1's first sample and must send it back
        return synced_reward(reward, mode="shard", group_size=1, timeout=10)
    return synced_reward(reward, timeout=10)


@pytest.mark.parametrize("how", ["main", "shard", "group"])
@pytest.mark.parametrize(
    ("reward", "named"),
    [(_things_in_a_dict, "results['acc']"), (_things_in_a_list, "its result")],
    ids=["dict", "list"],
)
def test_a_result_the_wire_cannot_carry_is_named_as_the_result_on_every_rank(reward: Any, named: str, how: str) -> None:
    synced = _sent_by(how, reward)

    def body(rank: int, world_size: int) -> tuple[str, Any]:
        return outcome(synced, [f"r{rank}s{i}" for i in range(rank + 1)])[:2]

    results = run_threads(body, 2, timeout=60)
    kinds = [kind for kind, _ in results]
    assert kinds == ["UnsupportedTypeError", "RemoteError"], results  # rank 0 could not send rank 1 its rows
    origin, exc_type, remote_message = results[1][1]
    assert (origin, exc_type) == (0, "syncreward.UnsupportedTypeError"), results
    for message in (results[0][1], remote_message):
        assert f"{named} cannot be sent between ranks: it holds a {__name__}.Thing" in message, message
        assert "HINT: return plain data" in message, message
        assert "column '" not in message, message  # the result is not an input column the user passed


def test_non_plain_column_beyond_the_first_252_kwargs_is_left_behind() -> None:
    """300 ``**kwargs`` columns, the 281st (by name) holding objects the function never uses: it works."""
    names = [f"c{i:03d}" for i in range(300)]
    seen: dict[str, Any] = {}

    def reward(completions: Any, **kwargs: Any) -> list[int]:
        seen.update(kwargs)
        return [sum(kwargs["c000"])] * len(completions)

    synced = synced_reward(timeout=3)(reward)

    def body(rank: int, world_size: int) -> tuple[str, Any]:
        cols: dict[str, Any] = {n: [rank, rank] for n in names}
        cols["c280"] = [Thing(rank), Thing(rank)]
        return outcome(synced, [f"c{rank}a", f"c{rank}b"], **cols)[:2]

    results = run_threads(body, 2, timeout=60)
    assert results == [("ok", [2, 2]), ("ok", [2, 2])], results
    assert isinstance(seen["c280"], NotSynced), f"c280 reached the function as {seen['c280']!r}"
    assert seen["c299"] == [0, 0, 1, 1]


def test_masked_array_column_keeps_its_mask_or_raises() -> None:
    seen: list[Any] = []

    def reward(completions: Any, scores: Any, **kwargs: Any) -> list[int]:
        seen.append(scores)
        return [0] * len(completions)

    synced = synced_reward(timeout=3)(reward)

    def body(rank: int, world_size: int) -> tuple[str, Any]:
        col = np.ma.masked_array([10 * rank, 10 * rank + 1], mask=[rank == 0, rank == 1])
        return outcome(synced, [f"c{rank}a", f"c{rank}b"], scores=col)[:2]

    results = run_threads(body, 2, timeout=60)

    def refused(kind: str, info: Any) -> bool:  # UnsupportedTypeError here, or raised on another rank
        return kind == "UnsupportedTypeError" or (kind == "RemoteError" and "UnsupportedTypeError" in info[1])

    if all(refused(kind, info) for kind, info in results):
        return  # refused on every rank: fine
    assert [kind for kind, _ in results] == ["ok", "ok"], f"masked arrays: some ranks raised: {results}"
    (got,) = seen
    assert isinstance(got, np.ma.MaskedArray), f"the mask was dropped: the function saw {type(got).__name__} {got!r}"
    assert got.data.tolist() == [0, 1, 10, 11]
    assert np.ma.getmaskarray(got).tolist() == [True, False, False, True], f"wrong mask: {got!r}"


def test_2d_object_array_column_is_gathered_whole() -> None:
    seen: list[Any] = []

    def reward(completions: Any, pairs: Any, **kwargs: Any) -> list[int]:
        seen.append(pairs)
        return [0] * len(completions)

    synced = synced_reward(timeout=3)(reward)
    sizes = [2, 3]

    def local(rank: int) -> np.ndarray:
        start = sum(sizes[:rank])
        arr = np.empty((sizes[rank], 2), dtype=object)
        for i in range(sizes[rank]):
            arr[i] = [f"q{start + i}", "x" * (start + i)]  # strings of different lengths: no fixed width
        return arr

    def body(rank: int, world_size: int) -> tuple[str, Any]:
        return outcome(synced, [f"c{i}" for i in range(sizes[rank])], pairs=local(rank))[:2]

    results = run_threads(body, 2, timeout=60)
    assert [kind for kind, _ in results] == ["ok", "ok"], f"2-D object array column: {results}"
    (got,) = seen
    assert isinstance(got, np.ndarray), type(got)
    assert got.dtype == object, got.dtype
    assert got.shape == (5, 2), f"the function saw shape {got.shape}: {got!r}"
    assert got.tolist() == np.concatenate([local(0), local(1)]).tolist()
