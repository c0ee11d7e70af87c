"""The synced VisualQuality-R1 fidelity reward (examples/visualquality_r1/reward.py) on 4 local gloo ranks.

Oracle: ``fidelity_rewards`` on the concatenated global batch (single process). The per-rank (unsynced) result is
what the original code computes; it differs, and cannot even be computed when an image's K completions are split
across ranks.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from syncreward.testing import run_ranks

_DIR = Path(__file__).resolve().parents[1] / "examples" / "visualquality_r1"


def _load(name: str, file: str) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _DIR / file)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


vq = _load("vq_reward", "reward.py")
fidelity_rewards = sys.modules["fidelity"].fidelity_rewards  # the module reward.py imported

K = 4
WORLD = 4


def make_batch(n_images: int, seed: int, names: bool = False, bad: bool = False) -> dict[str, list[Any]]:
    """A synthetic global batch: K consecutive completions per image, MOS in [1, 5], noisy predicted scores."""
    rng = np.random.default_rng(seed)
    mos = np.round(rng.uniform(1, 5, n_images), 2)
    scores = np.clip(np.round(mos[:, None] + rng.normal(0, 0.7, (n_images, K)), 2), 1, 5)
    completions: list[Any] = []
    for i in range(n_images):
        for j in range(K):
            text = f"<think>The image looks fine.</think> <answer>{scores[i, j]}</answer>"
            if bad and (i, j) in ((0, 1), (3, 2)):
                text = "<think>hard to say</think> <answer>N/A</answer>"
            # TRL's conversational completions for odd images, plain strings for even ones
            completions.append([{"role": "assistant", "content": text}] if i % 2 else text)
    batch: dict[str, list[Any]] = {
        "completions": completions,
        "solution": [f"<answer> {m} </answer>" for m in mos for _ in range(K)],
        "prompts": [[{"role": "user", "content": f"Rate image {i}."}] for i in range(n_images) for _ in range(K)],
    }
    if names:
        batch["dataset_name"] = [["koniq", "spaq", "kadid"][i % 3] for i in range(n_images) for _ in range(K)]
    return batch


# Scenario -> (batch, local batch sizes per rank). "aligned": 2 whole images per rank (TRL with 4 generations and
# 8 completions per device); "split": uneven slices that cut images 1 and 2 and 4 across ranks.
SCENARIOS: dict[str, tuple[dict[str, list[Any]], list[int]]] = {
    "aligned": (make_batch(8, seed=0), [8, 8, 8, 8]),
    "split": (make_batch(6, seed=1, bad=True), [6, 2, 10, 6]),
    "split_by_dataset": (make_batch(6, seed=2, names=True), [6, 2, 10, 6]),
}


def local(batch: dict[str, list[Any]], sizes: list[int], rank: int) -> dict[str, list[Any]]:
    start = sum(sizes[:rank])
    return {key: value[start : start + sizes[rank]] for key, value in batch.items()}


class Opaque:
    """Stands in for the PIL images TRL passes in the ``image`` column: not plain data, never exchanged."""


def rank_body(rank: int, world_size: int) -> dict[str, Any]:
    from syncreward import synced_reward

    reward = vq.make_fidelity_reward(K)
    by_dataset = vq.make_fidelity_reward(K, by_dataset=True, name="fidelity_by_dataset")

    # Only to show why shard mode is wrong for this reward: it scores each rank's share of images separately.
    def per_share(completions: list[Any], solution: list[str], **kwargs: Any) -> list[float]:
        return fidelity_rewards(completions, solution, K)

    sharded = synced_reward(mode="shard", group_size=K)(per_share)
    out: dict[str, Any] = {}
    for scenario, (batch, sizes) in SCENARIOS.items():
        mine = local(batch, sizes, rank)
        fn = by_dataset if "dataset_name" in batch else reward
        out[scenario] = fn(**mine, image=[Opaque() for _ in range(sizes[rank])])
        try:  # the original: each rank scores its own slice
            out[scenario + "/unsynced"] = fidelity_rewards(
                mine["completions"], mine["solution"], K, mine.get("dataset_name")
            )
        except ValueError as e:
            out[scenario + "/unsynced"] = f"ValueError: {e}"
    batch, sizes = SCENARIOS["aligned"]
    out["aligned/shard"] = sharded(**local(batch, sizes, rank))
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(rank_body, WORLD, timeout=180)


def concat(results: list[dict[str, Any]], key: str) -> list[float]:
    return [x for part in results for x in part[key]]


@pytest.mark.multiprocess
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_synced_equals_single_process(results: list[dict[str, Any]], scenario: str) -> None:
    batch, sizes = SCENARIOS[scenario]
    expected = fidelity_rewards(batch["completions"], batch["solution"], K, batch.get("dataset_name"))
    assert [len(r[scenario]) for r in results] == sizes  # every rank got exactly its own slice
    np.testing.assert_allclose(concat(results, scenario), expected, rtol=1e-12, atol=0)


@pytest.mark.multiprocess
def test_unsynced_differs(results: list[dict[str, Any]]) -> None:
    synced = np.array(concat(results, "aligned"))
    unsynced = np.array(concat(results, "aligned/unsynced"))
    diff = np.abs(unsynced - synced)
    print(
        f"\nVQ fidelity, 4 ranks x 2 images x K={K}: max |unsynced - synced| = {diff.max():.4f}, mean {diff.mean():.4f}"
    )
    assert diff.max() > 0.1
    # GRPO's per-image advantages change too, not only the reward level.
    groups = [r.reshape(-1, K) for r in (synced, unsynced)]
    adv = [(g - g.mean(1, keepdims=True)) / (g.std(1, keepdims=True) + 1e-4) for g in groups]
    assert np.abs(adv[0] - adv[1]).max() > 0.1


@pytest.mark.multiprocess
def test_split_images_need_sync(results: list[dict[str, Any]]) -> None:
    # Per-rank scoring cannot even form images when the sampler cut one across ranks ...
    for r in results:
        assert str(r["split/unsynced"]).startswith("ValueError: batch size")
    # ... while the synced reward scores every image whole (checked against the oracle above).
    assert all(len(r["split"]) == n for r, n in zip(results, SCENARIOS["split"][1], strict=True))


@pytest.mark.multiprocess
def test_shard_mode_is_wrong_for_this_reward(results: list[dict[str, Any]]) -> None:
    # shard mode gives rank r images 2r and 2r+1 to score: the same comparison sets as unsynced, not the global batch.
    np.testing.assert_allclose(concat(results, "aligned/shard"), concat(results, "aligned/unsynced"), rtol=1e-12)
    assert np.abs(np.array(concat(results, "aligned/shard")) - concat(results, "aligned")).max() > 0.1


def test_names_for_trl() -> None:
    f = vq.make_fidelity_reward(8)
    g = vq.make_fidelity_reward(8, by_dataset=True, name="accuracy_reward")
    assert (f.__name__, f.__qualname__) == ("fidelity_reward", "fidelity_reward")
    assert (g.__name__, g.__qualname__) == ("accuracy_reward", "accuracy_reward")
    assert "K=8" in (f.__doc__ or "")
    trl_utils = pytest.importorskip("trl.trainer.utils")
    assert trl_utils.get_callable_name(f) == "fidelity_reward"
    assert trl_utils.get_callable_name(g) == "accuracy_reward"
    assert not trl_utils.is_async_callable(f)


def test_one_process_and_guards() -> None:
    batch = make_batch(5, seed=3, names=True, bad=True)
    plain = fidelity_rewards(batch["completions"], batch["solution"], K)
    assert vq.make_fidelity_reward(K)(**batch) == plain  # no process group: called directly
    assert vq.make_fidelity_reward(K, by_dataset=True)(**batch) == fidelity_rewards(
        batch["completions"], batch["solution"], K, batch["dataset_name"]
    )
    no_names = {k: v for k, v in batch.items() if k != "dataset_name"}
    with pytest.raises(ValueError, match="dataset_name"):
        vq.make_fidelity_reward(K, by_dataset=True)(**no_names)
    with pytest.raises(ValueError, match="not divisible"):
        vq.make_fidelity_reward(3)(**no_names)  # wrong K: 20 rows are not whole images of 3
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="num_generations"):
            vq.make_fidelity_reward(bad)  # type: ignore[arg-type]


def test_training_template_data_and_rewards(tmp_path: Path) -> None:
    """train_grpo.py's dataset builder and rewards on a tiny JSON-lines file (the trainer itself is not run)."""
    pytest.importorskip("datasets")
    image = pytest.importorskip("PIL.Image")
    for name in ("a.png", "b.png"):
        image.new("RGB", (8, 8), (120, 30, 200)).save(tmp_path / name)
    data = tmp_path / "train.jsonl"
    data.write_text(
        '{"image": "a.png", "mos": 3.712, "dataset_name": "koniq"}\n'
        '{"image": "b.png", "mos": 1.5, "dataset_name": "koniq"}\n'
    )
    train = _load("vq_train_grpo", "train_grpo.py")
    ds = train.build_dataset(str(data), str(tmp_path))
    assert set(ds.column_names) == {"prompt", "image", "solution", "dataset_name"}
    assert ds[0]["solution"] == "<answer> 3.71 </answer>"
    assert ds[0]["image"].size == (8, 8)
    # What TRL passes for K=2: each row repeated K times, conversational completions.
    rows = [ds[i] for i in range(len(ds)) for _ in range(2)]
    texts = ["<think>sharp</think><answer>4.1</answer>", "<think>ok</think> <answer>3.2</answer>", "2", "blurry"]
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    kwargs = {key: [r[key] for r in rows] for key in ("solution", "dataset_name", "image")}
    assert train.format_reward(completions) == [1.0, 1.0, 0.0, 0.0]
    reward = vq.make_fidelity_reward(2, by_dataset=True)
    assert reward(prompts=[r["prompt"] for r in rows], completions=completions, **kwargs) == fidelity_rewards(
        completions, kwargs["solution"], 2, kwargs["dataset_name"]
    )
