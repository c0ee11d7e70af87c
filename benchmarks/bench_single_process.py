"""What a synced reward costs per call in one process (issue 23: checking the result, under 3 us).

Times, interleaved in one process, a TRL-shaped call (keyword columns of 8 samples, ``trainer_state``)
of the plain function and of the same function under ``@synced_reward`` with no distributed job (the
single-process path: resolve the backend, call, check the result's shape). Prints min-of-repeats per
call and the difference.

    python benchmarks/bench_single_process.py
"""

from __future__ import annotations

import timeit
from typing import Any

from syncreward import synced_reward

N = 8
KWARGS: dict[str, Any] = {
    "prompts": ["p"] * N,
    "completions": ["c"] * N,
    "completion_ids": [[1, 2]] * N,
    "solution": ["s"] * N,
    "trainer_state": None,
}


def accuracy(completions: Any, solution: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def accuracy_dict(completions: Any, solution: Any, **kwargs: Any) -> dict[str, list[float]]:
    return {"a": [1.0] * len(completions), "b": [0.0] * len(completions)}


def main() -> None:
    cases = {
        "plain function": lambda: accuracy(**KWARGS),
        "synced, 1 process": lambda f=synced_reward(accuracy): f(**KWARGS),
        "plain, dict result": lambda: accuracy_dict(**KWARGS),
        "synced, dict result": lambda f=synced_reward(accuracy_dict): f(**KWARGS),
    }
    n, best = 100_000, {k: float("inf") for k in cases}
    for _ in range(7):  # interleaved rounds
        for name, fn in cases.items():
            best[name] = min(best[name], timeit.timeit(fn, number=n) / n * 1e6)
    names = list(cases)
    for plain, synced in zip(names[::2], names[1::2]):
        print(f"{plain:22s} {best[plain]:6.2f} us per call")
        print(f"{synced:22s} {best[synced]:6.2f} us per call   (+{best[synced] - best[plain]:5.2f} us)")


if __name__ == "__main__":
    main()
