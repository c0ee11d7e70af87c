"""The user's global torch state does not reach syncreward: default device, device context, default dtype.

Training scripts often run ``torch.set_default_device("cuda")`` or wrap a step in ``with
torch.device("cuda"):``. syncreward's own buffers (receive tensors, decoded tensors, empty ones
included) name their device and dtype, so every synced call still works, its results are right and
on the caller's device, and the call after the default is reset works too. ``meta`` stands in for
``cuda`` here: a buffer that followed the default would land on it, and gloo refuses it.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from _helpers import outcome, same

from syncreward import synced_reward, synced_rewards
from syncreward.testing import run_ranks, run_threads

SIZES = [3, 0, 3]  # uneven, one rank without samples (its decoded columns and results are empty tensors)
STATES = ("set_default_device", "device_context", "default_dtype")


def score(completions: Any, x: torch.Tensor, **kwargs: Any) -> dict[str, Any]:
    lengths = torch.tensor([len(c) for c in completions], dtype=torch.float32, device=x.device)
    return {"tensor": x * 2 + lengths, "list": [float(len(c)) for c in completions]}


def score_again(completions: Any, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    return x + 0.5


MODES: dict[str, tuple[Callable[..., Any], ...]] = {
    "main": (synced_reward(mode="main", timeout=30)(score),),
    "replicate": (synced_reward(mode="replicate", timeout=30)(score),),
    "shard": (synced_reward(mode="shard", group_size=2, timeout=30)(score),),  # a group spans ranks 0 and 2
    "reward_group": synced_rewards(score, score_again, mode="main", timeout=30),
}
PLAIN = {"main": (score,), "replicate": (score,), "shard": (score,), "reward_group": (score, score_again)}


DTYPE = torch.get_default_dtype()


@contextlib.contextmanager
def global_state(state: str) -> Iterator[None]:
    if state == "set_default_device":
        torch.set_default_device("meta")
        try:
            yield
        finally:
            torch.set_default_device(None)
    elif state == "device_context":
        with torch.device("meta"):
            yield
    else:
        torch.set_default_dtype(torch.float64)
        try:
            yield
        finally:  # the process's dtype as this module found it: thread-ranks share it, so none restores another's
            torch.set_default_dtype(DTYPE)


def inputs(rank: int) -> tuple[list[str], torch.Tensor]:
    start, n = sum(SIZES[:rank]), SIZES[rank]
    completions = [f"r{rank}-" + "x" * i for i in range(n)]
    return completions, torch.arange(start, start + n, dtype=torch.float32, device="cpu")


def expected(mode: str, rank: int) -> list[Any]:
    """Each plain function on the global batch, this rank's rows."""
    parts = [inputs(r) for r in range(len(SIZES))]
    completions = [c for p in parts for c in p[0]]
    x = torch.cat([p[1] for p in parts])
    lo, hi = sum(SIZES[:rank]), sum(SIZES[: rank + 1])
    out = []
    for fn in PLAIN[mode]:
        got = fn(completions, x)
        out.append({k: v[lo:hi] for k, v in got.items()} if isinstance(got, dict) else got[lo:hi])
    return out


def body(rank: int, world_size: int, barrier: Any = None) -> dict[str, list[str]]:
    """Every mode under every kind of global state, then after it is reset: what went wrong, per case."""
    problems: dict[str, list[str]] = {}
    for state in STATES:
        for mode, fns in MODES.items():
            want = expected(mode, rank)
            found: list[str] = []
            for when in ("under", "after"):
                with global_state(state) if when == "under" else contextlib.nullcontext():
                    if barrier is not None:  # threads share the process's dtype: all set it before any call
                        barrier.wait(60)
                    args = inputs(rank)  # the same objects for every member: a reward group's later member hits
                    got = [outcome(fn, *args)[:2] for fn in fns]
                    if barrier is not None:
                        barrier.wait(60)
                for (kind, value), w in zip(got, want, strict=True):
                    if kind != "ok" or not same(value, w):
                        found.append(f"{when} {state}: {kind} {value!r}, expected {w!r}")
            problems[f"{mode}-{state}"] = found
    return problems


CASES = [f"{mode}-{state}" for state in STATES for mode in MODES]


@pytest.fixture(scope="module")
def on_gloo_ranks() -> list[dict[str, list[str]]]:
    return run_ranks(body, len(SIZES), timeout=300)


@pytest.fixture(scope="module")
def on_threads() -> list[dict[str, list[str]]]:
    barrier = threading.Barrier(len(SIZES))
    return run_threads(body, len(SIZES), barrier, timeout=300)


def _check(results: list[dict[str, list[str]]], case: str) -> None:
    problems = [f"rank {rank}: {p}" for rank, r in enumerate(results) for p in r[case]]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("case", CASES)
def test_default_device_and_dtype_do_not_reach_syncreward_on_gloo_ranks(
    on_gloo_ranks: list[dict[str, list[str]]], case: str
) -> None:
    _check(on_gloo_ranks, case)


@pytest.mark.parametrize("case", CASES)
def test_default_device_and_dtype_do_not_reach_syncreward_on_threads(
    on_threads: list[dict[str, list[str]]], case: str
) -> None:
    _check(on_threads, case)
