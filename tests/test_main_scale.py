"""``mode="main"`` at scale: what a non-scoring rank's call touches (issue 31, docs/scale.md).

A recording wrapper around each thread-rank's backend notes, per collective, the peers it involves
*as gloo runs it*: an ``all_to_all`` or ``all_gather`` (gloo ``alltoallv``) exchanges with every peer,
even for zero bytes; a ``scatter`` or ``gather`` involves a non-root rank and the root only.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks, run_threads


class _Recording:
    """Forwards to the thread-rank's backend, noting which peers each collective involves."""

    def __init__(self, inner: Any, peers: list[set[int]]) -> None:
        self.inner, self.peers = inner, peers
        self.rank, self.world_size = inner.rank, inner.world_size

    def _everyone(self) -> None:
        self.peers.append({r for r in range(self.world_size) if r != self.rank})

    def _root(self, root: int) -> None:
        self.peers.append({r for r in range(self.world_size) if r != self.rank} if self.rank == root else {root})

    def all_gather(self, row: Any, **kw: Any) -> Any:
        self._everyone()
        return self.inner.all_gather(row, **kw)

    def all_to_all(self, send: Any, send_counts: Any, recv_counts: Any, **kw: Any) -> Any:
        self._everyone()
        return self.inner.all_to_all(send, send_counts, recv_counts, **kw)

    def scatter(self, send: Any, size: int, *, root: int, **kw: Any) -> Any:
        self._root(root)
        return self.inner.scatter(send, size, root=root, **kw)

    def gather(self, send: Any, size: int, *, root: int, **kw: Any) -> Any:
        self._root(root)
        return self.inner.gather(send, size, root=root, **kw)

    def send(self, data: Any, dst: int, **kw: Any) -> None:
        self.peers.append({dst})
        self.inner.send(data, dst, **kw)

    def recv(self, size: int, src: int, **kw: Any) -> Any:
        self.peers.append({src})
        return self.inner.recv(size, src, **kw)


def _peers_per_call(rank: int, world_size: int) -> list[set[int]]:
    peers: list[set[int]] = []
    f = synced_reward(backend=_Recording(syncreward.resolve_backend("auto"), peers))(
        lambda completions, **kw: [float(len(c)) for c in completions]
    )
    for _ in range(3):  # the first calls size the chunks and blocks
        f([f"r{rank}"] * (rank + 1))
    peers.clear()
    f([f"r{rank}"] * (rank + 1))
    return peers


def test_main_call_of_a_non_scoring_rank_involves_rank_0_only() -> None:
    results = run_threads(_peers_per_call, 4)
    for rank in range(1, 4):
        assert set().union(*results[rank]) == {0}, (rank, results[rank])


def _modes_meet(rank: int, world_size: int) -> list[tuple[str, str, float]]:
    reward = lambda completions, **kw: [float(len(c)) for c in completions]  # noqa: E731
    main = synced_reward(mode="main", timeout=60)(reward)
    other = synced_reward(mode="replicate", timeout=60)(reward)
    out = []
    for f in (main, main if rank == 0 else other, main):
        t0 = time.perf_counter()
        try:
            f([f"r{rank}"] * (rank + 1))
            out.append(("ok", "", time.perf_counter() - t0))
        except syncreward.SyncRewardError as e:
            kind = type(e).__name__ + (" (a MismatchError)" if isinstance(e, syncreward.MismatchError) else "")
            out.append((kind, str(e), time.perf_counter() - t0))
    return out


def test_main_meeting_another_mode_raises_mismatch_on_every_rank_at_once_then_the_group_is_broken() -> None:
    """Rank 0 in main's gather, the others in replicate's all_to_all: they never match in gloo; every rank
    raises a MismatchError naming both collectives within seconds (not at timeout=60), and later calls raise
    GroupBrokenError naming why."""
    results = run_threads(_modes_meet, 3, timeout=120)
    for rank, (first, meet, after) in enumerate(results):
        assert first[0] == "ok", (rank, first)
        kind, text, seconds = meet
        assert kind == "CollectiveMismatchError (a MismatchError)", (rank, meet)
        assert "rank 0: in a gather (mode='main')" in text, text
        assert "rank 1: in an all_to_all" in text, text
        assert "calls of different modes cannot be combined" in text, text
        assert seconds < 10, meet
        assert after[0].startswith("GroupBrokenError"), (rank, after)
        assert "different synced calls" in after[1], after


def _modes_meet_late(rank: int, world_size: int, odd: int) -> tuple[str, str, float]:
    reward = lambda completions, **kw: [float(len(c)) for c in completions]  # noqa: E731
    main = synced_reward(mode="main", timeout=30)(reward)
    other = synced_reward(mode="replicate", timeout=30)(reward)
    if rank == odd:
        time.sleep(1.0)  # the others are in their exchanges first: rank 1 already waits for its results
    t0 = time.perf_counter()
    try:
        (other if rank == odd else main)([f"r{rank}"] * (rank + 1))
        got = ("ok", "", time.perf_counter() - t0)
    except syncreward.SyncRewardError as e:
        kind = type(e).__name__ + (" (a MismatchError)" if isinstance(e, syncreward.MismatchError) else "")
        got = (kind, str(e), time.perf_counter() - t0)
    time.sleep(3.0)  # every rank stays (a trainer that logs the error and goes on): no exit tells the others
    return got


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [3, 4])
def test_main_non_scoring_ranks_beside_a_rank_of_another_mode_raise_mismatch_at_once_on_gloo_ranks(
    world_size: int,
) -> None:
    """Over gloo a non-scoring rank of main is done with its gather at once and waits for its results in a
    scatter: it learns of the mismatch from the ranks that meet it (rank 0's gather, the odd rank's all_to_all),
    and raises the same MismatchError, naming where it waits, within seconds -- not at timeout=30."""
    odd = world_size - 1
    results = run_ranks(_modes_meet_late, world_size, odd, timeout=120)
    for rank, (kind, text, seconds) in enumerate(results):
        assert kind == "CollectiveMismatchError (a MismatchError)", (rank, kind, text)
        assert "rank 0: in a gather (mode='main')" in text, text
        assert f"rank {odd}: in an all_to_all" in text, text
        if 0 < rank < odd:
            assert f"rank {rank}: in a scatter" in text, text
        assert seconds < 10, (rank, seconds, text)


def test_syncreward_gloo_groups_leave_the_users_environment_and_groups_as_they_were() -> None:
    """TORCH_GLOO_LAZY_INIT is set only while syncreward builds its own gloo groups, then restored."""
    results = run_ranks(_lazy_body, 2, timeout=120)
    for rank, (before, during_first, after) in enumerate(results):
        assert before is None and after is None, (rank, before, after)
        assert during_first == "1", (rank, during_first)


def _lazy_body(rank: int, world_size: int) -> tuple[str | None, str | None, str | None]:
    import torch.distributed as dist

    from syncreward.backends import torch_distributed

    seen: list[str | None] = []
    real = dist.ProcessGroupGloo

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(os.environ.get("TORCH_GLOO_LAZY_INIT"))
        return real(*args, **kwargs)

    before = os.environ.get("TORCH_GLOO_LAZY_INIT")
    torch_distributed.dist.ProcessGroupGloo = spy  # type: ignore[misc]
    try:
        f = synced_reward(backend="torch")(lambda completions, **kw: [1.0] * len(completions))
        f([f"r{rank}"])
    finally:
        torch_distributed.dist.ProcessGroupGloo = real  # type: ignore[misc]
    user_group = dist.new_group(backend="gloo")  # the user's own group, built after our first call: eager as ever
    dist.barrier(group=user_group)
    return before, seen[0] if seen else None, os.environ.get("TORCH_GLOO_LAZY_INIT")


class _CountingStore:
    """Forwards to a store, counting its requests by name."""

    def __init__(self, inner: Any, counts: dict[str, int]) -> None:
        self._inner, self._counts = inner, counts

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts[name] = self._counts.get(name, 0) + 1
            return method(*args, **kwargs)

        return counted


SLOW_SCORE_S = 1.0  # rank 0 scores this long: the other ranks poll the store about 5 times while they wait


def _store_requests_while_waiting(rank: int, world_size: int) -> dict[str, int]:
    backend = syncreward.resolve_backend("torch")

    @synced_reward(backend=backend)
    def slow(completions: list[str], **kwargs: Any) -> list[float]:
        time.sleep(SLOW_SCORE_S if len(completions) > world_size else 0)
        return [float(len(c)) for c in completions]

    slow(["a"])  # sets the groups up (and every rank's arrival records)
    counts: dict[str, int] = {}
    backend._store = _CountingStore(backend._store, counts)  # type: ignore[attr-defined]
    slow(["a", "b"])  # the other ranks wait past their first slice, polling
    return counts


def test_main_waiting_ranks_read_their_peers_arrival_records_in_a_fixed_number_of_store_requests() -> None:
    """A rank waiting past its first slice reads every peer's arrival record at each poll (a mode mismatch shows
    there): with one read per peer that was O(W) requests per rank and poll, O(W^2) in all on rank 0's store."""
    results = run_ranks(_store_requests_while_waiting, 4, timeout=120)
    for rank in range(1, 4):
        counts = results[rank]
        assert counts.get("multi_get", 0) >= 3, (rank, counts)  # polled several times, reading the records at once
        assert counts.get("get", 0) <= 1, (rank, counts)  # not one read per peer (the abort record aside)


def test_a_mismatch_record_names_every_rank_it_names_and_the_reader() -> None:
    """The abort record the ranks that meet in different collectives leave for the others (no ranks needed)."""
    from syncreward._errors import CollectiveMismatchError
    from syncreward.backends.torch_distributed import _mismatch_error, _mismatch_record

    record = _mismatch_record({2: "all_to_all", 0: "gather"})
    assert record == "M0:gather 2:all_to_all"
    error = _mismatch_error(record, 1, "scatter")
    assert isinstance(error, CollectiveMismatchError)
    assert isinstance(error, syncreward.MismatchError)
    lines = [line.strip() for line in str(error).splitlines() if line.startswith("  rank")]
    assert lines == [
        "rank 0: in a gather (mode='main')",
        "rank 1: in a scatter (mode='main''s results)",
        "rank 2: in an all_to_all (mode='replicate' or 'shard', or a reward group's hit)",
    ]
    assert "rank 1" not in str(_mismatch_error(record, 1, None))  # a rank that waits nowhere adds nothing
    odd = _mismatch_error("Mno colon here", 1, "scatter")  # not a record this version writes
    assert not isinstance(odd, CollectiveMismatchError)
    assert "no colon here" in str(odd)
