"""Type-checked by mypy in tests/test_typing.py, never run: the decorator keeps signatures precisely."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from typing_extensions import assert_type

from syncreward import synced_reward


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
