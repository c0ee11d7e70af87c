"""VisualQuality-R1 fidelity ("accuracy") reward, ported to pure numpy.

For image ``i`` with ``K`` sampled answers ``q_i1 .. q_iK`` the reward of answer
``j`` is the mean, over the other images ``z`` of the comparison set, of the
Thurstone-model fidelity

.. code-block:: text

    p    = Phi((q_ij - mu_z) / sqrt(var_i + var_z + EPS))
    r    = sqrt(p * gt + EPS) + sqrt((1 - p) * (1 - gt) + EPS)
    gt   = 1 if MOS_i > MOS_z, 0 if MOS_i < MOS_z, 0.5 if equal

where ``mu``/``var`` are the mean and unbiased variance of an image's predicted
scores and ``EPS = 1e-6``. This matches ``fidelity_reward``/``accuracy_reward``
in VisualQuality-R1's ``src/open-r1-multimodal/src/open_r1/grpo_jsonl.py``,
including the regexes used to read answers and solutions.

The original computes the reward on each GPU's local slice of the batch, so an
image is only compared with the images that happen to share its rank. Here the
comparison set is every other image of the batch that is passed in (the global
batch, when the caller gathers it first), optionally restricted to images with
the same ``dataset_name``.

Deviations from the original, all deterministic:

* Unparseable answer (no number found): the original substitutes
  ``random.randint(1, 5)`` (or ``random.uniform(1, 5)`` on an exception). Here
  the completion gets ``UNPARSEABLE_REWARD`` (0.0) and is left out of its
  image's mean/variance, which are computed from the parseable answers only.
* Fewer than two parseable answers for an image (in particular ``K == 1``): the
  original's ``torch.var`` is NaN and, with torch's argument validation, the
  CDF raises and the caught exception sets ``p = 0.5`` for every pair. Here the
  variance is taken as 0.
* No image to compare with (single image in the batch or in its dataset
  group, or every other image has no parseable answer): the original divides
  by zero. Here every completion of that image gets ``NO_COMPARISON_REWARD``
  (0.0); being constant within the group, it yields zero GRPO advantage.
  Images with no parseable answer at all are never used as comparators.
* Solutions without ``<answer>`` tags are read as a bare number (the original
  crashes), the tag content may span lines, numeric solutions are accepted,
  and an unreadable solution raises ``ValueError``. Non-finite parsed numbers
  count as unparseable.
* Completions may be plain strings or a single message dict as well as the
  conversational ``[{"role": "assistant", "content": ...}]`` the original
  requires (it reads ``completion[0]["content"]``).
* The batch is validated (length divisible by ``K``, solution and dataset
  name constant within each image); the original slices blindly.
* Arithmetic is float64 (original: float32) and plain floats are returned
  (original: 0-d tensors).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

EPS = 1e-6
"""Stabiliser used inside both square roots and the variance sum (as original)."""

UNPARSEABLE_REWARD = 0.0
"""Reward of a completion whose answer contains no number."""

NO_COMPARISON_REWARD = 0.0
"""Reward of every completion of an image that has no other image to compare with."""

Completion = str | Mapping[str, Any] | Sequence[Mapping[str, Any]]
"""A plain string, one message dict, or a conversational list of messages."""

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER_RE = re.compile(r"-?\d+(\.\d+)?")

FloatArray = npt.NDArray[np.float64]


def completion_text(completion: Completion) -> str:
    """Returns the text of one completion.

    Args:
        completion: A string, a message ``{"role": ..., "content": ...}``, or a
            list of messages, in which case the first message is used (as the
            original's ``completion[0]["content"]``). A content given as a list
            of parts contributes the concatenation of its text parts.

    Returns:
        The completion text; ``""`` for an empty message list or ``None``
        content.

    Raises:
        TypeError: If the completion has none of the accepted shapes.
    """
    if isinstance(completion, str):
        return completion
    message: Any = completion
    if isinstance(completion, Sequence):
        if len(completion) == 0:
            return ""
        message = completion[0]
    if not isinstance(message, Mapping):
        raise TypeError(f"unsupported completion type: {type(completion).__name__}")
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    raise TypeError(f"unsupported message content type: {type(content).__name__}")


def parse_score(text: str) -> float | None:
    """Reads the predicted quality score from a completion text.

    As in the original: take the last ``<answer>...</answer>`` block (or the
    whole text when there is none), then the first number matching
    ``-?\\d+(\\.\\d+)?`` in it.

    Args:
        text: The completion text.

    Returns:
        The score, or ``None`` when no finite number is found.
    """
    answers = _ANSWER_RE.findall(text)
    candidate = answers[-1].strip() if answers else text.strip()
    match = _NUMBER_RE.search(candidate)
    if match is None:
        return None
    value = float(match.group())
    return value if math.isfinite(value) else None


def parse_mos(solution: str | float) -> float:
    """Reads the ground-truth MOS from a ``solution`` entry.

    Args:
        solution: ``"<answer> MOS </answer>"``, a bare numeric string, or a
            number. The content of the first ``<answer>`` block must be a
            number in full (``float()``), as in the original.

    Returns:
        The MOS.

    Raises:
        ValueError: If no finite number can be read.
        TypeError: If ``solution`` is neither a string nor a number.
    """
    if isinstance(solution, bool) or not isinstance(solution, (str, numbers.Real)):
        raise TypeError(
            f"solution must be a string or a number, got {type(solution).__name__}"
        )
    if isinstance(solution, str):
        match = _ANSWER_RE.search(solution)
        raw = match.group(1).strip() if match else solution.strip()
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"cannot read a MOS from solution {solution!r}") from None
    else:
        value = float(solution)
    if not math.isfinite(value):
        raise ValueError(f"MOS must be finite, got {solution!r}")
    return value


def _prepare(
    completions: Sequence[Completion],
    solution: Sequence[str | float],
    num_generations: int,
    dataset_name: Sequence[Hashable] | None,
) -> tuple[list[list[float | None]], list[float], list[Hashable] | None]:
    """Validates a batch and parses it into per-image lists.

    Returns:
        ``(scores, mos, groups)``: ``scores[i][j]`` is the parsed score of
        answer ``j`` of image ``i`` (``None`` if unparseable), ``mos[i]`` the
        image's MOS and ``groups[i]`` its dataset name (``None`` when no
        ``dataset_name`` is given).
    """
    if (
        isinstance(num_generations, bool)
        or not isinstance(num_generations, int)
        or num_generations < 1
    ):
        raise ValueError(
            f"num_generations must be a positive int, got {num_generations!r}"
        )
    n = len(completions)
    if len(solution) != n:
        raise ValueError(f"got {n} completions but {len(solution)} solutions")
    if dataset_name is not None and len(dataset_name) != n:
        raise ValueError(f"got {n} completions but {len(dataset_name)} dataset names")
    if n % num_generations:
        raise ValueError(
            f"batch size {n} is not divisible by num_generations={num_generations}"
        )
    k = num_generations
    scores: list[list[float | None]] = []
    mos: list[float] = []
    groups: list[Hashable] | None = None if dataset_name is None else []
    for start in range(0, n, k):
        image = start // k
        values = [parse_mos(s) for s in solution[start : start + k]]
        if any(v != values[0] for v in values):
            raise ValueError(
                f"solution differs within the group of image {image} (rows {start}..{start + k - 1}): "
                f"{values}; rows of one image must be {k} consecutive completions"
            )
        mos.append(values[0])
        if groups is not None and dataset_name is not None:
            names = list(dataset_name[start : start + k])
            if any(name != names[0] for name in names):
                raise ValueError(
                    f"dataset_name differs within the group of image {image} (rows {start}..{start + k - 1}): {names}"
                )
            groups.append(names[0])
        scores.append(
            [parse_score(completion_text(c)) for c in completions[start : start + k]]
        )
    return scores, mos, groups


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _phi(x: FloatArray) -> FloatArray:
    """Standard normal CDF, elementwise."""
    result: FloatArray = 0.5 * (1.0 + _erf(x / math.sqrt(2.0)))
    return result


def fidelity_rewards(
    completions: Sequence[Completion],
    solution: Sequence[str | float],
    num_generations: int,
    dataset_name: Sequence[Hashable] | None = None,
) -> list[float]:
    """Computes VisualQuality-R1 fidelity rewards for a whole batch (vectorised).

    Args:
        completions: ``B * K`` completions; rows ``i*K .. i*K + K - 1`` are the
            ``K`` answers for image ``i``.
        solution: The matching ``solution`` column (``"<answer> MOS </answer>"``),
            constant within each image's ``K`` rows.
        num_generations: ``K``.
        dataset_name: Optional per-row dataset names, constant within each
            image; when given, an image is only compared with images of the
            same dataset.

    Returns:
        One reward per completion, in input order. See the module docstring
        for unparseable answers and images without comparators.

    Raises:
        ValueError: On inconsistent lengths, a batch size not divisible by
            ``num_generations``, a solution or dataset name that varies within
            an image's rows, or an unreadable solution.
    """
    scores, mos_list, groups = _prepare(
        completions, solution, num_generations, dataset_name
    )
    b, k = len(scores), num_generations
    if b == 0:
        return []
    preds = np.array(
        [[np.nan if s is None else s for s in row] for row in scores], dtype=np.float64
    )
    mos = np.asarray(mos_list, dtype=np.float64)
    valid = ~np.isnan(preds)
    n_valid = valid.sum(axis=1)
    has_stats = n_valid > 0
    filled = np.where(valid, preds, 0.0)
    mu = filled.sum(axis=1) / np.maximum(n_valid, 1)
    sq_dev = np.where(valid, (filled - mu[:, None]) ** 2, 0.0).sum(axis=1)
    var = np.where(n_valid >= 2, sq_dev / np.maximum(n_valid - 1, 1), 0.0)

    comparable = has_stats[None, :] & ~np.eye(b, dtype=bool)  # [i, z]
    if groups is not None:
        ids = {name: idx for idx, name in enumerate(dict.fromkeys(groups))}
        group_ids = np.array([ids[name] for name in groups])
        comparable &= group_ids[:, None] == group_ids[None, :]
    gt = np.where(
        mos[:, None] > mos[None, :],
        1.0,
        np.where(mos[:, None] < mos[None, :], 0.0, 0.5),
    )

    # [i, j, z]: answer j of image i against image z.
    x = (filled[:, :, None] - mu[None, None, :]) / np.sqrt(
        var[:, None, None] + var[None, None, :] + EPS
    )
    p = _phi(x)
    g = gt[:, None, :]
    pair = np.sqrt(p * g + EPS) + np.sqrt((1.0 - p) * (1.0 - g) + EPS)
    count = comparable.sum(axis=1)
    total = np.where(comparable[:, None, :], pair, 0.0).sum(axis=2)
    reward = np.where(
        count[:, None] > 0, total / np.maximum(count, 1)[:, None], NO_COMPARISON_REWARD
    )
    reward = np.where(valid, reward, UNPARSEABLE_REWARD)
    assert reward.shape == (b, k)
    return [float(r) for r in reward.reshape(-1)]


def fidelity_rewards_reference(
    completions: Sequence[Completion],
    solution: Sequence[str | float],
    num_generations: int,
    dataset_name: Sequence[Hashable] | None = None,
) -> list[float]:
    """Loop implementation of :func:`fidelity_rewards`, written from the formula.

    Same arguments, return value, policies and errors as
    :func:`fidelity_rewards`; intended for testing.
    """
    scores, mos, groups = _prepare(completions, solution, num_generations, dataset_name)
    stats: list[tuple[float, float] | None] = []
    for row in scores:
        values = [s for s in row if s is not None]
        if not values:
            stats.append(None)
            continue
        mean = sum(values) / len(values)
        var = (
            sum((v - mean) ** 2 for v in values) / (len(values) - 1)
            if len(values) > 1
            else 0.0
        )
        stats.append((mean, var))

    rewards: list[float] = []
    for i, row in enumerate(scores):
        others = [
            z
            for z in range(len(scores))
            if z != i
            and stats[z] is not None
            and (groups is None or groups[z] == groups[i])
        ]
        for q in row:
            if q is None:
                rewards.append(UNPARSEABLE_REWARD)
                continue
            if not others:
                rewards.append(NO_COMPARISON_REWARD)
                continue
            stats_i = stats[i]
            assert stats_i is not None
            total = 0.0
            for z in others:
                stats_z = stats[z]
                assert stats_z is not None
                mu_z, var_z = stats_z
                if mos[i] > mos[z]:
                    gt = 1.0
                elif mos[i] < mos[z]:
                    gt = 0.0
                else:
                    gt = 0.5
                p = 0.5 * (
                    1.0
                    + math.erf(
                        (q - mu_z)
                        / math.sqrt(stats_i[1] + var_z + EPS)
                        / math.sqrt(2.0)
                    )
                )
                total += math.sqrt(p * gt + EPS) + math.sqrt(
                    (1.0 - p) * (1.0 - gt) + EPS
                )
            rewards.append(total / len(others))
    return rewards
