"""Tests for the numpy port of VisualQuality-R1's fidelity reward.

The module under test lives in ``examples/visualquality_r1/fidelity.py``.
"""

from __future__ import annotations

import importlib.util
import math
import random
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

_PATH = (
    Path(__file__).resolve().parents[1]
    / "examples"
    / "visualquality_r1"
    / "fidelity.py"
)


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vq_fidelity", _PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


fid = _load()
EPS = 1e-6
SQRT_EPS = math.sqrt(EPS)


def _phi(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def _answer(score: float | str) -> str:
    return (
        f"<think>The image looks sharp, maybe 4 of 5.</think> <answer>{score}</answer>"
    )


def _sol(mos: float) -> str:
    return f"<answer> {mos} </answer>"


def _batch(
    answers: list[list[Any]], mos: list[float], names: list[str] | None = None
) -> tuple[list[Any], list[str], int, list[str] | None]:
    """Flattens per-image answers (scores or raw completions) into a batch."""
    k = len(answers[0])
    completions = [
        a if not isinstance(a, (int, float)) else _answer(a)
        for row in answers
        for a in row
    ]
    solution = [_sol(m) for m in mos for _ in range(k)]
    dataset = None if names is None else [n for n in names for _ in range(k)]
    return completions, solution, k, dataset


def _random_batch(
    rng: random.Random, n_images: int, k: int, with_names: bool, p_bad: float = 0.15
) -> tuple[list[Any], list[str], int, list[str] | None]:
    answers: list[list[Any]] = []
    for _ in range(n_images):
        row: list[Any] = []
        for _ in range(k):
            u = rng.random()
            score = round(rng.uniform(1, 5), rng.choice([0, 1, 2]))
            if u < p_bad:
                row.append(
                    rng.choice(
                        [
                            "<answer>N/A</answer>",
                            "I cannot rate this.",
                            [{"role": "assistant", "content": ""}],
                        ]
                    )
                )
            elif u < 0.4:
                row.append([{"role": "assistant", "content": _answer(score)}])
            elif u < 0.5:
                row.append(
                    [
                        {
                            "role": "assistant",
                            "content": [{"type": "text", "text": _answer(score)}],
                        }
                    ]
                )
            else:
                row.append(score)
        answers.append(row)
    mos = [
        rng.choice([1.5, 2.0, 3.0, round(rng.uniform(1, 5), 2)])
        for _ in range(n_images)
    ]
    names = (
        [rng.choice(["koniq", "spaq", "kadid"]) for _ in range(n_images)]
        if with_names
        else None
    )
    return _batch(answers, mos, names)


# --------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>...</think><answer>3.75</answer>", 3.75),
        ("<answer> 4 </answer>", 4.0),
        ("<answer>-1.5</answer>", -1.5),
        ("<answer>The score is 2.5/5</answer>", 2.5),
        ("<answer>1</answer> then <answer>\n4.2\n</answer>", 4.2),  # last block, DOTALL
        ("no tags, quality 3.5 out of 5", 3.5),  # whole-text fallback, first number
        (
            "<think>about 3</think><answer>excellent</answer>",
            None,
        ),  # tags present, no number inside
        ("nothing numeric", None),
        ("", None),
        ("<answer>" + "9" * 400 + "</answer>", None),  # overflows to inf
    ],
)
def test_parse_score(text: str, expected: float | None) -> None:
    assert fid.parse_score(text) == expected


def test_parse_mos() -> None:
    assert fid.parse_mos("<answer> 3.7 </answer>") == 3.7
    assert fid.parse_mos("<answer>\n62.5\n</answer>") == 62.5
    assert fid.parse_mos("4.25") == 4.25
    assert fid.parse_mos(3) == 3.0
    assert fid.parse_mos(np.float32(2.5)) == 2.5
    for bad in ["<answer>good</answer>", "", "<answer>3.5 / 5</answer>", "nan"]:
        with pytest.raises(ValueError):
            fid.parse_mos(bad)
    with pytest.raises(TypeError):
        fid.parse_mos(None)


def test_completion_text_shapes() -> None:
    text = _answer(3)
    assert fid.completion_text(text) == text
    assert fid.completion_text([{"role": "assistant", "content": text}]) == text
    assert fid.completion_text({"role": "assistant", "content": text}) == text
    assert (
        fid.completion_text(
            [{"role": "assistant", "content": [{"type": "text", "text": text}]}]
        )
        == text
    )
    assert fid.completion_text([]) == ""
    with pytest.raises(TypeError):
        fid.completion_text(3)


# --------------------------------------------------------------------------- hand-computed

# Image A: answers 3, 5 (mu 4, unbiased var 2), MOS 4; image B: answers 2, 2 (mu 2, var 0), MOS 2.
# r_A(3) = sqrt(Phi(1/sqrt(2+eps)) + eps) + sqrt(eps)      (gt = 1)
# r_A(5) = sqrt(Phi(3/sqrt(2+eps)) + eps) + sqrt(eps)
# r_B(2) = sqrt(eps) + sqrt(1 - Phi(-2/sqrt(2+eps)) + eps)  (gt = 0)
# Constants evaluated with mpmath at 40 digits.
A3, A5, B2 = 0.8729236686675211760, 0.9924905702719627746, 0.9608704832353304232
# Same answers, equal MOS (gt = 0.5): sqrt(p/2 + eps) + sqrt((1-p)/2 + eps).
T3, T5, TB = 0.9627747647202508279, 0.7931483293520931782, 0.8770387031809552710


@pytest.mark.parametrize("impl", ["fidelity_rewards", "fidelity_rewards_reference"])
def test_two_images_k2(impl: str) -> None:
    f = getattr(fid, impl)
    assert f(*_batch([[3, 5], [2, 2]], [4.0, 2.0])[:3]) == pytest.approx(
        [A3, A5, B2, B2], rel=1e-12
    )
    assert f(*_batch([[3, 5], [2, 2]], [3.0, 3.0])[:3]) == pytest.approx(
        [T3, T5, TB, TB], rel=1e-12
    )
    # Closed form, written out once more without the constants.
    assert f(*_batch([[3, 5], [2, 2]], [4.0, 2.0])[:3])[0] == pytest.approx(
        math.sqrt(_phi(1 / math.sqrt(2 + EPS)) + EPS) + SQRT_EPS, rel=1e-14
    )


def test_unparseable_excluded_from_stats() -> None:
    # A = [3, N/A, 5] has the same statistics as [3, 5]; B = [2, 2, 2] has var 0.
    rewards = fid.fidelity_rewards(*_batch([[3, "N/A", 5], [2, 2, 2]], [4.0, 2.0])[:3])
    assert rewards == pytest.approx([A3, 0.0, A5, B2, B2, B2], rel=1e-12)


# --------------------------------------------------------------------------- vectorised == loop


@pytest.mark.parametrize("k", [1, 2, 3, 6])
@pytest.mark.parametrize("n_images", [1, 2, 5, 12])
@pytest.mark.parametrize("with_names", [False, True])
def test_vectorised_matches_reference(k: int, n_images: int, with_names: bool) -> None:
    rng = random.Random(1000 * k + 10 * n_images + with_names)
    for _ in range(5):
        batch = _random_batch(rng, n_images, k, with_names)
        fast = fid.fidelity_rewards(*batch)
        slow = fid.fidelity_rewards_reference(*batch)
        assert len(fast) == n_images * k
        np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=1e-12)


def test_image_order_does_not_matter() -> None:
    rng = random.Random(7)
    completions, solution, k, names = _random_batch(rng, 9, 4, with_names=True)
    assert names is not None
    base = np.array(fid.fidelity_rewards(completions, solution, k, names)).reshape(9, k)
    perm = list(range(9))
    rng.shuffle(perm)

    def rows(xs: list[Any]) -> list[Any]:
        return [xs[i * k + j] for i in perm for j in range(k)]

    shuffled = np.array(
        fid.fidelity_rewards(rows(completions), rows(solution), k, rows(names))
    ).reshape(9, k)
    np.testing.assert_allclose(shuffled, base[perm], rtol=1e-12)


def test_dataset_name_equals_separate_batches() -> None:
    rng = random.Random(11)
    completions, solution, k, names = _random_batch(rng, 15, 3, with_names=True)
    assert names is not None
    grouped = fid.fidelity_rewards(completions, solution, k, names)
    for name in set(names):
        rows = [i for i, n in enumerate(names) if n == name]
        alone = fid.fidelity_rewards(
            [completions[i] for i in rows], [solution[i] for i in rows], k
        )
        assert [grouped[i] for i in rows] == pytest.approx(alone, rel=1e-12)


def test_string_and_conversational_completions_agree() -> None:
    completions, solution, k, _ = _batch(
        [[3, 4.5, 2], [1, 1.5, 2], [5, 4, 4]], [3.1, 1.2, 4.8]
    )
    conversational = [[{"role": "assistant", "content": c}] for c in completions]
    assert fid.fidelity_rewards(conversational, solution, k) == fid.fidelity_rewards(
        completions, solution, k
    )


# --------------------------------------------------------------------------- guards


def test_single_image_gets_neutral_value() -> None:
    assert fid.fidelity_rewards(*_batch([[3, 4, 5]], [4.0])[:3]) == [0.0, 0.0, 0.0]
    assert fid.fidelity_rewards([], [], 4) == []


def test_single_image_within_its_dataset() -> None:
    batch = _batch(
        [[3, 5], [2, 2], [4, 4]], [4.0, 2.0, 3.0], ["koniq", "koniq", "spaq"]
    )
    rewards = fid.fidelity_rewards(*batch)
    assert rewards == pytest.approx([A3, A5, B2, B2, 0.0, 0.0], rel=1e-12)


def test_k1_uses_zero_variance() -> None:
    rewards = fid.fidelity_rewards(*_batch([[3], [2], [4]], [2.0, 1.0, 5.0])[:3])

    def r(q: float, mu: float, gt: float) -> float:  # zero variances: scale sqrt(eps)
        p = _phi((q - mu) / SQRT_EPS)
        return math.sqrt(p * gt + EPS) + math.sqrt((1 - p) * (1 - gt) + EPS)

    expected = [
        (r(3, 2, 1) + r(3, 4, 0)) / 2,
        (r(2, 3, 0) + r(2, 4, 0)) / 2,
        (r(4, 3, 1) + r(4, 2, 1)) / 2,
    ]
    assert rewards == pytest.approx(expected, rel=1e-12)
    assert all(math.isfinite(x) for x in rewards)


def test_all_unparseable() -> None:
    batch = _batch(
        [
            ["?", "none"],
            ["<answer>bad</answer>", [{"role": "assistant", "content": ""}]],
        ],
        [3.0, 4.0],
    )
    assert fid.fidelity_rewards(*batch[:3]) == [0.0] * 4
    assert fid.fidelity_rewards_reference(*batch[:3]) == [0.0] * 4


def test_all_unparseable_image_is_not_a_comparator() -> None:
    with_bad = fid.fidelity_rewards(
        *_batch([[3, 5], [2, 2], ["x", "y"]], [4.0, 2.0, 1.0])[:3]
    )
    assert with_bad == pytest.approx([A3, A5, B2, B2, 0.0, 0.0], rel=1e-12)
    # The only other image has no parseable answer -> no comparator -> neutral value.
    assert (
        fid.fidelity_rewards(*_batch([[3, 5], ["x", "y"]], [4.0, 1.0])[:3]) == [0.0] * 4
    )


def test_single_parseable_answer_uses_zero_variance() -> None:
    rewards = fid.fidelity_rewards(*_batch([[3, "?"], [2, 2]], [4.0, 2.0])[:3])
    expected_a = (
        math.sqrt(0.5 * (1 + math.erf(1 / SQRT_EPS / math.sqrt(2))) + EPS) + SQRT_EPS
    )
    assert rewards[:2] == pytest.approx([expected_a, 0.0], rel=1e-12)


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ((["a"] * 3, [_sol(1)] * 3, 2, None), "not divisible"),
        ((["a"] * 4, [_sol(1)] * 3, 2, None), "solutions"),
        ((["a"] * 4, [_sol(1)] * 4, 2, ["x"] * 3), "dataset names"),
        (
            (["a"] * 4, [_sol(1), _sol(2), _sol(3), _sol(3)], 2, None),
            "solution differs",
        ),
        ((["a"] * 4, [_sol(1)] * 4, 2, ["x", "y", "z", "z"]), "dataset_name differs"),
        ((["a"] * 4, [_sol(1)] * 4, 0, None), "num_generations"),
        ((["a"] * 2, ["<answer>?</answer>"] * 2, 2, None), "cannot read a MOS"),
    ],
)
def test_validation(batch: tuple[Any, ...], message: str) -> None:
    for f in (fid.fidelity_rewards, fid.fidelity_rewards_reference):
        with pytest.raises(ValueError, match=message):
            f(*batch)


# --------------------------------------------------------------------------- faithfulness to the original


def _original_torch(
    completions: list[Any], solution: list[str], n_gen: int, dtype: Any = None
) -> list[float]:
    """Transcription of the original torch code path (float32 by default, per-call batch).

    Only valid for batches where every answer parses (the original draws random
    numbers otherwise); asserts that.
    """
    torch = pytest.importorskip("torch")
    dtype = dtype or torch.float32
    mos = [fid.parse_mos(s) for s in solution]
    preds = [fid.parse_score(fid.completion_text(c)) for c in completions]
    assert all(p is not None for p in preds)
    groups = [preds[i : i + n_gen] for i in range(0, len(preds), n_gen)]
    means = [torch.mean(torch.tensor(g, dtype=dtype)) for g in groups]
    with warnings.catch_warnings():  # K == 1: "degrees of freedom is <= 0"
        warnings.simplefilter("ignore", UserWarning)
        variances = [torch.var(torch.tensor(g, dtype=dtype)) for g in groups]
    normal = torch.distributions.Normal(0, 1)
    out = []
    for i, g in enumerate(groups):
        for q in g:
            total = 0
            for z in range(len(groups)):
                if z == i:
                    continue
                a, b = mos[i * n_gen], mos[z * n_gen]
                gt = torch.tensor(1.0 if a > b else 0.0 if a < b else 0.5, dtype=dtype)
                try:
                    p = normal.cdf(
                        (q - means[z]) / torch.sqrt(variances[i] + variances[z] + EPS)
                    )
                except ValueError:  # NaN variance (K == 1) fails the support check
                    p = torch.tensor(0.5, dtype=dtype)
                total = (
                    total
                    + torch.sqrt(p * gt + EPS)
                    + torch.sqrt((1 - p) * (1 - gt) + EPS)
                )
            out.append(float(total / (len(groups) - 1)))
    return out


def test_matches_original_on_parseable_batches() -> None:
    torch = pytest.importorskip("torch")
    rng = random.Random(3)
    for k in (2, 4, 8):
        for n_images in (2, 3, 7):
            batch = _random_batch(rng, n_images, k, with_names=False, p_bad=0.0)
            ours = fid.fidelity_rewards(*batch)
            # Same arithmetic in float64: identical up to rounding.
            np.testing.assert_allclose(
                ours,
                _original_torch(*batch[:3], dtype=torch.float64),
                rtol=1e-10,
                atol=1e-12,
            )
            # The original's float32: differences come from float32 cancellation in 1 - p.
            np.testing.assert_allclose(
                ours, _original_torch(*batch[:3]), rtol=1e-4, atol=5e-5
            )


def test_original_k1_ignores_predictions() -> None:
    """Documents the deviation: with K == 1 the original's p is 0.5 for every pair."""
    batch = _batch([[3], [2]], [2.0, 1.0])
    original = _original_torch(*batch[:3])
    assert original == pytest.approx(
        [math.sqrt(0.5 + EPS) + SQRT_EPS, SQRT_EPS + math.sqrt(0.5 + EPS)], rel=1e-6
    )
    # The port uses zero variance instead, so the (correct) higher answer is rewarded.
    assert fid.fidelity_rewards(*batch[:3])[0] > 0.99


# --------------------------------------------------------------------------- sharding


SHARD_SEED = 2024


def _sharding_example() -> tuple[np.ndarray, np.ndarray]:
    """8 images x K=4 in one global batch vs. 4 'ranks' holding 2 images each."""
    rng = np.random.default_rng(SHARD_SEED)
    k, n_images, per_rank = 4, 8, 2
    mos = np.round(rng.uniform(1, 5, n_images), 2)
    scores = np.round(mos[:, None] + rng.normal(0, 0.6, (n_images, k)), 2)
    completions = [_answer(s) for s in scores.reshape(-1)]
    solution = [_sol(m) for m in mos for _ in range(k)]
    global_rewards = np.array(fid.fidelity_rewards(completions, solution, k))
    rows_per_rank = per_rank * k
    sharded = np.concatenate(
        [
            fid.fidelity_rewards(
                completions[r : r + rows_per_rank], solution[r : r + rows_per_rank], k
            )
            for r in range(0, len(completions), rows_per_rank)
        ]
    )
    return global_rewards, sharded


def test_sharding_changes_rewards() -> None:
    global_rewards, sharded = _sharding_example()
    diff = float(np.max(np.abs(global_rewards - sharded)))
    print(f"max |global - per-shard| reward difference (seed {SHARD_SEED}): {diff:.6f}")
    assert diff > 0.1
    # GRPO advantages (per-image standardisation) change too, not just the reward level.

    def adv(r: np.ndarray) -> np.ndarray:
        g = r.reshape(8, 4)
        return (g - g.mean(1, keepdims=True)) / (g.std(1, ddof=1, keepdims=True) + 1e-4)

    assert float(np.max(np.abs(adv(global_rewards) - adv(sharded)))) > 0.1
