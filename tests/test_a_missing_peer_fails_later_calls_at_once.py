"""A missing peer: after a synced call fails for want of a peer, later calls fail at once and say why.

Rank 0 starts two concurrent async synced calls that rank 1 never joins. Both must raise a
CommunicationError (the first times out; the second, queued behind it, must not stall), and any later
synced call must raise GroupBrokenError immediately instead of waiting out its own timeout.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks


async def _areward(completions: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def _broken_latch_body(rank: int, world_size: int, done: str, warm: bool) -> dict[str, Any]:
    f = synced_reward(timeout=1.5)(_areward)
    out: dict[str, Any] = {}
    if warm:  # a successful call first: the gloo groups exist, the failure is a plain peer timeout
        out["warmup"] = asyncio.run(f(["w"]))
    if rank == 1:  # makes no further synced call, but stays in the job until rank 0 is done
        deadline = time.monotonic() + 30
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.05)
        return out

    async def two() -> list[Any]:
        async def timed(c: str) -> tuple[str, str, float]:
            t0 = time.monotonic()
            try:
                await f([c])
                return "ok", "", time.monotonic() - t0
            except Exception as e:
                kind = "CommunicationError" if isinstance(e, syncreward.CommunicationError) else "other"
                return kind, f"{type(e).__name__}: {e}"[:300], time.monotonic() - t0

        return list(await asyncio.gather(timed("a"), timed("b")))

    try:
        out["concurrent"] = asyncio.run(two())
        t0 = time.monotonic()
        try:
            asyncio.run(f(["c"]))
            out["third"] = ("ok", "", time.monotonic() - t0)
        except Exception as e:
            out["third"] = (type(e).__name__, str(e)[:300], time.monotonic() - t0)
    finally:
        Path(done).touch()
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("warm", [True, False], ids=["after-a-good-call", "first-call"])
def test_broken_latch_later_calls_fail_fast(tmp_path: Path, warm: bool) -> None:
    results = run_ranks(_broken_latch_body, 2, str(tmp_path / "done"), warm, timeout=120)
    r0 = results[0]
    problems = []
    for i, (kind, info, seconds) in enumerate(r0["concurrent"]):
        if kind != "CommunicationError":
            problems.append(f"concurrent call {i} on rank 0 gave {kind}: {info}")
        if seconds > 6.0:
            problems.append(f"concurrent call {i} on rank 0 took {seconds:.1f}s ({kind}: {info})")
    kind, info, seconds = r0["third"]
    if kind != "GroupBrokenError":
        problems.append(f"the third call on rank 0 raised {kind}, not GroupBrokenError: {info}")
    if seconds > 1.0:
        problems.append(f"the third call on rank 0 took {seconds:.1f}s to fail")
    assert not problems, "\n".join(problems)
