"""A peer that leaves right after finishing its part never fails a call whose data arrived.

Rank 0 hosts the rendezvous store and exits right after its last synced call. Rank 1's last call is
waiting for its results when that happens: its data has arrived, but its wait looks at the store (the
arrival record, the abort key), which is gone. The interleaving is forced on rank 1: its outbound wait
reports one "slice timed out" after the data arrived and rank 0 has exited, so it then meets the dead
store -- the call must still return its results.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from syncreward import synced_reward
from syncreward.backends import torch_distributed
from syncreward.testing import run_ranks

pytestmark = pytest.mark.multiprocess


def _plain(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


class _LateWork:
    """A gloo work whose first wait completes, then waits until rank 0 has exited, then says it timed out."""

    def __init__(self, work: Any, store: Any) -> None:
        self._work, self._store, self._first = work, store, True

    def wait(self, timeout: Any = None) -> bool:
        if not self._first:
            return bool(self._work.wait(timeout))
        self._first = False
        self._work.wait()  # the data has arrived
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until rank 0 (and the store it hosts) is gone
            try:
                self._store.check(["abort"])
            except Exception:
                break
            time.sleep(0.05)
        raise RuntimeError("Operation timed out!")  # what gloo says when a wait slice expires


def _body(rank: int, world_size: int) -> tuple[str, Any]:
    synced = synced_reward(timeout=60)(_plain)
    first = synced([f"c{rank}"])
    if rank == 1:
        wait = torch_distributed.TorchDistributedBackend._wait

        def late_wait(self: Any, work: Any, channel: int, timeout: float) -> None:
            if channel == 1:
                work = _LateWork(work, self._store)
            wait(self, work, channel, timeout)

        torch_distributed.TorchDistributedBackend._wait = late_wait  # type: ignore[method-assign]
    try:
        last = synced([f"cc{rank}"])
    except Exception as e:
        return type(e).__name__, str(e)[:300]
    # rank 0 returns now: its process exits, with the rendezvous store
    return "ok", (first, last)


def test_peer_leaves_after_its_part_does_not_fail_a_call_whose_data_arrived() -> None:
    (r0, r1) = run_ranks(_body, 2, timeout=120)
    assert r0 == ("ok", ([2.0], [3.0])), r0
    assert r1 == ("ok", ([2.0], [3.0])), f"rank 1's last call failed although its data had arrived: {r1}"
