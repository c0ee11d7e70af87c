"""Call pairing: a call on one rank is never paired with a different step's call on another rank.

The classic bug: rank 0 runs an extra evaluation of a reward (``if rank == 0: evaluate()``) at step 1.
Its extra call has the same function, mode and columns as the ranks' next training call, so by
sequence alone it would pair with rank 1's step-2 call and both would silently score a mixed batch.
The step the caller passes (TRL's ``trainer_state.global_step``, or a ``global_step=``/``step=``
keyword) tells them apart: the first mismatched pairing raises MismatchError on every rank.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
from _helpers import outcome

from syncreward import synced_reward
from syncreward.testing import run_ranks, run_threads


@dataclass
class TrainerState:
    """Stand-in for ``transformers.TrainerState``, which TRL passes as ``trainer_state`` (only what matters)."""

    global_step: int = 0
    epoch: float = 0.0
    max_steps: int = 100


def _reward(completions: Any, **kwargs: Any) -> list[int]:
    return [len(completions)] * len(completions)


@pytest.mark.parametrize("how", ["trainer_state", "global_step", "step"])
def test_extra_call_on_one_rank_raises_mismatch(how: str) -> None:
    synced = synced_reward(timeout=2)(_reward)

    def call(rank: int, step: int, tag: str) -> Any:
        comps = [f"{tag}{rank}"]
        if how == "trainer_state":
            return synced(comps, trainer_state=TrainerState(global_step=step))
        return synced(comps, **{how: step})

    def body(rank: int, world_size: int) -> dict[str, Any]:
        out = {"step1": outcome(call, rank, 1, "train")[:2]}
        if rank == 0:
            out["paired"] = outcome(call, rank, 1, "eval")[:2]  # the extra evaluation, on rank 0 only
            out["step2"] = outcome(call, rank, 2, "train")[:2]
        else:
            out["paired"] = outcome(call, rank, 2, "train")[:2]  # rank 1's step-2 call meets rank 0's extra call
        return out

    results = run_threads(body, 2, timeout=60)
    problems = []
    for rank, got in enumerate(results):
        if got["step1"] != ("ok", [2]):
            problems.append(f"rank {rank}: the step-1 call gave {got['step1']}")
        kind, info = got["paired"]
        if kind != "MismatchError":
            problems.append(
                f"rank {rank}: the mismatched pairing (step 1 eval on rank 0, step 2 on rank 1) gave {kind} {info!r}"
            )
    assert not problems, f"step passed as {how}:\n" + "\n".join(problems)


# --------------------------------------------------------------------------------------------- concurrent calls


async def _joined(completions: Any, **kwargs: Any) -> list[str]:
    await asyncio.sleep(1.0)  # rank 0 scores for a while: every rank's first call is still unfinished
    return ["+".join(completions)] * len(completions)


_CHUNKED = synced_reward(timeout=60)(_joined)
RUNNERS = ["threads", pytest.param("gloo", marks=pytest.mark.multiprocess)]


def _run(runner: str, body: Any) -> list[Any]:
    if runner == "threads":
        return run_threads(body, 2, timeout=90)
    return run_ranks(body, 2, timeout=180)


def _described(got: list[Any]) -> list[Any]:
    return [type(g).__name__ if isinstance(g, BaseException) else ("ok", g) for g in got]


async def _rate_limited_chunks_body(rank: int, world_size: int) -> list[Any]:
    """One reward over two chunks with asyncio.gather, each behind a limiter that lets them through in another
    order on each rank (rank 0: chunk A first; rank 1: chunk B first)."""
    chunks = {"A": [f"A{rank}"], "B": [f"B{rank}"]}
    first = "A" if rank == 0 else "B"

    async def limited(name: str) -> Any:
        await asyncio.sleep(0 if name == first else 0.3)
        return await _CHUNKED(completions=chunks[name])

    return _described(await asyncio.gather(limited("A"), limited("B"), return_exceptions=True))


@pytest.mark.parametrize("runner", RUNNERS)
def test_concurrent_calls_of_one_reward_in_a_timing_dependent_order_raise_on_every_rank(runner: str) -> None:
    results = _run(runner, _rate_limited_chunks_body)
    assert results == [["MismatchError", "MismatchError"]] * 2, results


async def _trl_like_body(rank: int, world_size: int) -> list[Any]:
    """TRL gathers its async rewards, each called at once by a small coroutine: one reward listed twice too."""

    async def invoke(name: str) -> Any:
        return await _CHUNKED(completions=[f"{name}{rank}"])

    return _described(await asyncio.gather(invoke("A"), invoke("B"), return_exceptions=True))


@pytest.mark.parametrize("runner", RUNNERS)
def test_concurrent_calls_of_one_reward_started_in_one_loop_turn_pair_in_program_order(runner: str) -> None:
    results = _run(runner, _trl_like_body)
    assert results == [[("ok", ["A0+A1"]), ("ok", ["B0+B1"])]] * 2, results


async def _created_one_per_turn_body(rank: int, world_size: int) -> list[Any]:
    """Tasks that run the synced coroutine themselves start it first thing, in the order they were created."""
    tasks = []
    for name in "AB":
        tasks.append(asyncio.ensure_future(_CHUNKED(completions=[f"{name}{rank}"])))
        await asyncio.sleep(0.05)  # the next task is created in a later turn of the event loop
    return _described(await asyncio.gather(*tasks, return_exceptions=True))


@pytest.mark.parametrize("runner", RUNNERS)
def test_concurrent_tasks_that_run_the_synced_coroutine_itself_pair_in_creation_order(runner: str) -> None:
    results = _run(runner, _created_one_per_turn_body)
    assert results == [[("ok", ["A0+A1"]), ("ok", ["B0+B1"])]] * 2, results
