"""Diversity across a group: reward completions that differ from the other completions of their prompt.

The reward of a completion is one minus its mean Jaccard similarity (over word sets) to the other K-1
completions of the same prompt. When TRL splits a prompt's K completions across ranks, a per-rank function
would compare each completion with only the few siblings on its own GPU.

Default ``mode="main"``: rank 0 scores the global batch once and sends each rank its rewards. The K
completions of a prompt are K consecutive rows of the global batch (TRL's order), which is all this needs.

Run: ``python examples/diversity.py`` (2 local CPU ranks) or ``--ranks 3``.
"""

from __future__ import annotations

from typing import Any

from syncreward import synced_reward

K = 4  # GRPOConfig.num_generations: completions per prompt, consecutive in the batch


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


@synced_reward
def diversity_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """1 - mean word-set Jaccard similarity to the other completions of the same prompt (K consecutive rows)."""
    words = [set(c.lower().split()) for c in completions]
    rewards = []
    for i in range(len(completions)):
        start = i - i % K
        others = [j for j in range(start, min(start + K, len(completions))) if j != i]
        rewards.append(1.0 - sum(jaccard(words[i], words[j]) for j in others) / len(others) if others else 0.0)
    return rewards


# --------------------------------------------------------------------------- demo on local ranks


def make_batch(num_prompts: int = 5) -> dict[str, list[str]]:
    phrases = ["a cat sat on the mat", "the cat sat on a mat", "dogs bark at night", "a cat on the mat sat"]
    completions = [
        f"{phrases[(p * j + j) % 4]} {'again' * (j == 2)}".strip() for p in range(num_prompts) for j in range(K)
    ]
    return {"completions": completions, "prompts": [f"Write about animals #{i // K}" for i in range(len(completions))]}


def local_slice(batch: dict[str, list[str]], rank: int, world_size: int) -> dict[str, list[str]]:
    n = len(batch["completions"])
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    return {key: value[lo:hi] for key, value in batch.items()}


def run(rank: int, world_size: int) -> dict[str, list[float]]:
    """Each rank: the synced reward on its rows, and (for comparison) the plain function on its rows only."""
    mine = local_slice(make_batch(), rank, world_size)
    return {"synced": diversity_reward(**mine), "per_rank": diversity_reward.__wrapped__(**mine)}


def main(world_size: int = 2) -> list[float]:
    from syncreward.testing import run_ranks

    parts = run_ranks(run, world_size)
    synced = [r for p in parts for r in p["synced"]]
    per_rank = [r for p in parts for r in p["per_rank"]]  # what each rank would score on its own rows
    expected = diversity_reward.__wrapped__(**make_batch())
    print(f"{world_size} ranks, diversity rewards per prompt (synced, then per-rank scoring without syncreward):")
    for s in range(0, len(synced), K):
        ours, theirs = [round(r, 3) for r in synced[s : s + K]], [round(r, 3) for r in per_rank[s : s + K]]
        print(f"   {ours}   per-rank: {theirs}{'' if ours == theirs else '   <- differs'}")
    drift = max(abs(a - b) for a, b in zip(per_rank, synced, strict=True))
    print(f"per-rank scoring differs from the global-batch rewards by up to {drift:.3f}")
    print("synced == single-process reference:", synced == expected)
    return synced


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    main(parser.parse_args().ranks)
