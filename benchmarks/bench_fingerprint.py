"""What the call fingerprint's identity parts cost per call (issue: under 5 us).

Times, interleaved in one process, the fingerprint a call computes in ``Call.prepare`` with and without
the parts that tell calls apart beyond the function's name: the reward's identity (``Identity.key``,
a cached string unless a sibling was decorated since) and the call site (``call_site``, cached per
call instruction), which also lengthen the hashed text. Prints min-of-repeats per call.

    python benchmarks/bench_fingerprint.py
"""

from __future__ import annotations

import functools
import sys
import timeit
from typing import Any

from syncreward._identity import Identity, call_site
from syncreward._wire import fingerprint

COLUMNS = "completion_ids:list, completions:list, prompts:list, solution:list"  # TRL's columns


def accuracy_reward(completions: Any, solution: Any, target: int = 0, **kwargs: Any) -> list[float]:
    return []


def name_only() -> int:
    return fingerprint(f"accuracy_reward(mode='main') per-sample columns [{COLUMNS}]")


def make_full(identity: Identity) -> Any:
    def full() -> int:
        site = call_site(sys._getframe(0))
        return fingerprint(f"{identity.key()}(mode='main') per-sample columns [{COLUMNS}] called from {site}")

    return full


def main() -> None:
    plain = Identity(accuracy_reward, "accuracy_reward")
    sibling_a = Identity(functools.partial(accuracy_reward, target=10), "accuracy_reward")
    sibling_b = Identity(functools.partial(accuracy_reward, target=20), "accuracy_reward")
    cases = {
        "name only (before)": name_only,
        "plain function": make_full(plain),
        "one of two partials": make_full(sibling_a),
    }
    del sibling_b
    n, best = 100_000, {k: float("inf") for k in cases}
    for _ in range(7):  # interleaved rounds
        for name, fn in cases.items():
            best[name] = min(best[name], timeit.timeit(fn, number=n) / n * 1e6)
    base = best["name only (before)"]
    for name, us in best.items():
        print(f"{name:24s} {us:6.2f} us per call   (+{us - base:5.2f} us)")


if __name__ == "__main__":
    main()
