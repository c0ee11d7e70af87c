"""Shard mode: results scored on different ranks are combined by key and must agree in type; groups form by the
content of the ``group_by`` value (TRL's prompts, plain or conversational)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import outcome, same

import syncreward
from syncreward import synced_reward
from syncreward._codec import C_LIST, C_NDARRAY, C_TENSOR
from syncreward._modes.shard import KEY_BYTES, group_keys
from syncreward.testing import run_ranks, run_threads

BATCHES = [["r0-0", "r0-1"], ["r1-0", "r1-1"]]  # group_size=2: one group per rank, each scored by a different rank


def _run(reward: Any) -> list[tuple[str, Any]]:
    synced = synced_reward(mode="shard", group_size=2, timeout=3)(reward)

    def body(rank: int, world_size: int) -> tuple[str, Any]:
        return outcome(synced, BATCHES[rank])[:2]

    return run_threads(body, 2, timeout=60)


def test_shard_results_dict_key_order_differs_between_scoring_ranks() -> None:
    def reward(completions: Any, **kwargs: Any) -> dict[str, list[str]]:
        a = [f"a:{c}" for c in completions]
        b = [f"b:{c}" for c in completions]
        return {"a": a, "b": b} if completions[0].startswith("r0") else {"b": b, "a": a}

    results = _run(reward)
    problems = []
    for rank, (kind, value) in enumerate(results):
        want = {"a": [f"a:{c}" for c in BATCHES[rank]], "b": [f"b:{c}" for c in BATCHES[rank]]}
        if kind != "ok" or value != want:
            problems.append(f"rank {rank}: got {kind} {value!r}, expected {want!r}")
    assert not problems, "\n".join(problems)


def _list_or_array(completions: Any, **kwargs: Any) -> Any:
    values = [float(len(c)) for c in completions]
    return values if completions[0].startswith("r0") else np.array(values)


def _int_or_float_array(completions: Any, **kwargs: Any) -> Any:
    dtype = np.int64 if completions[0].startswith("r0") else np.float64
    return np.array([len(c) for c in completions], dtype=dtype)


@pytest.mark.parametrize("reward", [_list_or_array, _int_or_float_array], ids=["list-vs-ndarray", "int64-vs-float64"])
def test_shard_results_disagreeing_types_raise_on_every_rank(reward: Any) -> None:
    results = _run(reward)
    problems = [
        f"rank {rank}: {kind} {value!r}"
        for rank, (kind, value) in enumerate(results)
        if not isinstance(getattr(syncreward, kind, None), type)
        or not issubclass(getattr(syncreward, kind), syncreward.SyncRewardError)
    ]
    assert not problems, "scoring ranks returned different result types; every rank must raise:\n" + "\n".join(problems)


# ------------------------------------------------------------------------- group_by: grouping by content
# TRL passes no group id: a reward groups by ``prompts``, which TRL's conversational datasets give as lists of
# message dicts (one copy per completion). Groups form by the content of the value, digested alike on every
# rank (never by ``hash()``, which differs between processes for str).

K = 4  # completions per prompt; 3 prompts over 2 ranks of 6: prompt 1 is split 2 + 2
PROMPTS_TEXT = [f"What is {g} + {g}?" for g in range(3)]


def trl_prompts(kind: str) -> list[Any]:
    """The global ``prompts`` column as TRL passes it: each prompt repeated K times (fresh objects per row)."""
    if kind == "plain":
        return [PROMPTS_TEXT[i // K] for i in range(3 * K)]
    system = {"role": "system", "content": "Answer briefly."}
    return [[dict(system), {"role": "user", "content": PROMPTS_TEXT[i // K]}] for i in range(3 * K)]


def judge_by_prompt(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
    """A group-local judge: a completion's rank among the completions of the same prompt, plus the group size."""
    out = []
    for i, c in enumerate(completions):
        group = [completions[j] for j in range(len(completions)) if prompts[j] == prompts[i]]
        out.append(sorted(group).index(c) / len(group) + 10 * len(group))
    return out


shard_by_prompts = synced_reward(mode="shard", group_by="prompts", timeout=60)(judge_by_prompt)


def _prompts_body(rank: int, world_size: int, kind: str) -> Any:
    rows = slice(6 * rank, 6 * rank + 6)
    completions = [f"c{(7 * i) % 12:02d}" for i in range(3 * K)]
    return shard_by_prompts(prompts=trl_prompts(kind)[rows], completions=completions[rows])


def _expected_by_prompt(kind: str) -> list[list[float]]:
    full = judge_by_prompt(trl_prompts(kind), [f"c{(7 * i) % 12:02d}" for i in range(3 * K)])
    return [full[:6], full[6:]]


@pytest.mark.parametrize("kind", ["plain", "conversational"])
def test_group_by_prompts_groups_by_content_on_threads(kind: str) -> None:
    assert run_threads(_prompts_body, 2, kind, timeout=60) == _expected_by_prompt(kind)


@pytest.mark.multiprocess
def test_group_by_prompts_groups_by_content_on_gloo_ranks() -> None:
    # spawned ranks draw their own str hash seeds: a grouping that used hash() would split the groups
    for kind in ("plain", "conversational"):
        got = run_ranks(_prompts_body, 2, kind, timeout=120, env={"PYTHONHASHSEED": "random"})
        assert got == _expected_by_prompt(kind), kind


def test_group_by_keys_are_the_same_in_every_process() -> None:
    """The digests do not depend on the process's str hash seed."""
    code = (
        "from syncreward._codec import C_LIST; from syncreward._modes.shard import group_keys; "
        "print(group_keys([[{'role': 'user', 'content': 'q'}], 'p', b'b', 3, None, (1, 'x')], C_LIST, 'k').hex())"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1, outs


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ({"role": "user", "content": "q"}, {"content": "q", "role": "user"}),  # dicts are equal in any key order
        (1, 1.0),
        (True, 1),
        (np.int64(7), 7),
        (np.float32(0.5), 0.5),
        ([1, "a"], [1.0, "a"]),
        (np.array([1, 2]), [1, 2]),
        (np.str_("a"), "a"),  # a top-level str takes a shortcut: the same key as the general path
        (10**30, np.array([10**30], dtype=object)[0]),
    ],
    ids=[
        "dict-order",
        "int-float",
        "bool-int",
        "numpy-int",
        "numpy-float",
        "nested",
        "array-list",
        "numpy-str",
        "bigint",
    ],
)
def test_group_by_equal_values_share_a_key(a: Any, b: Any) -> None:
    ka, kb = group_keys([a], C_LIST, "k"), group_keys([b], C_LIST, "k")
    assert ka == kb
    assert len(ka) == KEY_BYTES


@pytest.mark.parametrize(
    ("a", "b"),
    [("1", 1), ([1], (1,)), ("a", b"a"), (0.5, 0.25), ({"a": 1}, {"a": 2}), (None, 0), ([[1], 2], [1, [2]])],
    ids=["str-int", "list-tuple", "str-bytes", "floats", "dict-values", "None-0", "nesting"],
)
def test_group_by_different_values_get_different_keys(a: Any, b: Any) -> None:
    assert group_keys([a], C_LIST, "k") != group_keys([b], C_LIST, "k")


def test_group_by_rows_of_a_2d_array_group_by_content() -> None:
    ids = np.array([[1, 2], [3, 4], [1, 2], [3, 4]])
    keys = group_keys(ids, C_NDARRAY, "k")
    assert keys[:KEY_BYTES] == keys[2 * KEY_BYTES : 3 * KEY_BYTES] != keys[KEY_BYTES : 2 * KEY_BYTES]
    assert group_keys(torch.from_numpy(ids), C_TENSOR, "k") == keys


class _Opaque:
    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Opaque)

    __hash__ = object.__hash__


def _opaque_body(rank: int, world_size: int) -> tuple[str, Any]:
    synced = synced_reward(mode="shard", group_by="prompt", timeout=30, allow_pickle=True)(
        lambda completions, prompt, **kw: [0.0] * len(completions)
    )
    prompt = [_Opaque()] if rank == 1 else ["p"]
    return outcome(synced, ["c"], prompt=prompt)[:2]


def test_group_by_values_that_are_not_plain_data_raise_on_every_rank() -> None:
    results = run_threads(_opaque_body, 2, timeout=60)
    assert results[1][0] == "InputError", results
    assert "group_by='prompt'" in results[1][1]
    assert "HINT" in results[1][1]
    assert results[0][0] == "RemoteError", results
    assert results[0][1][:2] == (1, "syncreward.InputError")


# ------------------------------------------------------------------- log_metric: the batch's value in shard mode
# TRL averages every log_metric call of a step over all ranks. In shard mode each scoring rank logs for its own
# share, so every rank replays one value per name: the scoring ranks' values weighted by the samples each scored.
# Prompt 0 has 6 completions, prompt 1 has 2: rank 0 scores 6 samples (2 correct), rank 1 scores 2 (2 correct).
# The batch's accuracy is 4/8 = 0.5; the plain mean of the two shards' accuracies would be (1/3 + 1) / 2.

METRIC_PROMPTS = [0] * 6 + [1] * 2
METRIC_CORRECT = [1, 1, 0, 0, 0, 0, 1, 1]


def label_accuracy(completions: Any, prompt_id: Any, correct: Any, log_metric: Any, **kwargs: Any) -> list[float]:
    log_metric("accuracy", sum(correct) / len(correct))
    log_metric("scored", float(len(correct)))
    if len(completions) == 2:  # a name only one scoring rank logs, twice: its mean, that rank alone
        log_metric("only_small", 1.0)
        log_metric("only_small", 0.0)
    return [float(c) for c in correct]


shard_accuracy = synced_reward(mode="shard", group_by="prompt_id", timeout=60)(label_accuracy)


def _metric_body(rank: int, world_size: int) -> list[tuple[str, float]]:
    rows = slice(4 * rank, 4 * rank + 4)  # 4 rows per rank: prompt 0's group is split 4 + 2
    logged: list[tuple[str, float]] = []
    shard_accuracy(
        completions=[f"c{i}" for i in range(8)][rows],
        prompt_id=METRIC_PROMPTS[rows],
        correct=METRIC_CORRECT[rows],
        log_metric=lambda name, value: logged.append((name, value)),
    )
    return logged


def _check_metric_logs(logged: list[list[tuple[str, float]]]) -> None:
    want = [("accuracy", 0.5), ("scored", (6 * 6 + 2 * 2) / 8), ("only_small", 0.5)]
    for rank, calls in enumerate(logged):
        assert [name for name, _ in calls] == [name for name, _ in want], (rank, calls)
        assert [v for _, v in calls] == pytest.approx([v for _, v in want]), (rank, calls)
    # what TRL logs: the mean of every call on every rank
    accuracy = [v for calls in logged for name, v in calls if name == "accuracy"]
    assert sum(accuracy) / len(accuracy) == pytest.approx(sum(METRIC_CORRECT) / len(METRIC_CORRECT))


def test_log_metric_in_shard_mode_logs_the_batch_mean_on_threads() -> None:
    _check_metric_logs(run_threads(_metric_body, 2, timeout=60))


@pytest.mark.multiprocess
def test_log_metric_in_shard_mode_logs_the_batch_mean_on_gloo_ranks() -> None:
    _check_metric_logs(run_ranks(_metric_body, 2, timeout=120))


def _text_metric_body(rank: int, world_size: int) -> tuple[str, Any]:
    def reward(completions: Any, log_metric: Any, **kwargs: Any) -> list[float]:
        log_metric("note", "not a number" if completions[0] == "r1" else 1.0)
        return [0.0] * len(completions)

    synced = synced_reward(mode="shard", group_size=1, timeout=30)(reward)
    return outcome(synced, [f"r{rank}"], log_metric=lambda name, value: None)[:2]


def test_log_metric_in_shard_mode_with_a_value_that_is_no_number_raises_on_every_rank() -> None:
    results = run_threads(_text_metric_body, 2, timeout=60)
    assert results[1][0] == "InputError", results
    assert "log_metric('note', value)" in results[1][1]
    assert "HINT" in results[1][1]
    assert results[0][0] == "RemoteError", results
    assert results[0][1][:2] == (1, "syncreward.InputError")


# --------------------------------------------------------------------------------------- an empty global batch

calls: list[int] = []  # the batch sizes the reward was called with, over every thread-rank


def _empty_dict_reward(completions: Any, log_metric: Any, **kwargs: Any) -> dict[str, list[float]]:
    calls.append(len(completions))
    log_metric("scored", float(len(completions)))
    return {"acc": [1.0 for _ in completions]}


def _empty_tensor_reward(completions: Any, log_metric: Any, **kwargs: Any) -> torch.Tensor:
    calls.append(len(completions))
    log_metric("scored", float(len(completions)))
    return torch.zeros(len(completions), 3, dtype=torch.float64)


def _empty_batch_results(reward: Any, world_size: int, **options: Any) -> tuple[list[Any], list[Any]]:
    """What every rank gets back, and logs, when every rank passes no samples."""
    synced = synced_reward(reward, timeout=10, **options)

    def body(rank: int, world_size: int) -> tuple[Any, list[Any]]:
        logged: list[Any] = []
        return synced([], log_metric=lambda name, value: logged.append((name, value))), logged

    got = run_threads(body, world_size, timeout=60)
    return [r for r, _ in got], [logged for _, logged in got]


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("options", [{"group_size": 2}, {"group_by": "completions"}], ids=["group_size", "group_by"])
@pytest.mark.parametrize("reward", [_empty_dict_reward, _empty_tensor_reward], ids=["dict", "tensor"])
def test_shard_with_an_empty_global_batch_returns_what_one_process_returns_on_every_rank(
    reward: Any, options: dict[str, Any], world_size: int
) -> None:
    calls.clear()
    alone_logged: list[Any] = []
    alone = synced_reward(reward)([], log_metric=lambda name, value: alone_logged.append((name, value)))
    assert calls == [0]  # one process: the function is called on the empty batch
    calls.clear()
    results, logged = _empty_batch_results(reward, world_size, mode="shard", **options)
    assert calls == [0], "the function is called once, on the empty batch"
    for rank, got in enumerate(results):
        assert same(got, alone), (rank, got, alone)  # {'acc': []}, a (0, 3) float64 tensor -- never a bare []
    assert logged == [alone_logged] * world_size  # every rank logs the metric the empty batch gave: 0.0, not nan


def test_shard_with_an_empty_global_batch_raises_what_the_function_raises_on_every_rank() -> None:
    def mean_length(completions: Any, **kwargs: Any) -> list[float]:
        mean = sum(len(c) for c in completions) / len(completions)  # ZeroDivisionError on the empty batch
        return [len(c) - mean for c in completions]

    synced = synced_reward(mean_length, mode="shard", group_size=2, timeout=10)
    results = run_threads(lambda rank, world_size: outcome(synced, [])[:2], 2, timeout=60)
    assert results[0][0] == "ZeroDivisionError", results
    assert results[1][0] == "RemoteError", results
    assert results[1][1][:2] == (0, "ZeroDivisionError"), results
