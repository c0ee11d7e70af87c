"""Run under `accelerate launch --cpu --num_processes N`: synced rewards through the accelerate backend."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from accelerate import Accelerator

import syncreward
from syncreward import synced_reward
from syncreward.backends.accelerate import AccelerateBackend


def relative_length(completions, **kwargs):
    mean = sum(map(len, completions)) / len(completions)
    return [len(c) - mean for c in completions]


async def async_relative_length(completions, **kwargs):
    await asyncio.sleep(0.01)
    return relative_length(completions)


def raises_on_rank_1(completions, **kwargs):
    if os.environ["RANK"] == "1":
        raise RuntimeError("judge unavailable")
    return [0.0] * len(completions)


def main() -> None:
    accelerator = Accelerator(cpu=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    completions = [f"r{rank}" + "x" * i for i in range(rank + 2)]  # uneven: 2, 3, ...
    backend = syncreward.resolve_backend("auto")
    out = {
        "rank": rank,
        "backend": type(backend).__name__,
        "completions": completions,
        "main": synced_reward(relative_length)(completions),
        "replicate": synced_reward(mode="replicate")(relative_length)(completions),
        "async": asyncio.run(synced_reward(backend="accelerate")(async_relative_length)(completions)),
    }
    try:
        synced_reward(mode="replicate")(raises_on_rank_1)(completions)
        out["error"] = None
    except Exception as e:
        out["error"] = [type(e).__name__, getattr(e, "origin_rank", None)]
    out["is_accelerate_backend"] = isinstance(backend, AccelerateBackend)
    # one file per rank: lines the ranks print to a shared stdout can interleave
    with open(os.path.join(os.environ["SYNCREWARD_JOB_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    sys.exit(main())
