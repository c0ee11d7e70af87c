"""VisualQuality-R1's fidelity reward for TRL's ``GRPOTrainer``, synced across ranks with syncreward.

The reward of an answer compares its predicted score with the *other images* of the batch (see
``fidelity.py`` for the formula and the port). In the original code that batch is whatever sits on the same
GPU, so an image is compared with 1 or 7 others depending on the launch configuration, and the reward changes
with the sharding. Wrapped with ``@synced_reward``, every rank's samples are gathered in rank order (the order
TRL's ``gather`` uses), the reward is computed once on the global generation batch, and each rank gets back
the rewards of its own samples. An image whose K completions were split across two ranks is scored whole.

Why ``mode="main"`` and not ``mode="shard"``: shard mode spreads whole *groups* (one image's K completions)
over the ranks and scores each rank's share separately, which is right for rewards that only compare the K
completions of one prompt. This reward compares each image with *every other image*, so it needs the whole
batch in one call: shard mode would shrink the comparison set again. The cost is small (B^2 * K floats for B
images), so scoring once on rank 0 is fine.

How K reaches the reward: TRL calls reward functions with the batch columns only, never with
``num_generations``. :func:`make_fidelity_reward` takes K once, when you build the trainer, and returns a
synced reward function named ``fidelity_reward`` (TRL logs it as ``rewards/fidelity_reward/mean``)::

    from reward import make_fidelity_reward

    args = GRPOConfig(num_generations=8, ...)
    trainer = GRPOTrainer(model=..., args=args, train_dataset=...,
                          reward_funcs=[make_fidelity_reward(args.num_generations), format_reward])

K must be the K of the batches the reward sees: leave ``GRPOConfig.num_generations_eval`` unset (or equal to
``num_generations``) when evaluating with this reward. A wrong K is usually caught: the global batch must be a
whole number of images and each image's K rows must share one ``solution``.

Only the columns the reward names travel between ranks (``completions``, ``solution`` and, with
``by_dataset=True``, ``dataset_name``); the prompts, token ids and PIL images TRL also passes stay local.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

# fidelity.py lives next to this file; make it importable however this file is loaded. In your own project,
# put both files in a package and import fidelity normally.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from fidelity import Completion, fidelity_rewards  # noqa: E402

from syncreward import synced_reward  # noqa: E402

__all__ = ["make_fidelity_reward"]


def make_fidelity_reward(
    num_generations: int,
    *,
    by_dataset: bool = False,
    name: str = "fidelity_reward",
    timeout: float = 1800.0,
) -> Callable[..., list[float]]:
    """Build the synced fidelity reward for a trainer that samples ``num_generations`` answers per image.

    Args:
        num_generations: K, the number of completions per image (``GRPOConfig.num_generations``). The K
            completions of one image are K consecutive rows of the global batch, as TRL produces them.
        by_dataset: compare an image only with images of the same ``dataset_name`` column (what the original
            effectively did on single-dataset GPUs; keeps multi-dataset training free of MOS-scale mixing). The
            training dataset must then have a ``dataset_name`` column.
        name: the function's ``__name__``/``__qualname__``; TRL logs the reward under this name.
        timeout: seconds a rank waits for the others in one exchange (syncreward's ``timeout``).

    Returns:
        ``reward(completions, solution, [dataset_name,] **kwargs) -> list[float]``, a synced function that
        TRL can call on every rank; one reward per local completion.

    Raises:
        ValueError: ``num_generations`` is not a positive int.
    """
    if isinstance(num_generations, bool) or not isinstance(num_generations, int) or num_generations < 1:
        raise ValueError(f"num_generations must be a positive int, got {num_generations!r}")
    k = num_generations

    if by_dataset:

        def reward(
            completions: Sequence[Completion],
            solution: Sequence[str | float],
            dataset_name: Sequence[Hashable] | None = None,
            **kwargs: Any,
        ) -> list[float]:
            if dataset_name is None:
                raise ValueError(
                    f"{name} was built with by_dataset=True, but the batch has no 'dataset_name' column; add one to "
                    "the dataset or build the reward with by_dataset=False"
                )
            return fidelity_rewards(completions, solution, k, dataset_name)

    else:

        def reward(  # type: ignore[misc]
            completions: Sequence[Completion], solution: Sequence[str | float], **kwargs: Any
        ) -> list[float]:
            return fidelity_rewards(completions, solution, k)

    reward.__name__ = reward.__qualname__ = name
    scope = "images of the same dataset_name" if by_dataset else "other images"
    reward.__doc__ = (
        f"VisualQuality-R1 fidelity reward, K={k}: each answer is scored against the {scope} of the global batch."
    )
    # include=(): besides the named columns, no **kwargs column (prompts, completion_ids, PIL images) is exchanged.
    return synced_reward(mode="main", include=(), timeout=timeout)(reward)
