"""Re-entrancy: a synced reward called from inside a synced reward's body is a plain call.

The outer call already holds the global batch; the inner call must not start an exchange of its own
(on the scoring rank alone it would wait for ranks that are not coming, and under ``replicate`` it
would gather the already global batch again and then deadlock on the outer call's turn).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _helpers import outcome

from syncreward import synced_reward
from syncreward.testing import run_threads

BATCHES = [["a", "bb"], ["ccc", "d", "ee"]]
FLAT = [c for b in BATCHES for c in b]


def base(completions: Any, **kwargs: Any) -> list[str]:
    """Each result shows the batch the function saw, so a partial or doubled batch is visible."""
    return [f"{c}/{len(completions)}" for c in completions]


async def abase(completions: Any, **kwargs: Any) -> list[str]:
    await asyncio.sleep(0)
    return base(completions)


def expected(rank: int, suffix: str) -> list[str]:
    start = sum(len(b) for b in BATCHES[:rank])
    return [x + suffix for x in base(FLAT)[start : start + len(BATCHES[rank])]]


def run(fn: Any, is_async: bool) -> list[tuple[str, Any]]:
    def body(rank: int, world_size: int) -> tuple[str, Any]:
        call = (lambda: asyncio.run(fn(BATCHES[rank]))) if is_async else (lambda: fn(BATCHES[rank]))
        return outcome(call)[:2]

    return run_threads(body, 2, timeout=60)


@pytest.mark.parametrize("mode", ["main", "replicate"])
@pytest.mark.parametrize("case", ["sync-in-sync", "sync-in-async", "async-in-async"])
def test_reentrancy_nested_synced_call_is_plain(case: str, mode: str) -> None:
    inner_sync = synced_reward(mode=mode, timeout=1.5)(base)  # type: ignore[call-overload]
    inner_async = synced_reward(mode=mode, timeout=1.5)(abase)  # type: ignore[call-overload]

    def outer_sync(completions: Any, **kwargs: Any) -> list[str]:
        return [x + "!" for x in inner_sync(completions)]

    async def outer_sync_inner(completions: Any, **kwargs: Any) -> list[str]:
        return [x + "!" for x in inner_sync(completions)]

    async def outer_async_inner(completions: Any, **kwargs: Any) -> list[str]:
        return [x + "!" for x in await inner_async(completions)]

    fn = {"sync-in-sync": outer_sync, "sync-in-async": outer_sync_inner, "async-in-async": outer_async_inner}[case]
    outer = synced_reward(mode=mode, timeout=1.5)(fn)  # type: ignore[call-overload]
    results = run(outer, is_async=case != "sync-in-sync")
    problems = [
        f"rank {rank}: got {got!r}, expected {('ok', expected(rank, '!'))!r}"
        for rank, got in enumerate(results)
        if got != ("ok", expected(rank, "!"))
    ]
    assert not problems, f"{case}, mode={mode}:\n" + "\n".join(problems)


@pytest.mark.parametrize("mode", ["main", "replicate"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_reentrancy_double_decorated_equals_single(kind: str, mode: str) -> None:
    f = abase if kind == "async" else base
    once = synced_reward(mode=mode, timeout=1.5)(f)  # type: ignore[call-overload]
    twice = synced_reward(mode=mode, timeout=1.5)(synced_reward(mode=mode, timeout=1.5)(f))  # type: ignore[call-overload]
    single = run(once, kind == "async")
    assert single == [("ok", expected(0, "")), ("ok", expected(1, ""))]  # the reference works
    double = run(twice, kind == "async")
    assert double == single, f"synced_reward(synced_reward(f)), {kind}, mode={mode}: {double} != {single}"
