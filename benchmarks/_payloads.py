"""Deterministic benchmark payloads: what a TRL reward function receives on one rank.

Every payload has the four per-sample columns a GRPO math reward typically gets from TRL:
``completions`` (text), ``completion_ids`` (token-id lists), ``solution`` and ``dataset_name`` (strings).

* ``trl``: 64 completions of ~1 KB text per rank, ~250 token ids each (about 4 bytes of text per token).
* ``trl16``: the ``trl`` sample shape with 16 completions per rank (a small step, where fixed costs show).
* ``large``: 256 completions of ~4 KB per rank, ~1000 token ids each.
* ``skewed``: the ``trl`` sample shape, but rank 1 holds 8x the samples (512) and rank 0 -- the scoring
  rank -- holds none; the other ranks hold 64.
* ``judge``: the shard-mode throughput case: 32 samples per rank (16 groups of 8 over 4 ranks).
* ``trlcall``: TRL's real call with long completions (``_trl_call``): 64 completions of ~8 KB text per
  rank, ~2000 token ids each, and every column TRL passes; the reward reads two of them.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["PAYLOADS", "local_count", "make_batch"]

PAYLOADS = ("trl", "trl16", "large", "skewed", "trlcall")
VOCAB = 151_936  # Qwen2 tokenizer size: most ids need 5 bytes in pickle, 8 in int64
_VOCABULARY = (
    "the of and to in is that for it as with be on by this are we which from at or an have not can so if then "
    "therefore let solve equation number answer value step first second total sum product x y z n k because "
    "since thus hence compute find given gives equals multiply divide subtract add"
)
_WORDS = tuple(_VOCABULARY.split())

_SHAPES = {
    "trl": (64, 1024, 250),
    "trl16": (16, 1024, 250),
    "large": (256, 4096, 1000),
    "skewed": (64, 1024, 250),
    "judge": (32, 1024, 250),
    "trlcall": (64, 8192, 2000),
}


def local_count(payload: str, rank: int, world_size: int) -> int:
    n = _SHAPES[payload][0]
    if payload == "skewed":
        if rank == 0:
            return 0
        if rank == 1:
            return 8 * n
    return n


def _text(rng: random.Random, size: int) -> str:
    words: list[str] = []
    length = 0
    while length < size:
        w = rng.choice(_WORDS)
        words.append(w)
        length += len(w) + 1
    return " ".join(words)[:size]


def make_batch(payload: str, rank: int, world_size: int) -> dict[str, Any]:
    """The per-sample columns of one rank (same bytes on every run)."""
    _, text_bytes, n_ids = _SHAPES[payload]
    n = local_count(payload, rank, world_size)
    rng = random.Random(f"{payload}/{rank}/{world_size}")
    completions, ids, solutions = [], [], []
    for _ in range(n):
        size = int(text_bytes * rng.uniform(0.8, 1.2))
        answer = str(rng.randrange(1000))
        completions.append(_text(rng, size - 20) + f" answer: {answer}")
        k = int(n_ids * rng.uniform(0.8, 1.2))
        ids.append([rng.randrange(VOCAB) for _ in range(k)])
        solutions.append(answer if rng.random() < 0.5 else str(rng.randrange(1000)))
    return {
        "completions": completions,
        "completion_ids": ids,
        "solution": solutions,
        "dataset_name": ["openai/gsm8k"] * n,
    }
