"""Ray actors as ranks: one synced reward over a group of rollout workers.

Each worker actor generates its own slice of the batch and calls the reward with its local samples, as
it would alone. ``@synced_reward(backend="ray")`` concatenates the members' samples in rank order,
scores the global batch once (on rank 0, ``mode="main"``), and hands each member its own slice.

Copy the three marked steps into your code:

1. decorate the reward with ``backend="ray"``;
2. ``join(group, rank, world_size)`` once in each member actor (its ``__init__``);
3. have **every** member make the same synced calls, in the same order (an empty slice is fine).

Run on CPU, from a checkout:  ``pip install -e ".[ray]" && python examples/ray_actors.py``
"""

from __future__ import annotations

import random
from typing import Any

import ray

from syncreward import synced_reward
from syncreward.backends.ray import join

WORLD_SIZE = 3  # member actors
K = 4  # completions per prompt
GROUP = "rewards"  # any name; unique per group of members within the Ray job


# Step 1: the reward sees the global batch; ``num_generations``-style groups of K consecutive rows may
# straddle two workers, which is exactly what a per-worker reward would get wrong.
@synced_reward(backend="ray")
def group_relative_length(completions: list[str], **kwargs: Any) -> list[float]:
    """Length minus the mean length of the completion's group of K (standardised over the batch)."""
    rewards = []
    for i, c in enumerate(completions):
        group = completions[i - i % K : i - i % K + K]
        rewards.append(len(c) - sum(map(len, group)) / len(group))
    scale = max(abs(r) for r in rewards) or 1.0
    return [r / scale for r in rewards]


@ray.remote(num_cpus=0)  # num_cpus=0 only so the demo fits any laptop; give real workers their resources
class RolloutWorker:
    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.rng = random.Random(rank)
        # Step 2: join the group once, before the first synced call. The first member to join creates the
        # group's coordinator actor; the others find it by name.
        join(GROUP, rank, world_size)

    def generate(self, step: int) -> list[str]:
        """Stand-in for sampling: an uneven number of rows per worker (one gets none at step 1)."""
        n = 0 if (step, self.rank) == (1, 1) else self.rng.randint(2, 6)
        return ["x" * self.rng.randint(1, 40) for _ in range(n)]

    def step(self, step: int) -> tuple[list[str], list[float], list[float]]:
        completions = self.generate(step)
        # Step 3: every member calls, with its own samples; the call returns this member's rewards.
        rewards = group_relative_length(completions)
        # For comparison only: the plain function on this member's rows alone (no syncreward).
        alone = group_relative_length.__wrapped__(completions) if completions else []
        return completions, rewards, alone


def main() -> None:
    ray.init(num_cpus=2, include_dashboard=False)  # or ray.init(address="auto") on a cluster
    workers = [RolloutWorker.remote(rank, WORLD_SIZE) for rank in range(WORLD_SIZE)]
    for step in range(3):
        # launch every member's step together: a member waits in the synced call for the others
        results = ray.get([w.step.remote(step) for w in workers])
        everything = [c for completions, _, _ in results for c in completions]
        expected = group_relative_length.__wrapped__(everything)  # the plain function, global batch
        got = [r for _, rewards, _ in results for r in rewards]
        alone = [r for _, _, per_worker in results for r in per_worker]
        assert got == expected, (got, expected)
        drift = max(abs(a - b) for a, b in zip(alone, got, strict=True))
        print(
            f"step {step}: rows per worker {[len(c) for c, _, _ in results]}, synced rewards match the global batch;"
            f" per-worker scoring would differ by up to {drift:.3f}"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
