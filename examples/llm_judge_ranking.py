"""Group-relative LLM-judge ranking: an async judge ranks the K completions of each prompt.

The judge sees all K completions of a prompt at once and ranks them; the reward is the normalised rank
(best = 1, worst = 0). TRL puts the K completions of a prompt on consecutive rows, but with
``per_device_train_batch_size`` not a multiple of K a group is split across ranks and a per-rank judge would
rank half a group. ``mode="shard"`` with ``group_size=K`` gives every group, whole, to one rank; the ranks
judge their shares concurrently and each gets back the rewards of its own rows.

``async def`` rewards are awaited by TRL's GRPOTrainer (concurrently with other async rewards); while the
judge request is in flight, the event loop stays free. Replace ``judge`` with your API client.

Run: ``python examples/llm_judge_ranking.py`` (2 local CPU ranks) or ``--ranks 3``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from syncreward import synced_reward

K = 4  # GRPOConfig.num_generations: completions per prompt, consecutive in the batch


async def judge(prompt: str, answers: list[str]) -> list[float]:
    """Stub LLM judge: one score per answer (higher is better). Swap in a real API call."""
    await asyncio.sleep(0.01)  # the network round trip
    # Pretend the judge likes answers that mention the prompt's topic and explain themselves, in few words.
    topic = prompt.split()[-1].strip("?").lower()
    return [(topic in a.lower()) + 0.5 * ("because" in a) - 0.01 * len(a.split()) for a in answers]


@synced_reward(mode="shard", group_size=K)
async def judge_ranking_reward(prompts: list[str], completions: list[str], **kwargs: Any) -> list[float]:
    """Normalised rank of each completion among the K of its prompt, by the judge. Sees whole groups."""
    starts = range(0, len(completions), K)
    scores = await asyncio.gather(*(judge(prompts[s], completions[s : s + K]) for s in starts))
    rewards: list[float] = []
    for group in scores:
        order = sorted(range(len(group)), key=lambda i: (group[i], -i))  # ties: earlier completion ranks higher
        rank = {i: r for r, i in enumerate(order)}
        rewards += [rank[i] / max(len(group) - 1, 1) for i in range(len(group))]
    return rewards


# --------------------------------------------------------------------------- demo on local ranks


def make_batch(num_prompts: int = 5) -> dict[str, list[str]]:
    """A global batch as TRL builds it: each prompt repeated K times, K different completions."""
    topics = ["rust", "tides", "bread", "jazz", "orbits", "moss"]
    styles = [
        "It depends on {t}.",
        "{t} works because of pressure and time.",
        "No idea.",
        "Think of {t} as a slow process, because energy flows from high to low and everything settles.",
    ]
    prompts, completions = [], []
    for p in range(num_prompts):
        topic = topics[p % len(topics)]
        for j in range(K):
            prompts.append(f"Explain {topic}?")
            completions.append(styles[(p + j) % len(styles)].format(t=topic))
    return {"prompts": prompts, "completions": completions}


def local_slice(batch: dict[str, list[str]], rank: int, world_size: int) -> dict[str, list[str]]:
    """This rank's contiguous share of the rows (groups may be cut at rank boundaries)."""
    n = len(batch["completions"])
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    return {key: value[lo:hi] for key, value in batch.items()}


def run(rank: int, world_size: int) -> dict[str, list[float]]:
    """What each rank does: call the synced reward on its own rows, as TRL would (and, for comparison, the
    plain function on those rows alone: what per-rank scoring gives)."""
    mine = local_slice(make_batch(), rank, world_size)
    return {
        "synced": asyncio.run(judge_ranking_reward(**mine)),
        "per_rank": asyncio.run(judge_ranking_reward.__wrapped__(**mine)),
    }


def main(world_size: int = 2) -> list[float]:
    from syncreward.testing import run_ranks

    parts = run_ranks(run, world_size)
    synced = [r for p in parts for r in p["synced"]]
    per_rank = [r for p in parts for r in p["per_rank"]]  # what each rank would score on its own rows
    expected = asyncio.run(judge_ranking_reward.__wrapped__(**make_batch()))
    print(f"{world_size} ranks, rewards per group of {K} (synced, then per-rank scoring without syncreward):")
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
