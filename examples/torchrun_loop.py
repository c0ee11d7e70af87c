"""A plain torchrun training loop (no TRL) with a synced group-relative reward.

Each step samples K completions for each of a few prompts from a toy policy, splits the rows over the
ranks (a prompt's K completions can land on two ranks), scores them with a leave-one-out reward (score
minus the mean score of the prompt's other completions) that needs the whole group, and takes a
REINFORCE step. ``@synced_reward`` finds the initialised ``torch.distributed`` job by itself
(``backend="auto"``); nothing else in the loop changes.

Run on CPU:  ``torchrun --nproc_per_node 2 examples/torchrun_loop.py``   (or plain ``python`` for one process)
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist

from syncreward import resolve_backend, synced_reward

K = 4  # completions per prompt
PROMPTS_PER_STEP = 3  # global batch: 3 * K = 12 rows
NUM_PROMPTS, VOCAB, LENGTH, STEPS = 5, 8, 6, 3


def score(tokens: list[int], target: int) -> float:
    """Fraction of tokens equal to the prompt's target token."""
    return sum(t == target for t in tokens) / len(tokens)


@synced_reward
def leave_one_out_reward(completions: list[list[int]], target: list[int], **kwargs: Any) -> list[float]:
    """Score minus the mean score of the other K-1 completions of the same prompt (K consecutive rows)."""
    scores = [score(c, t) for c, t in zip(completions, target, strict=True)]
    rewards = []
    for i, s in enumerate(scores):
        group = scores[i - i % K : i - i % K + K]
        rewards.append(s - (sum(group) - s) / (len(group) - 1))
    return rewards


def main() -> None:
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    torch.manual_seed(0)
    policy = torch.nn.Embedding(NUM_PROMPTS, VOCAB)  # logits over the vocabulary, per prompt
    model = torch.nn.parallel.DistributedDataParallel(policy) if distributed else policy
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    generator = torch.Generator().manual_seed(1234 + rank)

    for step in range(STEPS):
        # The global batch: prompt p repeated K times; this rank holds a contiguous slice of the rows.
        prompt_ids = [(step * PROMPTS_PER_STEP + p) % NUM_PROMPTS for p in range(PROMPTS_PER_STEP) for _ in range(K)]
        n = len(prompt_ids)
        mine = torch.tensor(prompt_ids[rank * n // world : (rank + 1) * n // world])
        logits = model(mine)  # [rows, VOCAB]
        tokens = torch.multinomial(torch.softmax(logits.detach(), -1), LENGTH, replacement=True, generator=generator)
        completions = tokens.tolist()
        targets = [p % VOCAB for p in mine.tolist()]

        rewards = leave_one_out_reward(completions=completions, target=targets)  # this rank's rows only

        advantages = torch.tensor(rewards)
        log_probs = torch.log_softmax(logits, -1).gather(1, tokens)  # [rows, LENGTH]
        loss = -(advantages[:, None] * log_probs).mean()
        optimizer.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks
        optimizer.step()

        # Check (not needed in training): the synced rewards equal the plain function on the global batch.
        everything: list[Any] = [None] * world
        if distributed:
            dist.all_gather_object(everything, (completions, targets, rewards))
        else:
            everything = [(completions, targets, rewards)]
        if rank == 0:
            all_c = [c for part in everything for c in part[0]]
            all_t = [t for part in everything for t in part[1]]
            synced = [r for part in everything for r in part[2]]
            expected = leave_one_out_reward.__wrapped__(all_c, all_t)
            backend = type(resolve_backend("auto")).__name__  # what backend="auto" picked
            print(
                f"step {step}: rows per rank {[len(p[2]) for p in everything]}, backend {backend}, "
                f"mean score {sum(score(c, t) for c, t in zip(all_c, all_t, strict=True)) / len(all_c):.3f}, "
                f"synced == plain(global batch): {synced == expected}",
                flush=True,
            )
    if distributed:
        dist.destroy_process_group()
    if rank == 0:
        print("done", flush=True)


if __name__ == "__main__":
    main()
