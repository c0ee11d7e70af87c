"""Leaving: when the process exits, ``_lifecycle.leave`` abandons the synced calls still in flight.

Their group is marked broken, so a step still waiting for its turn fails at once (instead of holding
the exit until ``timeout=``), and the busy session's later calls raise ``GroupBrokenError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from syncreward import synced_reward
from syncreward._lifecycle import leave
from syncreward.testing import run_threads


async def _ok(completions: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def test_leave_abandons_calls_in_flight_at_once() -> None:
    synced = synced_reward(timeout=3)(_ok)

    async def rank0() -> dict[str, Any]:
        first = asyncio.ensure_future(synced(["a"]))  # waits in its exchange for rank 1, which never comes
        second = asyncio.ensure_future(synced(["b"]))  # waits for the first's turn
        await asyncio.sleep(0.5)
        busy = leave("the process is exiting")
        t0 = time.monotonic()
        try:
            await second
            got: tuple[str, str] = ("ok", "")
        except Exception as e:
            got = (type(e).__name__, str(e))
        seconds = time.monotonic() - t0
        with contextlib.suppress(Exception):
            await first
        return {"busy": busy, "second": got, "seconds": seconds}

    def body(rank: int, world_size: int) -> Any:
        if rank == 1:
            time.sleep(4)  # makes no call
            return None
        return asyncio.run(rank0())

    (r0, _) = run_threads(body, 2, timeout=60)
    assert r0["busy"] >= 1, r0
    assert r0["second"][0] == "GroupBrokenError", r0
    assert "the process is exiting" in r0["second"][1], r0
    assert r0["seconds"] < 1.5, f"the waiting step took {r0['seconds']:.1f}s to fail after leave()"
