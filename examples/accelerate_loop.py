"""An accelerate training loop (no TRL) with a synced batch-relative reward.

Same toy as ``torchrun_loop.py``, written the accelerate way: ``Accelerator`` sets up the processes,
``prepare`` wraps model and optimiser, ``accelerator.backward`` averages gradients. The reward ranks each
completion against the whole generation batch (its percentile among all scores), so it needs every rank's
rows. ``@synced_reward`` detects accelerate's state by itself (``backend="auto"``).

Run:  ``accelerate launch --num_processes 2 --multi_gpu examples/accelerate_loop.py``   (or plain ``python``)

On a machine without GPUs the same command runs 2 CPU processes over gloo: ``--multi_gpu`` only selects
accelerate's torch.distributed launcher, and the script asks for the CPU when CUDA is missing. Note that
``accelerate launch --cpu --num_processes 2`` starts ONE process (accelerate's "simple launcher" only starts
several CPU processes through mpirun with ``--mpirun_hostfile``); the loop then runs unsynced on one rank,
which is correct but not distributed.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import gather_object

from syncreward import resolve_backend, synced_reward

K = 4  # completions per prompt
PROMPTS_PER_STEP = 3  # global batch: 3 * K = 12 rows
NUM_PROMPTS, VOCAB, LENGTH, STEPS = 5, 8, 6, 3


def score(tokens: list[int], target: int) -> float:
    """Fraction of tokens equal to the prompt's target token."""
    return sum(t == target for t in tokens) / len(tokens)


@synced_reward
def percentile_reward(completions: list[list[int]], target: list[int], **kwargs: Any) -> list[float]:
    """Share of the batch's completions this completion beats (ties count half), centred: in [-0.5, 0.5]."""
    scores = [score(c, t) for c, t in zip(completions, target, strict=True)]
    n = len(scores)
    return [
        (sum(s > o for o in scores) + 0.5 * (sum(s == o for o in scores) - 1)) / max(n - 1, 1) - 0.5 for s in scores
    ]


def main() -> None:
    accelerator = Accelerator(cpu=not torch.cuda.is_available())  # gloo on CPU-only machines
    rank, world = accelerator.process_index, accelerator.num_processes
    torch.manual_seed(0)
    policy = torch.nn.Embedding(NUM_PROMPTS, VOCAB)  # logits over the vocabulary, per prompt
    model, optimizer = accelerator.prepare(policy, torch.optim.SGD(policy.parameters(), lr=1.0))
    generator = torch.Generator().manual_seed(1234 + rank)

    for step in range(STEPS):
        # The global batch: prompt p repeated K times; this process holds a contiguous slice of the rows.
        prompt_ids = [(step * PROMPTS_PER_STEP + p) % NUM_PROMPTS for p in range(PROMPTS_PER_STEP) for _ in range(K)]
        n = len(prompt_ids)
        mine = torch.tensor(prompt_ids[rank * n // world : (rank + 1) * n // world], device=accelerator.device)
        logits = model(mine)  # [rows, VOCAB]
        tokens = torch.multinomial(torch.softmax(logits.detach(), -1), LENGTH, replacement=True, generator=generator)
        completions = tokens.tolist()
        targets = [p % VOCAB for p in mine.tolist()]

        rewards = percentile_reward(completions=completions, target=targets)  # this process's rows only

        log_probs = torch.log_softmax(logits, -1).gather(1, tokens)  # [rows, LENGTH]
        loss = -(torch.tensor(rewards, device=accelerator.device)[:, None] * log_probs).mean()
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()

        # Check (not needed in training): the synced rewards equal the plain function on the global batch.
        all_c, all_t, synced = gather_object(completions), gather_object(targets), gather_object(rewards)
        expected = percentile_reward.__wrapped__(all_c, all_t)
        if accelerator.is_main_process:
            backend = type(resolve_backend("auto")).__name__  # what backend="auto" picked
            print(
                f"step {step}: processes {world}, rows {len(synced)}, backend {backend}, "
                f"synced == plain(global batch): {synced == expected}",
                flush=True,
            )
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        print("done", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
