"""``python -m syncreward demo``: a ranking reward on N local CPU ranks, unsynced vs synced.

The reward is VisualQuality-R1's fidelity reward (``examples/visualquality_r1/fidelity.py`` has the full,
documented port; this is a compact copy for numeric scores, since ``examples/`` is not installed). Each image
gets K predicted quality scores; an answer's reward compares its score with every *other* image of the batch::

    r_ij = mean over z != i of  sqrt(p * gt + eps) + sqrt((1 - p) * (1 - gt) + eps)
    p    = Phi((q_ij - mu_z) / sqrt(var_i + var_z + eps)),  gt = [MOS_i > MOS_z] (0.5 if equal)

Per rank, "every other image" is only the images on that rank; synced, it is the global batch.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ._decorator import synced_reward

__all__ = ["fidelity", "fidelity_reward", "make_batch", "run_demo"]

EPS = 1e-6
FloatArray = npt.NDArray[np.float64]
_erf = np.vectorize(math.erf, otypes=[np.float64])
_TIMED_CALLS = 10


def fidelity(scores: FloatArray, mos: FloatArray) -> FloatArray:
    """Fidelity rewards ``[B, K]`` for predicted ``scores [B, K]`` and ground-truth ``mos [B]``.

    Same math as the example's ``fidelity_rewards`` for parseable answers without ``dataset_name``: unbiased
    variance (0 when K == 1), and reward 0.0 for an image with no other image to compare with.
    """
    b, k = scores.shape
    if b < 2:
        return np.zeros((b, k))
    mu = scores.mean(axis=1)
    var = scores.var(axis=1, ddof=1) if k > 1 else np.zeros(b)
    x = (scores[:, :, None] - mu[None, None, :]) / np.sqrt(var[:, None, None] + var[None, None, :] + EPS)
    p = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))  # [i, j, z]
    gt = np.where(mos[:, None] > mos[None, :], 1.0, np.where(mos[:, None] < mos[None, :], 0.0, 0.5))[:, None, :]
    pair = np.sqrt(p * gt + EPS) + np.sqrt((1.0 - p) * (1.0 - gt) + EPS)
    others = ~np.eye(b, dtype=bool)[:, None, :]
    result: FloatArray = np.where(others, pair, 0.0).sum(axis=2) / (b - 1)
    return result


def fidelity_reward(scores: Sequence[float], mos: Sequence[float], num_generations: int) -> list[float]:
    """Per-completion rewards; ``scores`` and ``mos`` are per-sample columns, K consecutive rows per image."""
    s = np.asarray(scores, dtype=np.float64).reshape(-1, num_generations)
    m = np.asarray(mos, dtype=np.float64)[::num_generations]
    return [float(r) for r in fidelity(s, m).reshape(-1)]


synced_fidelity_reward = synced_reward(fidelity_reward)


def make_batch(images: int, generations: int, seed: int) -> dict[str, list[float]]:
    """A synthetic global batch: MOS in [1, 5], K noisy predicted scores per image, K consecutive rows each."""
    rng = np.random.default_rng(seed)
    mos = np.round(rng.uniform(1, 5, images), 2)
    scores = np.clip(np.round(mos[:, None] + rng.normal(0, 0.7, (images, generations)), 2), 1, 5)
    return {"scores": scores.reshape(-1).tolist(), "mos": np.repeat(mos, generations).tolist()}


def _rank(rank: int, world_size: int, images: int, generations: int, seed: int) -> dict[str, Any]:
    """One rank: its slice of the batch, scored unsynced (alone) and synced (global batch), timed."""
    batch = make_batch(images, generations, seed)
    n = images * generations // world_size
    mine = {key: values[rank * n : (rank + 1) * n] for key, values in batch.items()}
    unsynced = fidelity_reward(mine["scores"], mine["mos"], generations)
    synced = synced_fidelity_reward(mine["scores"], mine["mos"], generations)  # first call also sets up groups
    times = []
    for _ in range(_TIMED_CALLS):
        start = time.perf_counter()
        again = synced_fidelity_reward(mine["scores"], mine["mos"], generations)
        times.append(time.perf_counter() - start)
        assert again == synced
    return {"unsynced": unsynced, "synced": synced, "ms": 1000 * statistics.median(times)}


def _span(first: int, last: int) -> str:
    return str(first) if first == last else f"{first}-{last}"


def run_demo(ranks: int = 4, images: int = 8, generations: int = 4, seed: int = 0) -> bool:
    """Run the demo and print its table. Returns whether synced matched the reference on every rank.

    Raises:
        ValueError: invalid sizes (each rank must hold whole images, for the unsynced baseline).
    """
    from .testing import run_ranks

    if ranks < 1 or images < 1 or generations < 1:
        raise ValueError("--ranks, --images and --generations must be positive")
    if images % ranks:
        raise ValueError(
            f"--images ({images}) must be a multiple of --ranks ({ranks}) so that each rank holds whole images, "
            "which the unsynced baseline needs (the synced reward itself also handles images split across ranks)"
        )
    per_rank = images // ranks
    batch = make_batch(images, generations, seed)
    reference = fidelity_reward(batch["scores"], batch["mos"], generations)
    on = f"{ranks} local CPU rank{'s' if ranks > 1 else ''}"
    print(f"syncreward demo: VisualQuality-R1 fidelity reward on {on} (torch.distributed, gloo)")
    print(f"{images} images x {generations} generations = {images * generations} completions, "
          f"{per_rank * generations} per rank, seed {seed}. Starting ranks...", flush=True)  # fmt: skip
    started = time.perf_counter()
    results = run_ranks(_rank, ranks, images, generations, seed, timeout=60.0 + 20.0 * ranks)
    elapsed = time.perf_counter() - started

    header = ("rank", "images", "compared with (unsynced -> synced)", "max |unsynced - global|", "synced == reference",
              "ms/call")  # fmt: skip
    rows = []
    all_equal, drift, diffs = True, 0.0, []
    for r, res in enumerate(results):
        lo = r * per_rank * generations
        ref = np.asarray(reference[lo : lo + per_rank * generations])
        equal = bool(np.allclose(res["synced"], ref, rtol=1e-12, atol=0.0))
        diffs.extend(np.abs(np.asarray(res["unsynced"]) - ref).tolist())
        diff = float(np.max(np.abs(np.asarray(res["unsynced"]) - ref)))
        all_equal &= equal
        drift = max(drift, diff)
        rows.append(
            (
                str(r),
                _span(r * per_rank, (r + 1) * per_rank - 1),
                f"{per_rank - 1} -> {images - 1} other images",
                f"{diff:.4f}",
                str(equal),
                f"{res['ms']:.2f}",
            )
        )
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    print()
    for row in (header, *rows):
        print(
            "  ".join(
                cell.ljust(w) if i == 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    print()
    if ranks == 1:
        print("Unsynced: with one rank, the rank's batch is the global batch, so there is nothing to sync and no "
              "drift. Run with --ranks 2 or more to see the difference.")  # fmt: skip
        where = "the single rank"
    else:
        mean = sum(diffs) / len(diffs)
        print(f"Unsynced: an image is compared only with the other images on its own rank ({per_rank - 1} instead of "
              f"{images - 1}); the rewards, which lie between 0 and 1, drift from the global-batch rewards by up to "
              f"{drift:.4f} ({100 * drift:.0f} % of that range; mean {mean:.4f}).")  # fmt: skip
        where = f"all {ranks} ranks"
    print(f"Synced: rewards equal the single-process reference on {where}: {all_equal}. "
          f"Median synced call {statistics.median(r['ms'] for r in results):.2f} ms "
          f"(whole run {elapsed:.1f} s, process start-up included).")  # fmt: skip
    return all_equal
