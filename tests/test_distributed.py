"""Synced calls on real local gloo ranks, checked against the plain function on the concatenated batch."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import outcome as _outcome

import syncreward
from syncreward import synced_reward
from syncreward._session import session_for
from syncreward._wire import BLOCK_LAG
from syncreward.testing import run_ranks

pytestmark = pytest.mark.multiprocess


@pytest.fixture(autouse=True)
def _spawned_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """These ranks are spawned (conftest.py forks most tests' ranks): each draws its own str hash seed."""
    monkeypatch.setenv("SYNCREWARD_START_METHOD", "spawn")


# Local batch sizes per world size: uneven, with empty ranks (and an empty rank 0, the scoring rank).
SIZES = {1: [3], 2: [3, 0], 3: [0, 4, 2], 4: [2, 0, 5, 1]}


def local_batch(rank: int, world_size: int) -> dict[str, Any]:
    n = SIZES[world_size][rank]
    start = sum(SIZES[world_size][:rank])
    ids = list(range(start, start + n))
    return {
        "completions": [f"answer {i} " + "é" * (i % 3) + "x" * i for i in ids],
        "completion_ids": [[i, i + 1, i * 1000] for i in ids],
        "solution": [str(i % 4) for i in ids],
        "mixed": [None if i % 3 == 0 else {"k": (i, 2.5), "l": [1, "a"]} for i in ids],
        "feats": torch.arange(3 * n, dtype=torch.float32).reshape(n, 3) + 3 * start,
        "arr": np.arange(n, dtype=np.int16) + start,
    }


def concat_batches(world_size: int) -> dict[str, Any]:
    parts = [local_batch(r, world_size) for r in range(world_size)]
    out: dict[str, Any] = {}
    for key, value in parts[0].items():
        if isinstance(value, torch.Tensor):
            out[key] = torch.cat([p[key] for p in parts])
        elif isinstance(value, np.ndarray):
            out[key] = np.concatenate([p[key] for p in parts])
        else:
            out[key] = [x for p in parts for x in p[key]]
    return out


# --------------------------------------------------------------------------------------------- oracles


def batch_reward(completions, completion_ids, solution, mixed, feats, arr, **kwargs):
    """Depends on the whole batch: each sample's score is relative to the batch."""
    n = len(completions)
    mean_len = sum(map(len, completions)) / max(n, 1)
    out: list[float | None] = []
    for i in range(n):
        if mixed[i] is None and i % 2:
            out.append(None)  # TRL allows None
        else:
            out.append(
                len(completions[i]) - mean_len + sum(completion_ids[i]) / 1000 + float(feats[i].sum()) + int(arr[i]) + n
            )
    return out


def dict_reward(completions, feats, **kwargs):
    n = len(completions)
    return {
        "length": np.array([len(c) + n for c in completions], dtype=np.float64),
        "feat": feats.sum(dim=1) * n,
        "tag": tuple(f"{c[:8]}/{n}" for c in completions),
    }


async def async_reward(completions, solution, delay: float = 0.0, **kwargs):
    await asyncio.sleep(delay)
    n = len(completions)
    return [float(len(c) * n + int(s)) for c, s in zip(completions, solution)]


async def async_other(completions, delay: float = 0.0, **kwargs):
    await asyncio.sleep(delay)
    return torch.tensor([float(len(c)) for c in completions]) - len(completions)


def group_reward(completions, **kwargs):
    """Group-relative within groups of 3 consecutive samples, plus the batch size it saw."""
    out = []
    for g in range(0, len(completions), 3):
        grp = completions[g : g + 3]
        mean = sum(map(len, grp)) / len(grp)
        out += [len(c) - mean for c in grp]
    return out


def key_group_reward(completions, prompt_id, **kwargs):
    out = []
    for i, c in enumerate(completions):
        same = [len(completions[j]) for j in range(len(completions)) if prompt_id[j] == prompt_id[i]]
        out.append(len(c) - sum(same) / len(same) + 100 * len(same))
    return out


def logging_reward(completions, log_extra, log_metric, **kwargs):
    log_extra("len", [len(c) for c in completions])
    log_metric("batch", float(len(completions)))
    return [0.0] * len(completions)


main_batch = synced_reward(batch_reward)
replicate_batch = synced_reward(mode="replicate")(batch_reward)
main_dict = synced_reward(dict_reward)
replicate_dict = synced_reward(mode="replicate")(dict_reward)
# the ranks pass different delays on purpose (to finish in different orders): not a shared value to check
main_async = synced_reward(exclude=["delay"])(async_reward)
replicate_async = synced_reward(mode="replicate")(async_reward)
main_async_other = synced_reward(exclude=["delay"])(async_other)
shard_by_size = synced_reward(mode="shard", group_size=3)(group_reward)
shard_by_key = synced_reward(mode="shard", group_by="prompt_id")(key_group_reward)
main_logging = synced_reward(logging_reward)
replicate_logging = synced_reward(mode="replicate")(logging_reward)
shard_logging = synced_reward(mode="shard", group_size=3)(logging_reward)


def correctness_body(rank: int, world_size: int) -> dict[str, Any]:
    b = local_batch(rank, world_size)
    out: dict[str, Any] = {}
    # positional and keyword, TRL-style extra kwargs that are shared
    out["main"] = main_batch(
        b["completions"],
        completion_ids=b["completion_ids"],
        solution=b["solution"],
        mixed=b["mixed"],
        feats=b["feats"],
        arr=b["arr"],
        trainer_state={"step": 1},
        log_extra=print,
    )
    out["replicate"] = replicate_batch(**b)
    out["main_dict"] = main_dict(b["completions"], b["feats"])
    out["replicate_dict"] = replicate_dict(completions=b["completions"], feats=b["feats"])

    async def both() -> list[Any]:
        # Two synced async rewards on one event loop, as TRL runs them; different delays per rank
        # so their function bodies finish in different orders on different ranks.
        d = 0.05 * ((rank + 1) % 2)
        return list(
            await asyncio.gather(
                main_async(b["completions"], b["solution"], delay=d),
                main_async_other(completions=b["completions"], delay=0.05 - d),
                replicate_async(b["completions"], b["solution"]),
            )
        )

    out["async"] = asyncio.run(both())
    n = len(b["completions"])
    start = sum(SIZES[world_size][:rank])
    if sum(SIZES[world_size]) % 3 == 0:
        out["shard_size"] = shard_by_size(b["completions"])
    pids = [(start + i) // 2 for i in range(n)]
    out["shard_key"] = shard_by_key(b["completions"], prompt_id=pids)
    out["pids"] = pids
    logs: dict[str, list[Any]] = {}
    for name, f in [("main", main_logging), ("replicate", replicate_logging), ("shard", shard_logging)]:
        if name == "shard" and sum(SIZES[world_size]) % 3:
            continue
        extra: dict[str, list[Any]] = {}
        metrics: dict[str, list[float]] = {}
        f(
            b["completions"],
            log_extra=lambda c, v, extra=extra: extra.setdefault(c, []).extend(v),
            log_metric=lambda k, v, metrics=metrics: metrics.setdefault(k, []).append(v),
        )
        logs[name] = (extra, metrics)
    out["logs"] = logs
    return out


def _slices(values: Any, world_size: int) -> list[Any]:
    sizes = SIZES[world_size]
    offsets = np.cumsum([0, *sizes]).tolist()
    return [values[offsets[r] : offsets[r + 1]] for r in range(world_size)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_rank_gets_its_slice_of_the_global_result(world_size: int) -> None:
    results = run_ranks(correctness_body, world_size, timeout=180)
    g = concat_batches(world_size)
    expected_batch = _slices(batch_reward(**g), world_size)
    expected_dict = batch_dict = dict_reward(g["completions"], g["feats"])
    expected_async = _slices(asyncio.run(async_reward(g["completions"], g["solution"])), world_size)
    expected_other = _slices(asyncio.run(async_other(g["completions"])), world_size)
    for r, res in enumerate(results):
        assert _same(res["main"], expected_batch[r]), (r, res["main"], expected_batch[r])
        assert _same(res["replicate"], expected_batch[r])
        want = {k: _slices(v, world_size)[r] for k, v in expected_dict.items()}
        assert _same(res["main_dict"], want), (res["main_dict"], want)
        assert _same(res["replicate_dict"], want)
        assert _same(res["async"][0], expected_async[r])
        assert _same(res["async"][1], expected_other[r])
        assert _same(res["async"][2], expected_async[r])
    assert batch_dict is expected_dict
    if sum(SIZES[world_size]) % 3 == 0:
        expected = _slices(group_reward(g["completions"]), world_size)
        for r, res in enumerate(results):
            assert res["shard_size"] == expected[r]
    pids = [p for res in results for p in res["pids"]]
    expected = _slices(key_group_reward(g["completions"], pids), world_size)
    for r, res in enumerate(results):
        assert res["shard_key"] == expected[r]
    # log_extra: each rank gets exactly its own samples' values; log_metric: same keys on every rank
    lengths = _slices([len(c) for c in g["completions"]], world_size)
    for r, res in enumerate(results):
        for mode, (extra, metrics) in res["logs"].items():
            assert extra == {"len": lengths[r]}, (mode, r, extra)
            assert set(metrics) == {"batch"}
            if mode != "shard":
                assert metrics["batch"] == [float(len(g["completions"]))]


class Opaque:
    pass


# --------------------------------------------------------------------------------------------- columns


def uses_image(completions, **kwargs):
    return [float(len(kwargs["image"]))] * len(completions)


def ignores_image(completions, solution, **kwargs):
    return [float(len(completions) + len(kwargs["solution_copy"]))] * len(completions)


main_uses_image = synced_reward(uses_image)
main_ignores_image = synced_reward(ignores_image)
main_include = synced_reward(include=["image"], allow_pickle=True)(uses_image)


def columns_body(rank: int, world_size: int) -> dict[str, Any]:
    comps = [f"c{rank}{i}" for i in range(2)]
    images = [Opaque() for _ in comps]
    out: dict[str, Any] = {}
    out["ignored"] = _outcome(main_ignores_image, comps, comps, image=images, solution_copy=comps)
    out["used"] = _outcome(main_uses_image, comps, image=images)
    out["included"] = _outcome(main_include, comps, image=images)
    return out


def test_non_plain_kwargs_columns_are_left_behind_with_a_placeholder() -> None:
    results = run_ranks(columns_body, 2, timeout=120)
    for res in results:
        assert res["ignored"] == ("ok", [8.0, 8.0], res["ignored"][2])
        assert res["included"][:2] == ("ok", [4.0, 4.0])
    assert results[0]["used"][0] == "ColumnNotSyncedError"
    assert "image" in results[0]["used"][1] and "include" in results[0]["used"][1]
    assert results[1]["used"][:2] == ("RemoteError", (0, "syncreward.ColumnNotSyncedError", results[0]["used"][1]))


# --------------------------------------------------------------------------------------------- collectives


def counting_body(rank: int, world_size: int) -> dict[str, Any]:
    """Count the collectives (and point-to-point transfers) each synced call issues, call by call."""
    backend = syncreward.resolve_backend("torch")
    counts = {"n": 0}
    for name in (
        "all_gather",
        "all_to_all",
        "scatter",
        "gather",
        "send",
        "recv",
        "recv_many",
    ):  # main: a gather, a scatter
        original = getattr(backend, name)

        def counted(*args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            counts["n"] += len(args[0]) if _name == "recv_many" else 1  # (its receives, one per sender)
            return _original(*args, **kwargs)

        setattr(backend, name, counted)
    out: dict[str, Any] = {}
    b = local_batch(rank, world_size)
    calls = {"main": BLOCK_LAG + 2, "replicate": 3, "main_after_replicate": 2}
    for name, f in [("main", main_batch), ("replicate", replicate_batch), ("main_after_replicate", main_batch)]:
        out[name] = []
        for _ in range(calls[name]):
            counts["n"] = 0
            f(**b)
            out[name].append(counts["n"])
        out[name + "_eager"] = session_for(backend, "f").predictor.predict().tolist()
    return out


def test_collectives_per_call() -> None:
    for rank, res in enumerate(run_ranks(counting_body, 3, timeout=120)):
        # main: a gather and a scatter; until the inbound block size rank 0 announced is in use (BLOCK_LAG
        # gathered calls later), a payload larger than the first blocks sends its rest point to point
        assert res["main"][0] == (2 + 2 if rank == 0 else 2 + 1), res  # rank 0 receives from ranks 1 and 2
        assert res["main"][-2:] == [2, 2], res
        assert res["replicate"] == [3, 2, 2], res  # main predicts no eager chunks: replicate sizes its own
        eager = np.array(res["replicate_eager"])
        assert (eager[~np.eye(3, dtype=bool)] > 0).all() and (np.diag(eager) == 0).all(), eager
        assert res["main_after_replicate"] == [2, 2], res  # its gather carries no replicate chunks
        assert res["main_after_replicate_eager"] == res["replicate_eager"], res  # main leaves the predictor alone


# --------------------------------------------------------------------------------------------- subgroups


def data_parallel_body(rank: int, world_size: int) -> dict[str, Any]:
    """4 ranks as 2 data-parallel x 2 tensor-parallel: TP peers {0,1} and {2,3} hold the same samples."""
    import torch.distributed as dist

    dp_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank creates every group
    dp = dp_groups[rank % 2]
    dp_rank = rank // 2
    completions = [f"dp{dp_rank}-" + "x" * i for i in range(dp_rank + 2)]  # same data on TP peers
    synced = synced_reward(process_group=dp)(batch_normalized)
    return {"completions": completions, "rewards": synced(completions)}


def batch_normalized(completions, **kwargs):
    mean = sum(map(len, completions)) / len(completions)
    return [len(c) - mean for c in completions]


def test_process_group_syncs_over_data_parallel_ranks_only() -> None:
    results = run_ranks(data_parallel_body, 4, timeout=120)
    batch = results[0]["completions"] + results[2]["completions"]  # one copy per data-parallel rank
    expected = batch_normalized(batch)
    for rank, res in enumerate(results):
        dp_rank = rank // 2
        lo = 0 if dp_rank == 0 else len(results[0]["completions"])
        assert res["rewards"] == expected[lo : lo + len(res["completions"])], (rank, res)


class _CollectivesOnly:
    """The torch backend without its optional ``scatter``: main falls back to an all_to_all."""

    def __init__(self, inner: Any) -> None:
        self.rank, self.world_size = inner.rank, inner.world_size
        self.all_gather, self.all_to_all = inner.all_gather, inner.all_to_all


def _scatter_body(rank: int, world_size: int) -> dict[str, Any]:
    torch_backend = syncreward.resolve_backend("torch")

    def per_sample(completions: list[str], **kwargs: Any) -> dict[str, list[Any]]:
        n = len(completions)
        return {
            "score": [float(len(c) * n) for c in completions],
            "tag": [c[::-1] * (1 + i) for i, c in enumerate(completions)],
        }  # noqa: E501

    out: dict[str, Any] = {}
    for name, backend in (("scatter", torch_backend), ("all_to_all", _CollectivesOnly(torch_backend))):
        f = synced_reward(backend=backend)(per_sample)
        got = []
        for step in range(4):  # growing results: the first calls overflow their predicted block
            n = 1 + rank * 3 + step * 2  # uneven batches, rank 0 smallest
            got.append(f([f"r{rank}s{step}i{i}" * (1 + step * 20) for i in range(n)]))
        out[name] = got
    return out


@pytest.mark.multiprocess
def test_main_results_are_the_same_through_a_scatter_and_an_all_to_all() -> None:
    """main sends results with the backend's scatter where it has one; a backend without it gets the same results."""
    results = run_ranks(_scatter_body, 3, timeout=120)
    for step in range(4):
        batches = [[f"r{r}s{step}i{i}" * (1 + step * 20) for i in range(1 + r * 3 + step * 2)] for r in range(3)]
        everyone = [c for b in batches for c in b]
        n = len(everyone)
        score = [float(len(c) * n) for c in everyone]
        tag = [c[::-1] * (1 + i) for i, c in enumerate(everyone)]
        lo = 0
        for rank, res in enumerate(results):
            hi = lo + len(batches[rank])
            expected = {"score": score[lo:hi], "tag": tag[lo:hi]}
            assert res["scatter"][step] == expected, (rank, step)
            assert res["all_to_all"][step] == expected, (rank, step)
            lo = hi
