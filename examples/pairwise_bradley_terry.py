"""Pairwise preferences within a group, turned into rewards with a Bradley-Terry model.

A preference model (here a stub) compares every pair of completions of the same prompt and returns
P(a beats b). Fitting Bradley-Terry strengths to those soft wins gives one score per completion that uses
all K(K-1)/2 comparisons; the reward is the log-strength, centred within the group. All pairs of a group
must be in one call: with groups split across ranks, a per-rank function compares fewer pairs and fits
different strengths.

``mode="shard"`` with ``group_by="prompt_id"``: groups are the rows sharing a ``prompt_id`` (any per-sample
dataset column; TRL passes every dataset column to reward functions), each handed whole to one rank, so the
O(K^2) judge calls are spread over the ranks. Use ``group_size=K`` instead when the dataset has no id.

Run: ``python examples/pairwise_bradley_terry.py`` (2 local CPU ranks) or ``--ranks 3``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from syncreward import synced_reward

K = 4  # GRPOConfig.num_generations (only used to build the demo batch)


def prefer(a: str, b: str) -> float:
    """Stub preference model: P(a is better than b). Likes concrete numbers, dislikes rambling."""

    def quality(text: str) -> float:
        return 0.3 * sum(ch.isdigit() for ch in text) - 0.05 * len(text.split())

    return 1.0 / (1.0 + math.exp(quality(b) - quality(a)))


def bradley_terry(wins: list[list[float]], iters: int = 200) -> list[float]:
    """Log-strengths from a matrix of soft wins (wins[i][j] = P(i beats j)), by Hunter's MM updates."""
    n = len(wins)
    strength = [1.0] * n
    for _ in range(iters):
        new = []
        for i in range(n):
            won = sum(wins[i][j] for j in range(n) if j != i)
            games = sum(1.0 / (strength[i] + strength[j]) for j in range(n) if j != i)
            new.append(won / games if games else 1.0)
        log_mean = sum(math.log(s) for s in new) / n
        strength = [s / math.exp(log_mean) for s in new]  # fix the scale: geometric mean 1
    return [math.log(s) for s in strength]


@synced_reward(mode="shard", group_by="prompt_id")
def bradley_terry_reward(completions: list[str], prompt_id: list[int], **kwargs: Any) -> list[float]:
    """Centred Bradley-Terry log-strength of each completion among the completions of its prompt."""
    groups: dict[int, list[int]] = defaultdict(list)
    for row, pid in enumerate(prompt_id):
        groups[pid].append(row)
    rewards = [0.0] * len(completions)
    for rows in groups.values():
        if len(rows) < 2:
            continue  # nothing to compare with: reward 0
        wins = [[prefer(completions[i], completions[j]) if i != j else 0.0 for j in rows] for i in rows]
        for row, value in zip(rows, bradley_terry(wins), strict=True):
            rewards[row] = value
    return rewards


# --------------------------------------------------------------------------- demo on local ranks


def make_batch(num_prompts: int = 5) -> dict[str, list[Any]]:
    templates = [
        "The answer is {x}.",
        "Hmm, I would say it is probably around {x}, give or take, but it is hard to be sure.",
        "{x}, since {y} + {z} = {x}.",
        "I think it is a large number.",
    ]
    completions, prompt_id = [], []
    for p in range(num_prompts):
        y, z = 10 + p, 25 + 3 * p
        for j in range(K):
            completions.append(templates[(p + j) % len(templates)].format(x=y + z, y=y, z=z))
            prompt_id.append(1000 + p)
    return {"completions": completions, "prompt_id": prompt_id}


def local_slice(batch: dict[str, list[Any]], rank: int, world_size: int) -> dict[str, list[Any]]:
    n = len(batch["completions"])
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    return {key: value[lo:hi] for key, value in batch.items()}


def run(rank: int, world_size: int) -> dict[str, list[float]]:
    """Each rank: the synced reward on its rows, and (for comparison) the plain function on its rows only."""
    mine = local_slice(make_batch(), rank, world_size)
    return {"synced": bradley_terry_reward(**mine), "per_rank": bradley_terry_reward.__wrapped__(**mine)}


def main(world_size: int = 2) -> list[float]:
    from syncreward.testing import run_ranks

    parts = run_ranks(run, world_size)
    synced = [r for p in parts for r in p["synced"]]
    per_rank = [r for p in parts for r in p["per_rank"]]  # what each rank would score on its own rows
    expected = bradley_terry_reward.__wrapped__(**make_batch())
    print(f"{world_size} ranks, Bradley-Terry rewards per prompt (synced, then per-rank scoring without syncreward):")
    for s in range(0, len(synced), K):
        ours, theirs = [round(r, 3) for r in synced[s : s + K]], [round(r, 3) for r in per_rank[s : s + K]]
        print(f"   {ours}   per-rank: {theirs}{'' if ours == theirs else '   <- differs'}")
    drift = max(abs(a - b) for a, b in zip(per_rank, synced, strict=True))
    print(f"per-rank scoring differs from the global-batch rewards by up to {drift:.3f}")
    print("synced == single-process reference:", all(math.isclose(a, b) for a, b in zip(synced, expected, strict=True)))
    return synced


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    main(parser.parse_args().ranks)
