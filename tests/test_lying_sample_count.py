"""A rank whose header announces far more samples than it holds makes every rank raise at once.

Rank 1's header says 20,000,000 samples for its 16 (a corrupted or hostile peer). Before, ``mode="shard"``
built per-sample plans of the announced batch on every rank (+1.2 GB and an IndexError after 12-23 s);
now every rank raises a syncreward error within a fraction of a second, with no allocation sized by the
lie. Checked in every mode, on thread ranks.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any
from unittest import mock

import numpy as np
import pytest

from syncreward import SyncRewardError, _transfers, synced_reward
from syncreward._call import Call
from syncreward._wire import H_N
from syncreward.testing import run_threads

LIE = 20_000_000
_header = _transfers.header


def _lying_header(call: Call, *args: Any) -> bytes:
    header = _header(call, *args)
    if call.rank != 1:
        return header
    words = np.frombuffer(header, dtype=np.int64).copy()
    words[H_N] = LIE
    return words.tobytes()


def _score(completions: list[str], **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


OPTIONS = {
    "main": {"mode": "main"},
    "replicate": {"mode": "replicate"},
    "shard-group-size": {"mode": "shard", "group_size": 2},
    "shard-group-by": {"mode": "shard", "group_by": "prompt_id"},
}


@pytest.mark.parametrize("name", OPTIONS)
def test_every_rank_raises_at_once_without_allocating_the_announced_batch(name: str) -> None:
    f = synced_reward(**OPTIONS[name])(_score)

    def body(rank: int, world_size: int) -> str:
        try:
            f(completions=["ab"] * 16, prompt_id=[i // 2 for i in range(16)])
        except SyncRewardError as e:
            return type(e).__name__
        return "returned"

    tracemalloc.start()
    t = time.perf_counter()
    try:
        with mock.patch.object(_transfers, "header", _lying_header):
            got = run_threads(body, 3, timeout=30)
        seconds, peak = time.perf_counter() - t, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "returned" not in got, got
    assert seconds < 5
    assert peak < 20 << 20  # 20 MiB: nothing sized by the announced 20M samples (8 bytes each: 160 MB)
