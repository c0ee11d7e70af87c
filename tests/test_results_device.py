"""Tensors put together from several ranks' parts land on one device, the caller's, in every mode.

On a GPU, a rank that scores part of its own rows in ``mode="shard"`` joins its own CUDA result rows
with rows decoded (on the CPU) from another rank. CI has no GPU, so the tests make the decoded parts
land on another device than the rows the rank scored itself: decoded result frames are moved to the
``meta`` device and the caller's device is ``meta`` (its rows scored here are on the CPU). Without one
rule for every part, ``torch.cat`` then meets two devices, as on a GPU.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import outcome

import syncreward._modes.shard as shard_module
from syncreward import synced_reward
from syncreward._batch import concat, read_frame, reassemble
from syncreward._codec import C_LIST, C_NDARRAY, C_TENSOR, C_TUPLE, Column
from syncreward.testing import run_threads

META = torch.device("meta")
CPU = torch.device("cpu")

# group_size=2, uneven local batches; one group spans two ranks in each layout:
# W=2 [3, 1]: group 1 = rank 0's last row + rank 1's row, scored on rank 1 (rank 0 gets rows from itself and rank 1)
# W=3 [3, 0, 3]: group 1 = rank 0's last row + rank 2's first, scored on rank 1 (which holds no rows)
LAYOUTS = {2: [3, 1], 3: [3, 0, 3]}


def tensor_reward(completions: Any, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    return x * 2 + 1


def dict_reward(completions: Any, x: torch.Tensor, **kwargs: Any) -> dict[str, torch.Tensor]:
    return {"double": x * 2, "length": torch.tensor([len(c) for c in completions], dtype=torch.int64, device=x.device)}


def _inputs(rank: int, sizes: list[int]) -> tuple[list[str], torch.Tensor]:
    n = sizes[rank]
    start = sum(sizes[:rank])
    completions = [f"r{rank}-{'x' * i}" for i in range(n)]
    return completions, torch.arange(start, start + n, dtype=torch.float32, device=CPU)


def _decoded_on_meta(frame: Any, allow_pickle: bool) -> Any:
    """``read_frame``, with every decoded tensor column on ``meta``: another device than this rank's own rows."""
    nrows, cols, meta = read_frame(frame, allow_pickle)
    moved = [Column(c.name, c.container, c.values.to(META) if c.container == C_TENSOR else c.values) for c in cols]
    return nrows, moved, meta


@pytest.mark.parametrize("world_size", sorted(LAYOUTS))
@pytest.mark.parametrize("reward", [tensor_reward, dict_reward], ids=["tensor", "dict-of-tensors"])
def test_shard_results_put_together_on_callers_device(
    monkeypatch: pytest.MonkeyPatch, reward: Any, world_size: int
) -> None:
    monkeypatch.setattr(shard_module, "read_frame", _decoded_on_meta)
    monkeypatch.setattr(shard_module, "device", lambda call: META)  # the caller's device
    sizes = LAYOUTS[world_size]
    synced = synced_reward(mode="shard", group_size=2, timeout=30)(reward)

    def body(rank: int, w: int) -> tuple[str, Any]:
        return outcome(synced, *_inputs(rank, sizes))[:2]

    results = run_threads(body, world_size, timeout=120)
    problems = []
    for rank, (kind, value) in enumerate(results):
        if kind != "ok":
            problems.append(f"rank {rank}: {kind}: {value}")
            continue
        n = sizes[rank]
        want = {"double": torch.float32, "length": torch.int64} if reward is dict_reward else {None: torch.float32}
        got = value if isinstance(value, dict) else {None: value}
        if list(got) != list(want):
            problems.append(f"rank {rank}: keys {list(got)}, expected {list(want)}")
            continue
        for key, dtype in want.items():
            t = got[key]
            if t.device != META or t.dtype != dtype or tuple(t.shape) != (n,):
                problems.append(
                    f"rank {rank}[{key}]: {t.dtype} {tuple(t.shape)} on {t.device}, expected {dtype} ({n},) on meta"
                )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("world_size", sorted(LAYOUTS))
def test_shard_results_that_fail_to_be_put_together_on_one_rank_raise_on_every_rank(world_size: int) -> None:
    """A rank whose results cannot be put together (a decode that raises on one rank only) is not alone.

    That happens after the call's last exchange, so it follows the rule of docs/reliability.md: the rank
    raises its own exception at once, the others return their results, and its next synced call raises on
    every rank naming the failure; the call after that works.
    """
    sizes = LAYOUTS[world_size]
    unlucky = next(r for r in range(world_size) if r != 1 and sizes[r])  # a rank that receives rows from rank 1
    calls = {"n": 0}

    def fails_on_one_rank(frame: Any, allow_pickle: bool) -> Any:
        if threading.current_thread().name == f"syncreward-rank{unlucky}" and calls["n"] == 0:
            calls["n"] += 1
            raise RuntimeError("Expected all tensors to be on the same device (simulated)")
        return read_frame(frame, allow_pickle)

    synced = synced_reward(mode="shard", group_size=2, timeout=30)(tensor_reward)

    def body(rank: int, w: int) -> dict[str, Any]:
        first = outcome(synced, *_inputs(rank, sizes))[:2]
        then = outcome(synced, *_inputs(rank, sizes))[:2]  # every rank learns of the failure here
        after = outcome(synced, *_inputs(rank, sizes))[:2]  # and the session stays usable
        return {"first": first, "then": then, "after": after}

    with pytest.MonkeyPatch.context() as m:
        m.setattr(shard_module, "read_frame", fails_on_one_rank)
        results = run_threads(body, world_size, timeout=120)
    problems = []
    for rank, got in enumerate(results):
        expected = torch.arange(sum(sizes[:rank]), sum(sizes[: rank + 1]), dtype=torch.float32) * 2 + 1
        kind, info = got["first"]
        if rank == unlucky:
            if kind != "RuntimeError":
                problems.append(f"rank {rank} (where it failed): {kind} {info!r}, expected its own RuntimeError")
        elif kind != "ok" or not torch.equal(info, expected):
            problems.append(f"rank {rank}: {kind} {info!r}, expected its results {expected}")
        kind, info = got["then"]
        if rank == unlucky:
            if kind != "SyncRewardError" or "failed to read the results" not in info:
                problems.append(f"rank {rank}, next call: {kind} {info!r}, expected SyncRewardError naming the failure")
        elif kind != "RemoteError" or info[0] != unlucky or "failed to read the results" not in info[2]:
            problems.append(f"rank {rank}, next call: {kind} {info!r}, expected a RemoteError from rank {unlucky}")
        kind, value = got["after"]
        if kind != "ok" or not torch.equal(value, expected):
            problems.append(f"rank {rank}, the call after: {kind} {value!r}, expected {expected}")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------- the rule itself, without ranks


@pytest.mark.parametrize(
    ("container", "parts"),
    [
        (C_TENSOR, [torch.ones(2), torch.ones(1, device=META), torch.ones(0)]),
        (C_LIST, [[1.0, 2.0], [3.0]]),
        (C_TUPLE, [(1.0,), (2.0, 3.0)]),
        (C_NDARRAY, [np.ones(2), np.zeros(1)]),
    ],
    ids=["tensor", "list", "tuple", "ndarray"],
)
def test_parts_put_together_on_callers_device(container: int, parts: list[Any]) -> None:
    joined = concat("c", parts, container, META)
    assert len(joined) == 3
    if container == C_TENSOR:
        assert joined.device == META


def test_result_slices_reassembled_on_callers_device() -> None:
    here = [Column("0", C_TENSOR, torch.tensor([1.0, 2.0]))]  # scored on this rank, on the CPU
    decoded = [Column("0", C_TENSOR, torch.tensor([3.0], device=META))]  # decoded on another device
    joined = reassemble([(here, None), (decoded, None)], [2, 0, 1], META)
    assert joined.device == META
    assert tuple(joined.shape) == (3,)
    on_cpu = reassemble([([Column("0", C_TENSOR, torch.tensor([1.0, 2.0]))], ["a"])], [1, 0], CPU)
    assert list(on_cpu) == ["a"]
    assert torch.equal(on_cpu["a"], torch.tensor([2.0, 1.0]))
