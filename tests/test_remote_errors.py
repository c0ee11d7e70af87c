"""Whatever the reward raises, every rank raises within seconds, and the next call works."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from _helpers import outcome

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_threads


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot be printed")


class Boom(BaseException):
    """Not an Exception: like KeyboardInterrupt or SystemExit, it bypasses ``except Exception``."""


def _ok(completions: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def _describe(e: BaseException) -> tuple[str, Any]:
    if isinstance(e, syncreward.RemoteError):
        return "RemoteError", (e.origin_rank, e.exc_type)
    return type(e).__name__, e


def test_exception_whose_str_raises_is_reported_on_every_rank() -> None:
    raised: list[BaseException] = []

    def reward(completions: Any, **kwargs: Any) -> list[float]:
        e = Unprintable("bad")
        raised.append(e)
        raise e

    synced = synced_reward(timeout=5)(reward)
    after = synced_reward(timeout=5)(_ok)

    def body(rank: int, world_size: int) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            synced([f"c{rank}"])
            first: tuple[str, Any] = ("ok", None)
        except BaseException as e:
            first = _describe(e)
        return {"first": first, "seconds": time.monotonic() - t0, "next": outcome(after, [f"c{rank}"])[:2]}

    (r0, r1) = run_threads(body, 2, timeout=60)
    problems = []
    if not (raised and r0["first"] == ("Unprintable", raised[0])):
        problems.append(f"rank 0 (scoring) should re-raise the original Unprintable object, got {r0['first']!r}")
    if not (r1["first"][0] == "RemoteError" and "Unprintable" in r1["first"][1][1]):
        problems.append(f"rank 1 should raise a RemoteError naming Unprintable, got {r1['first']!r}")
    for rank, r in enumerate((r0, r1)):
        if r["seconds"] > 3.0:
            problems.append(f"rank {rank} took {r['seconds']:.1f}s to raise")
        if r["next"] != ("ok", [1.0]):
            problems.append(f"rank {rank}: the next synced call gave {r['next']}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("exc_type", [Boom, SystemExit], ids=["Boom", "SystemExit"])
@pytest.mark.parametrize("kind", ["async", "sync"])
def test_base_exception_in_reward_is_reported_on_every_rank(kind: str, exc_type: type[BaseException]) -> None:
    """A BaseException from the reward on the scoring rank: rank 0 re-raises it, rank 1 gets a RemoteError."""

    def sync_reward(completions: Any, fail: bool = False, **kwargs: Any) -> list[float]:
        if fail:
            raise exc_type("reward gave up")
        return [1.0] * len(completions)

    async def async_reward(completions: Any, fail: bool = False, **kwargs: Any) -> list[float]:
        await asyncio.sleep(0)
        return sync_reward(completions, fail=fail)

    synced = synced_reward(timeout=5)(async_reward if kind == "async" else sync_reward)

    def call(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(synced(*args, **kwargs)) if kind == "async" else synced(*args, **kwargs)

    def body(rank: int, world_size: int) -> dict[str, Any]:
        t0 = time.monotonic()
        try:
            call([f"c{rank}"], fail=True)
            first: tuple[str, Any] = ("ok", None)
        except BaseException as e:
            first = _describe(e)
            if isinstance(e, exc_type):
                first = (exc_type.__name__, None)
        seconds = time.monotonic() - t0
        return {"first": first, "seconds": seconds, "next": outcome(call, [f"c{rank}"])[:2]}

    (r0, r1) = run_threads(body, 2, timeout=60)
    name = exc_type.__name__
    problems = []
    if r0["first"] != (name, None):
        problems.append(f"rank 0 (scoring) should re-raise {name}, got {r0['first']!r}")
    if not (r1["first"][0] == "RemoteError" and name in r1["first"][1][1]):
        problems.append(f"rank 1 should raise a RemoteError naming {name}, got {r1['first']!r}")
    for rank, r in enumerate((r0, r1)):
        if r["seconds"] > 3.0:
            problems.append(f"rank {rank} took {r['seconds']:.1f}s to raise")
        if r["next"] != ("ok", [1.0]):
            problems.append(f"rank {rank}: the next synced call gave {r['next']}")
    assert not problems, f"{kind} reward raising {name}:\n" + "\n".join(problems)
