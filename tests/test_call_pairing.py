"""Call pairing: a call on one rank is never paired with a different step's call on another rank.

The classic bug: rank 0 runs an extra evaluation of a reward (``if rank == 0: evaluate()``) at step 1.
Its extra call has the same function, mode and columns as the ranks' next training call, so by
sequence alone it would pair with rank 1's step-2 call and both would silently score a mixed batch.
The step the caller passes (TRL's ``trainer_state.global_step``, or a ``global_step=``/``step=``
keyword) tells them apart: the first mismatched pairing raises MismatchError on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from _helpers import outcome

from syncreward import synced_reward
from syncreward.testing import run_threads


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
