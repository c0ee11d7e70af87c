"""Only the same call pairs with the same call: what tells two rewards, and two calls, apart on every rank."""

from __future__ import annotations

import asyncio
import functools
import sys
from typing import Any

import pytest

from syncreward import MismatchError, synced_reward
from syncreward._identity import Identity, call_site, plain_repr
from syncreward.testing import run_threads


def target_reward(completions: list[str], target: int = 0, **kwargs: Any) -> list[float]:
    return [float(len(c) == target) + len(completions) for c in completions]


class TargetReward:
    def __init__(self, target: int, device: str = "cpu") -> None:
        self.target = target
        self.device = device

    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        return [float(self.target) + len(completions) for _ in completions]


def make_reward(target: int) -> Any:
    def reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(target) + len(completions) for _ in completions]

    return reward


def _swapped(first: Any, second: Any, world_size: int = 2) -> list[list[tuple[str, Any]]]:
    """Rank 0 calls ``first`` then ``second``; the other ranks the other way round."""

    def body(rank: int, _: int) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for f in (first, second) if rank == 0 else (second, first):
            try:
                out.append(("ok", f(completions=["ab", "abc"][: rank + 1])))
            except MismatchError as e:
                out.append(("MismatchError", str(e)))
        return out

    return run_threads(body, world_size, timeout=30)


def _every_rank_raised(results: list[list[tuple[str, Any]]]) -> None:
    for rank, calls in enumerate(results):
        assert [kind for kind, _ in calls] == ["MismatchError"] * len(calls), (rank, calls)


def test_two_partials_of_one_function_called_in_another_order_raise_on_every_rank() -> None:
    a = synced_reward(functools.partial(target_reward, target=10), timeout=5)
    b = synced_reward(functools.partial(target_reward, target=20), timeout=5)
    results = _swapped(a, b)
    _every_rank_raised(results)
    assert "target=10" in results[0][0][1]  # the message tells them apart
    assert "target=20" in results[0][0][1]


def test_two_configured_instances_of_one_class_called_in_another_order_raise_on_every_rank() -> None:
    a = synced_reward(TargetReward(10), timeout=5)
    b = synced_reward(TargetReward(20), timeout=5)
    _every_rank_raised(_swapped(a, b))


def test_two_closures_of_one_factory_called_in_another_order_raise_on_every_rank() -> None:
    a = synced_reward(make_reward(10), timeout=5)
    b = synced_reward(make_reward(20), timeout=5)
    _every_rank_raised(_swapped(a, b))


def test_rewards_told_apart_only_by_their_name_raise_on_every_rank() -> None:
    p, q = functools.partial(target_reward), functools.partial(target_reward)
    p.__name__, q.__name__ = "accuracy_a", "accuracy_b"  # type: ignore[attr-defined]  # TRL logs by __name__
    a, b = synced_reward(p, timeout=5), synced_reward(q, timeout=5)
    results = _swapped(a, b)
    _every_rank_raised(results)
    assert "'accuracy_a'" in results[1][0][1]


def test_state_that_differs_between_ranks_but_not_between_siblings_does_not_break_pairing() -> None:
    """A ``device``/``rank`` attribute every instance on a rank holds is no reason to refuse the call."""

    def body(rank: int, world_size: int) -> Any:
        a = synced_reward(TargetReward(10, device=f"cuda:{rank}"), timeout=5)
        b = synced_reward(TargetReward(20, device=f"cuda:{rank}"), timeout=5)
        return a(completions=["x"] * (rank + 1)), b(completions=["x"] * (rank + 1))

    assert run_threads(body, 2, timeout=30) == [([13.0], [23.0]), ([13.0, 13.0], [23.0, 23.0])]


def _train_step(reward: Any, rank: int, step: int) -> Any:
    return reward(completions=["a"] * (rank + 1), global_step=step)


def _on_step_end(reward: Any, rank: int, step: int) -> Any:
    return reward(completions=["a"] * (rank + 1), global_step=step)


def test_an_extra_call_at_the_same_step_from_another_place_raises_on_every_rank() -> None:
    """A callback that scores on rank 0 only, at the step the next generation is scored at, never pairs."""
    reward = synced_reward(target_reward, timeout=5)

    def body(rank: int, world_size: int) -> Any:
        _train_step(reward, rank, 0)
        try:
            if rank == 0:
                _on_step_end(reward, rank, 1)  # transformers ran on_step_end after incrementing global_step
            return ("ok", _train_step(reward, rank, 1))
        except MismatchError as e:
            return ("MismatchError", str(e))

    results = run_threads(body, 2, timeout=30)
    assert [kind for kind, _ in results] == ["MismatchError", "MismatchError"], results
    assert "_on_step_end" in results[1][1]
    assert "_train_step" in results[1][1]
    assert "from different places" in results[1][1]  # the HINT says what differs


def test_calls_from_one_place_in_a_loop_pair() -> None:
    reward = synced_reward(target_reward, timeout=5)

    def body(rank: int, world_size: int) -> Any:
        return [_train_step(reward, rank, step) for step in range(3)]

    assert run_threads(body, 2, timeout=30) == [[[3.0]] * 3, [[3.0, 3.0]] * 3]


def test_async_rewards_gathered_as_tasks_pair_across_ranks() -> None:
    """TRL runs async rewards with asyncio.gather: the site is the event loop's, the same on every rank."""

    @synced_reward(timeout=5)
    async def judge(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(completions))] * len(completions)

    async def trl_like(rank: int) -> Any:
        async def invoke() -> Any:
            return await judge(completions=["a"] * (rank + 1))

        return await asyncio.gather(invoke(), judge(completions=["b"] * (rank + 1)))

    got = run_threads(lambda rank, ws: asyncio.run(trl_like(rank)), 2, timeout=30)
    assert got == [[[3.0], [3.0]], [[3.0, 3.0], [3.0, 3.0]]]


# --------------------------------------------------------------------------------------------- pure parts


def test_plain_repr_never_holds_a_memory_address() -> None:
    obj = object()
    text = plain_repr({"model": obj, "k": [1, 2.5, "x", None, (True,)], "s": {3, 1}})
    assert "0x" not in text
    assert text == "{k=[1, 2.5, 'x', None, (True,)], model=<object>, s=<set>}"


def test_identity_holds_only_what_tells_siblings_apart() -> None:
    a = Identity(TargetReward(1, device="cuda:3"), "TargetReward")
    assert a.key() == "test_call_identity.TargetReward"  # alone: nothing to tell apart
    b = Identity(TargetReward(2, device="cuda:3"), "TargetReward")
    assert (a.key(), b.key()) == (
        "test_call_identity.TargetReward[.target=1]",
        "test_call_identity.TargetReward[.target=2]",
    )
    del b
    assert a.key() == "test_call_identity.TargetReward"  # a sibling that is gone no longer counts


@pytest.mark.skipif(sys.version_info < (3, 11), reason="co_qualname is Python >= 3.11")
def test_call_site_names_module_function_and_relative_line() -> None:
    def caller() -> str:
        return call_site(sys._getframe(0))

    assert caller() == "test_call_identity:test_call_site_names_module_function_and_relative_line.<locals>.caller+1"


def test_call_site_of_a_task_is_the_event_loop() -> None:
    async def probe() -> str:
        return call_site(sys._getframe(1))

    async def main() -> list[str]:
        return await asyncio.gather(probe())

    assert asyncio.run(main()) == ["<an event loop task or a thread pool>"]
