"""``mode="main"`` at scale: what a non-scoring rank's call touches (issue 31, docs/scale.md).

A recording wrapper around each thread-rank's backend notes, per collective, the peers it involves
*as gloo runs it*: an ``all_to_all`` or ``all_gather`` (gloo ``alltoallv``) exchanges with every peer,
even for zero bytes; a ``scatter`` or ``gather`` involves a non-root rank and the root only.
"""

from __future__ import annotations

from typing import Any

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_threads


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
