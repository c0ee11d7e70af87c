"""Batch-normalised reward: a raw score standardised over the whole generation batch.

``(raw - mean) / std`` is only meaningful when the mean and std come from the same batch on every rank. Per
rank, each GPU normalises with its own statistics, so the same completion gets a different reward depending
on what else landed on its GPU, and no rank's rewards are centred on the global batch. Synced, every rank
uses the global mean and std.

``mode="replicate"``: the function is cheap and deterministic, so every rank computes it on the global batch
itself (one exchange fewer than ``mode="main"``, which scores on rank 0 and sends the results back).

Run: ``python examples/batch_normalized.py`` (2 local CPU ranks) or ``--ranks 3``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from syncreward import synced_reward

K = 4  # GRPOConfig.num_generations (only used to build the demo batch)


def raw_score(completion: str, solution: str) -> float:
    """Correctness plus a small brevity bonus; any per-sample score works here."""
    numbers = re.findall(r"-?\d+", completion)
    correct = 1.0 if numbers and numbers[-1] == solution.strip() else 0.0
    return correct - 0.002 * len(completion)


@synced_reward(mode="replicate")
def batch_normalized_reward(completions: list[str], solution: list[str], **kwargs: Any) -> list[float]:
    """Raw scores standardised with the global batch's mean and standard deviation."""
    raw = [raw_score(c, s) for c, s in zip(completions, solution, strict=True)]
    if not raw:
        return []
    mean = sum(raw) / len(raw)
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / len(raw))
    return [(x - mean) / (std + 1e-6) for x in raw]


# --------------------------------------------------------------------------- demo on local ranks


def make_batch(num_prompts: int = 5) -> dict[str, list[str]]:
    """A global batch: K completions per arithmetic prompt, some right, some wrong, of varying length."""
    completions, solution = [], []
    for p in range(num_prompts):
        a, b = 3 + p, 7 + 2 * p
        for j in range(K):
            answer = a + b if (p + j) % 3 else a + b + 1
            completions.append("Let me add. " * ((p * j) % 4) + f"{a} + {b} = {answer}")
            solution.append(str(a + b))
    return {"completions": completions, "solution": solution}


def local_slice(batch: dict[str, list[str]], rank: int, world_size: int) -> dict[str, list[str]]:
    n = len(batch["completions"])
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    return {key: value[lo:hi] for key, value in batch.items()}


def run(rank: int, world_size: int) -> dict[str, list[float]]:
    """Each rank: the synced reward on its rows, and (for comparison) the plain function on its rows only."""
    mine = local_slice(make_batch(), rank, world_size)
    return {"synced": batch_normalized_reward(**mine), "per_rank": batch_normalized_reward.__wrapped__(**mine)}


def main(world_size: int = 2) -> list[float]:
    from syncreward.testing import run_ranks

    parts = run_ranks(run, world_size)
    synced = [r for p in parts for r in p["synced"]]
    per_rank = [r for p in parts for r in p["per_rank"]]
    expected = batch_normalized_reward.__wrapped__(**make_batch())
    print(
        f"{world_size} ranks: synced mean {sum(synced) / len(synced):+.3f}, per-rank max drift "
        f"{max(abs(a - b) for a, b in zip(per_rank, synced, strict=True)):.3f}"
    )
    print("synced == single-process reference:", all(math.isclose(a, b) for a, b in zip(synced, expected, strict=True)))
    return synced


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    main(parser.parse_args().ranks)
