"""Decorator options and call arguments are validated and interpreted as documented."""

from __future__ import annotations

import array
import math
import time
from collections import deque
from typing import Any

import pytest
from _helpers import outcome

import syncreward
from syncreward import NotSynced, synced_reward
from syncreward.testing import run_threads

# ------------------------------------------------------------------------------------------- timeout=


@pytest.mark.parametrize("timeout", [math.inf, math.nan, 1e10, 0, -1], ids=["inf", "nan", "1e10", "0", "-1"])
def test_timeout_validation_rejects(timeout: float) -> None:
    def f(completions: Any, **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="timeout"):
        synced_reward(timeout=timeout)(f)


def test_timeout_validation_accepts_thirty_days() -> None:
    def f(completions: Any, **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)

    assert synced_reward(timeout=30 * 86400)(f)(["a"]) == [1.0]


# ------------------------------------------------------------------------------- include/exclude/shared


def test_include_exclude_shared_string_is_one_name() -> None:
    """``exclude="image"`` is the column ``image``, not the columns ``i``, ``m``, ``a``, ``g`` and ``e``."""
    seen: dict[str, dict[str, Any]] = {}

    def excl(completions: Any, **kwargs: Any) -> list[int]:
        seen["exclude"] = dict(kwargs)
        return [0] * len(completions)

    def incl(completions: Any, **kwargs: Any) -> list[int]:
        seen["include"] = dict(kwargs)
        return [0] * len(completions)

    def shar(completions: Any, weights: Any, **kwargs: Any) -> list[int]:
        seen["shared"] = {"weights": weights}
        return [0] * len(completions)

    rewards = {
        "exclude": synced_reward(exclude="image", timeout=3)(excl),
        "include": synced_reward(include="extra", timeout=3)(incl),
        "shared": synced_reward(shared="weights", timeout=3)(shar),
    }

    def body(rank: int, world_size: int) -> dict[str, Any]:
        comps = [f"c{rank}a", f"c{rank}b"]
        kw = {"image": [f"img{rank}a", f"img{rank}b"], "extra": [rank, rank]}
        return {
            "exclude": outcome(rewards["exclude"], comps, **kw)[:2],
            "include": outcome(rewards["include"], comps, **kw)[:2],
            "shared": outcome(rewards["shared"], comps, weights=[0.5, 0.25, 0.25])[:2],  # 3 weights, 2 samples
        }

    results = run_threads(body, 2, timeout=30)
    problems = [
        f"rank {rank}, {case}=<one string>: raised {kind}: {info}"
        for rank, got in enumerate(results)
        for case, (kind, info) in got.items()
        if kind != "ok"
    ]
    if "exclude" in seen and not isinstance(seen["exclude"]["image"], NotSynced):
        problems.append(f"exclude='image' sent the column: the function saw {seen['exclude']}")
    if "include" in seen and (
        seen["include"]["extra"] != [0, 0, 1, 1] or not isinstance(seen["include"]["image"], NotSynced)
    ):
        problems.append(f"include='extra' did not gather exactly that column: the function saw {seen['include']}")
    if "shared" in seen and seen["shared"]["weights"] != [0.5, 0.25, 0.25]:
        problems.append(f"shared='weights' did not pass the list through: {seen['shared']}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------ per-sample containers


@pytest.mark.parametrize("kind", ["deque", "array", "range"])
def test_deque_array_range_columns_are_per_sample(kind: str) -> None:
    """A named column passed as a deque, an array.array or a range with one entry per sample is gathered."""
    seen: list[Any] = []

    def reward(completions: Any, scores: Any, **kwargs: Any) -> list[int]:
        seen.append(scores)
        return [len(completions)] * len(completions)

    synced = synced_reward(timeout=3)(reward)
    local = {0: [1, 2], 1: [3, 4, 5]}

    def column(rank: int) -> Any:
        if kind == "deque":
            return deque(local[rank])
        if kind == "array":
            return array.array("q", local[rank])
        return range(local[rank][0], local[rank][-1] + 1)

    def body(rank: int, world_size: int) -> Any:
        return outcome(synced, [f"c{i}" for i in local[rank]], scores=column(rank))[:2]

    results = run_threads(body, 2, timeout=30)
    assert results == [("ok", [5, 5]), ("ok", [5, 5, 5])], f"{kind} column: {results}"
    assert len(seen) == 1, seen
    assert type(seen[0]) is list, f"the function saw a {type(seen[0]).__name__}: {seen[0]!r}"
    assert seen[0] == [1, 2, 3, 4, 5]


# ----------------------------------------------------------------------------------------- column names


def test_lone_surrogate_column_name_raises_everywhere_then_recovers() -> None:
    def reward(completions: Any, **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)

    synced = synced_reward(timeout=2)(reward)

    def body(rank: int, world_size: int) -> Any:
        out = {}
        t0 = time.monotonic()
        try:
            synced([f"c{rank}"], **{"col\udcff": [rank]})
            out["surrogate"] = ("ok", None)
        except syncreward.SyncRewardError as e:
            out["surrogate"] = ("SyncRewardError", type(e).__name__)
        except BaseException as e:
            out["surrogate"] = ("other", f"{type(e).__name__}: {e}")
        out["surrogate_s"] = time.monotonic() - t0
        out["next"] = outcome(synced, [f"c{rank}"])[:2]
        return out

    problems = []
    for rank, got in enumerate(run_threads(body, 2, timeout=30)):
        if got["surrogate"][0] not in ("ok", "SyncRewardError"):
            problems.append(f"rank {rank}: the call raised {got['surrogate'][1]}, not a SyncRewardError")
        if got["surrogate_s"] > 4.0:
            problems.append(f"rank {rank}: the call took {got['surrogate_s']:.1f}s")
        if got["next"] != ("ok", [1.0]):
            problems.append(f"rank {rank}: the next call gave {got['next']}")
    assert not problems, "\n".join(problems)
