"""syncreward's own gloo groups are set up under names every member agrees on.

A torch subgroup that some ranks are not members of, overlapping subgroups, and ranks that hold
different numbers of unrelated torch groups must not change which gloo groups meet at the first synced
call (issue 15: torch's locally synchronised ``new_group`` names a group from the caller's own count of
groups, so such ranks never met and the first call timed out on every rank).
"""

from __future__ import annotations

from typing import Any

import pytest

from syncreward import synced_reward
from syncreward.testing import run_ranks

pytestmark = pytest.mark.multiprocess

# Hang detectors, not speed limits. A launch takes about 2.5 s on 2 idle cores -- almost all of it starting 3
# processes that each import torch (the bodies run in ~20 ms) -- and ~19 s at load 4-13, so the budgets leave
# room for a busy machine; a synced call waits only for ranks that already met in new_group.
RUN_TIMEOUT = 180  # for the whole launch
CALL_TIMEOUT = 60  # for each synced call


def batch_normalized(completions: Any, **kwargs: Any) -> list[float]:
    mean = sum(map(len, completions)) / len(completions)
    return [len(c) - mean for c in completions]


def _batch(rank: int, tag: str = "") -> list[str]:
    return [f"{tag}r{rank}-" + "x" * i for i in range(rank + 2)]


def _expected(batches: list[list[str]], rank_index: int) -> list[float]:
    """The global-batch result of the rank at ``rank_index`` of ``batches`` (the group's ranks in order)."""
    full = batch_normalized([c for b in batches for c in b])
    lo = sum(len(b) for b in batches[:rank_index])
    return full[lo : lo + len(batches[rank_index])]


synced = synced_reward(timeout=CALL_TIMEOUT)(batch_normalized)


def subgroup_body(rank: int, world_size: int) -> dict[str, list[float]]:
    import torch.distributed as dist

    group = dist.new_group([0, 1])  # every rank calls new_group, as torch requires; rank 2 is not a member
    out: dict[str, list[float]] = {}
    if rank in (0, 1):
        out["sub"] = synced_reward(timeout=CALL_TIMEOUT, process_group=group)(batch_normalized)(_batch(rank))
    # then the whole job: ranks 0 and 1 now hold syncreward's subgroup groups, rank 2 does not
    out["world"] = synced(_batch(rank, "w"))
    return out


def test_subgroup_that_some_ranks_are_not_members_of() -> None:
    results = run_ranks(subgroup_body, 3, timeout=RUN_TIMEOUT)
    sub = [_batch(0), _batch(1)]
    world = [_batch(r, "w") for r in range(3)]
    assert results[0] == {"sub": _expected(sub, 0), "world": _expected(world, 0)}
    assert results[1] == {"sub": _expected(sub, 1), "world": _expected(world, 1)}
    assert results[2] == {"world": _expected(world, 2)}


def overlapping_body(rank: int, world_size: int, rank1_order: tuple[str, str]) -> dict[str, list[float]]:
    import torch.distributed as dist

    groups = {"a": dist.new_group([0, 1]), "b": dist.new_group([1, 2])}
    members = {"a": (0, 1), "b": (1, 2)}
    out: dict[str, list[float]] = {}
    for name in rank1_order if rank == 1 else ("a", "b"):
        if rank in members[name]:
            f = synced_reward(timeout=CALL_TIMEOUT, process_group=groups[name])(batch_normalized)
            out[name] = f(_batch(rank, name))
    return out


@pytest.mark.parametrize("rank1_order", [("a", "b"), ("b", "a")])
def test_overlapping_data_parallel_groups(rank1_order: tuple[str, str]) -> None:
    results = run_ranks(overlapping_body, 3, rank1_order, timeout=RUN_TIMEOUT)
    a = [_batch(0, "a"), _batch(1, "a")]
    b = [_batch(1, "b"), _batch(2, "b")]
    assert results[0] == {"a": _expected(a, 0)}
    assert results[1] == {"a": _expected(a, 1), "b": _expected(b, 0)}
    assert results[2] == {"b": _expected(b, 1)}


def unrelated_groups_body(rank: int, world_size: int) -> dict[str, list[float]]:
    import torch.distributed as dist

    # rank r alone creates r locally synchronised groups over itself: the ranks now hold different numbers
    # of torch groups (and torch's hashed group names depend on that count)
    for _ in range(rank):
        dist.new_group([rank], use_local_synchronization=True)
    out = {"world": synced(_batch(rank))}
    sub = dist.new_group([0, 1])  # and a subgroup created after that, by every rank
    if rank in (0, 1):
        out["sub"] = synced_reward(timeout=CALL_TIMEOUT, process_group=sub)(batch_normalized)(_batch(rank, "s"))
    out["world_again"] = synced(_batch(rank, "w"))
    return out


def test_ranks_holding_different_numbers_of_torch_groups() -> None:
    results = run_ranks(unrelated_groups_body, 3, timeout=RUN_TIMEOUT)
    world = [_batch(r) for r in range(3)]
    again = [_batch(r, "w") for r in range(3)]
    sub = [_batch(0, "s"), _batch(1, "s")]
    for rank, res in enumerate(results):
        assert res["world"] == _expected(world, rank), rank
        assert res["world_again"] == _expected(again, rank), rank
        if rank < 2:
            assert res["sub"] == _expected(sub, rank), rank
        else:
            assert "sub" not in res


def _never_called_by_rank1_body(rank: int, world_size: int, earlier: str, done: str) -> Any:
    """Rank 1 never makes the subgroup's first call; rank 0 gives up on it and names who is missing."""
    import os
    import time

    import torch.distributed as dist

    import syncreward

    sub = dist.new_group([0, 1])
    if earlier == "world":  # every rank has already set up (and arrived at) the whole job's groups
        synced(_batch(rank))
        synced(_batch(rank, "w"))
    if rank != 0:  # rank 1 stays in the job without the call; rank 2 is no member
        deadline = time.monotonic() + 60
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    try:
        synced_reward(timeout=2, process_group=sub)(batch_normalized)(_batch(rank, "s"))
        return ("ok", (), "")
    except syncreward.SyncTimeoutError as e:
        return ("SyncTimeoutError", tuple(e.missing_ranks), str(e))
    finally:
        open(done, "w").close()


@pytest.fixture(scope="module", params=["none", "world"])
def subgroup_timeout(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    done = str(tmp_path_factory.mktemp("setup") / "done")
    return request.param, run_ranks(_never_called_by_rank1_body, 3, request.param, done, timeout=90)[0]


def test_setup_timeout_names_the_missing_rank_after_an_earlier_group(subgroup_timeout: tuple[str, Any]) -> None:
    """Arrival records are per group being set up: arriving at the whole job's groups is not arriving here."""
    earlier, (kind, missing, message) = subgroup_timeout
    assert kind == "SyncTimeoutError", (earlier, message)
    assert missing == (1,), (earlier, message)
    assert "rank(s) [1] did not make their first synced call" in message, (earlier, message)


def test_call_number_counts_the_calls_over_the_same_group(subgroup_timeout: tuple[str, Any]) -> None:
    """``#N`` is the sequence number that pairs calls over a group, the same on every member (docs say so)."""
    earlier, (_, _, message) = subgroup_timeout
    assert message.startswith("synced call #0 of 'batch_normalized' timed out on rank 0"), (earlier, message)
    from pathlib import Path

    text = " ".join((Path(__file__).parent.parent / "docs" / "troubleshooting.md").read_text().split())
    assert "`#N` is the call's sequence number over its group" in text
    assert "counts this process's synced calls" not in text


def test_setup_timeout_names_the_timeout_given_rounded(subgroup_timeout: tuple[str, Any]) -> None:
    """The first call's set-up times out naming ``timeout=2s``, as every other timeout message does."""
    earlier, (_, _, message) = subgroup_timeout
    assert "within timeout=2s," in message, (earlier, message)
