"""Type-checked by mypy in tests/test_typing.py, never run: the decorator keeps signatures precisely."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from typing_extensions import assert_type

from syncreward import synced_reward, synced_rewards


@synced_reward
def bare(completions: list[str], solution: list[str]) -> list[float]:
    return [0.0] * len(completions)


@synced_reward(mode="shard", group_size=4, timeout=60.0)
def called(completions: list[str], *, scale: float = 1.0) -> list[float | None]:
    return [scale] * len(completions)


@synced_reward
async def asynchronous(completions: list[str]) -> list[float]:
    return [0.0] * len(completions)


assert_type(bare(["a"], ["b"]), list[float])
assert_type(called(["a"], scale=2.0), list[float | None])
coroutine = assert_type(asynchronous(["a"]), Coroutine[Any, Any, list[float]])
coroutine.close()

bare(["a"])  # type: ignore[call-arg]
called(["a"], scale="x")  # type: ignore[arg-type]
synced_reward(mode="everywhere")  # type: ignore[call-overload]

# ``reward.__wrapped__`` is the plain function, with its signature (the docs call it on one rank's samples)
assert_type(bare.__wrapped__(["a"], ["b"]), list[float])
assert_type(called.__wrapped__(["a"], scale=2.0), list[float | None])
assert_type(asynchronous.__wrapped__(["a"]), Coroutine[Any, Any, list[float]]).close()
plain: Callable[[list[str], list[str]], list[float]] = bare.__wrapped__
bare.__wrapped__(["a"])  # type: ignore[call-arg]
called.__wrapped__(["a"], scale="x")  # type: ignore[arg-type]
unwrapped = bare.__unwrapped__  # type: ignore[attr-defined]
name: str = bare.__name__

member, other = synced_rewards(bare, called)
assert_type(member.__wrapped__, Callable[..., Any])
