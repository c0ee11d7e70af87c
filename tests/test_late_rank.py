"""Late rank: when the other ranks give up on a call, the late rank's same call fails too.

Rank 0's reward takes 3 s, past ``timeout=1.5``: rank 1 raises a CommunicationError. Rank 0 must not
report success for that call (its results were never received), or the ranks' views of the step diverge.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks


def _slow_on_rank0(completions: Any, **kwargs: Any) -> list[float]:
    if os.environ.get("RANK") == "0":
        time.sleep(3.0)
    return [1.0] * len(completions)


def _late_rank_body(rank: int, world_size: int, mode: str, done: str) -> tuple[str, str, float]:
    f = synced_reward(mode=mode, timeout=1.5)(_slow_on_rank0)  # type: ignore[call-overload]
    t0 = time.monotonic()
    try:
        f([f"c{rank}"])
        got = ("ok", "", time.monotonic() - t0)
    except syncreward.CommunicationError as e:
        got = ("CommunicationError", f"{type(e).__name__}: {e}"[:300], time.monotonic() - t0)
    except Exception as e:
        got = ("other", f"{type(e).__name__}: {e}"[:300], time.monotonic() - t0)
    if rank == 0:
        Path(done).touch()
    else:  # stay in the job until rank 0 has finished its call
        deadline = time.monotonic() + 20
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.05)
    return got


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["main", "replicate"])
def test_late_rank_fails_the_same_call(tmp_path: Path, mode: str) -> None:
    (r0, r1) = run_ranks(_late_rank_body, 2, mode, str(tmp_path / "done"), timeout=120)
    problems = []
    if r1[0] != "CommunicationError":
        problems.append(f"rank 1 (on time) gave {r1[0]}: {r1[1]}")
    if r0[0] != "CommunicationError":
        problems.append(f"rank 0 (late by 1.5s) gave {r0[0]} {r0[1]} after {r0[2]:.1f}s; rank 1 gave {r1[0]}")
    assert not problems, f"mode={mode}:\n" + "\n".join(problems)
