"""Several rewards per step: size predictions are per function, so each call costs 2 collectives.

TRL calls every reward function one after the other each step, passing every column to every reward.
syncreward predicts the size of each exchange from the previous one so that, in the steady state, a
``mode="main"`` call needs exactly two collectives (inbound, outbound). The prediction must come from
the *same function's* previous call: predicted from whichever reward ran last, a small reward pays
for the padding of a big one, and a big one overflows its small prediction (an extra collective).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from _helpers import Counting, TrainerState

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_threads

STEPS = 6


def format_reward(completions: Any, **kwargs: Any) -> list[float]:
    """Small: only the completions travel; one float each."""
    return [float(c.endswith(".")) for c in completions]


def accuracy_reward(completions: Any, solution: Any, **kwargs: Any) -> list[float]:
    """Medium: completions and solutions travel."""
    return [float(s in c) for c, s in zip(completions, solution, strict=True)]


def judge_reward(prompts: Any, completions: Any, **kwargs: Any) -> dict[str, list[Any]]:
    """Large: every plain column travels (token ids too); several result components."""
    n = len(completions)
    return {
        "score": [len(c) / 100 for c in completions],
        "rank": list(range(n)),
        "rationale": [f"judged {p[:20]!r} -> {c[:40]!r} among {n}" for p, c in zip(prompts, completions, strict=True)],
    }


def trl_call(rank: int, step: int) -> dict[str, Any]:
    """The keyword arguments of TRL's reward call: prompts, completions, completion_ids, dataset columns, extras."""
    n = 4
    return {
        "prompts": [f"Question {rank}-{i}: what is {i} + {i}? Answer with a sentence." for i in range(n)],
        "completions": [f"The answer is {2 * i}, as {i} + {i} = {2 * i}." for i in range(n)],
        "completion_ids": [list(range(100 + 10 * i)) for i in range(n)],
        "solution": [str(2 * i) for i in range(n)],
        "trainer_state": TrainerState(global_step=step),
        "log_extra": lambda column, values: None,
        "log_metric": lambda name, value: None,
    }


def _steps(names: Sequence[str]) -> list[list[tuple[str, int, int]]]:
    """Run STEPS steps of the named rewards on 2 thread-ranks; per rank, (name, collectives, bytes) per call."""
    functions = {
        "format": (format_reward, {"include": ()}),
        "accuracy": (accuracy_reward, {"include": ()}),
        "judge": (judge_reward, {}),
    }

    def body(rank: int, world_size: int) -> list[tuple[str, int, int]]:
        counting = Counting(syncreward.resolve_backend("auto"))
        rewards = [
            (n, synced_reward(mode="main", backend=counting, timeout=10, **functions[n][1])(functions[n][0]))
            for n in names
        ]
        log = []
        for step in range(STEPS):
            for name, reward in rewards:
                calls, sent = counting.calls, counting.sent
                reward(**trl_call(rank, step))
                log.append((name, counting.calls - calls, counting.sent - sent))
        return log

    return run_threads(body, 2, timeout=60)


def test_several_rewards_per_step_two_collectives_and_no_foreign_padding() -> None:
    names = ["format", "accuracy", "judge"]
    mixed = _steps(names)
    alone = _steps(["format"])
    problems = []
    for rank in range(2):
        steady = mixed[rank][2 * len(names) :]  # from the third step on
        for i, (name, calls, _) in enumerate(steady):
            if calls != 2:
                problems.append(f"rank {rank}, step {3 + i // len(names)}, {name}: {calls} collectives, expected 2")
        alone_bytes = max(sent for _, _, sent in alone[rank][2:])
        mixed_bytes = max(sent for name, _, sent in steady if name == "format")
        if mixed_bytes > 1.05 * alone_bytes:
            problems.append(
                f"rank {rank}: the format reward's call sends {mixed_bytes} bytes next to the other rewards, "
                f"{alone_bytes} when called alone"
            )
    assert not problems, "\n".join(problems)
