"""A late rank: when the other ranks give up on a call, the late rank's same call fails too.

Rank 0's reward takes 3 s, past ``timeout=1.5``: rank 1 raises a CommunicationError. Rank 0 must not
report success for that call (its results were never received), or the ranks' views of the step diverge.

Below, in its own section: a rank late for its *first* synced call.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest
from _helpers import outcome

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


# ---------------------------------------------------------------------------------------------
# A rank that reaches its *first* synced call after the others gave up on it says so at once.
#
# The on-time rank waits ``timeout=`` for the late one to make its first synced call and raises a
# SyncTimeoutError naming it. The late rank, arriving afterwards, must raise at once with the words a late
# rank gets at any later call ("the other ranks had given up waiting for this rank"), not wait in the
# connection attempt and then blame the others ("the others did not arrive", "peer probably died") --
# whether the on-time rank is still there (case ``late=1``) or has already exited (``late=0``: rank 0 hosts
# the store and is the late one).

TIMEOUT = 4.0


def _plain(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def _wait_for(path: Path, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _body(rank: int, world_size: int, late: int, tmp: str) -> tuple[str, Any, float]:
    gave_up, late_done = Path(tmp, "gave_up"), Path(tmp, "late_done")
    synced = synced_reward(timeout=TIMEOUT)(_plain)
    if rank == late:
        _wait_for(gave_up)
        time.sleep(0.5)
    got = outcome(synced, [f"c{rank}"])
    if rank != late:
        gave_up.touch()
        if late == 1:  # stays in the job (it hosts the store) until the late rank is done
            _wait_for(late_done)
    else:
        late_done.touch()
    return got


@pytest.mark.multiprocess
@pytest.mark.parametrize("late", [1, 0], ids=["other_rank_still_there", "other_rank_exited"])
def test_late_first_call_says_the_others_gave_up_at_once(tmp_path: Path, late: int) -> None:
    results = run_ranks(_body, 2, late, str(tmp_path), timeout=120)
    on_time, slow = results[1 - late], results[late]
    assert on_time[0] == "SyncTimeoutError", on_time
    assert on_time[1] == (late,), on_time
    assert slow[0] == "CommunicationError", slow
    assert "had given up waiting for this rank" in slow[1], slow[1]
    assert slow[2] < TIMEOUT, f"the late rank took {slow[2]:.1f}s to learn it came too late"


def test_late_first_call_says_the_others_gave_up_at_once_on_thread_ranks() -> None:
    """The test double gives the late thread-rank the same verdict, at its first call too."""
    from syncreward.testing import run_threads

    synced = synced_reward(timeout=1.0)(_plain)

    def body(rank: int, world_size: int) -> tuple[str, Any, float]:
        if rank == 1:
            time.sleep(1.5)
        return outcome(synced, [f"c{rank}"])

    (on_time, slow) = run_threads(body, 2, timeout=60)
    assert on_time[0] == "SyncTimeoutError", on_time
    assert on_time[1] == (1,), on_time
    assert slow[0] == "CommunicationError", slow
    assert "had given up waiting for this rank" in slow[1], slow
    assert slow[2] < 1.0, slow


def _body_three(rank: int, world_size: int, tmp: str) -> tuple[str, Any, float]:
    """Ranks 0 and 1 are on time (rank 1 half a second after rank 0, so rank 0 gives up first); rank 2 is late."""
    gave_up, late_done = Path(tmp, "gave_up"), Path(tmp, "late_done")
    synced = synced_reward(timeout=TIMEOUT)(_plain)
    if rank == 1:
        time.sleep(0.5)
    if rank == 2:
        time.sleep(TIMEOUT + 3.0)  # 7 s: after both on-time ranks gave up
    got = outcome(synced, [f"c{rank}"])
    if rank == 2:
        late_done.touch()
    else:
        gave_up.touch()
        _wait_for(late_done)  # rank 0 hosts the store: every rank stays until the late one is done
    return got


@pytest.mark.multiprocess
def test_late_first_call_an_on_time_rank_times_out_naming_the_late_rank(tmp_path: Path) -> None:
    """An on-time rank that finds another on-time rank's give-up record times out with it, naming the late rank.

    It used to be told that "the other ranks had given up waiting for this rank before it arrived", as if it
    were the late one.
    """
    first, second, late = run_ranks(_body_three, 3, str(tmp_path), timeout=120)
    for rank, got in ((0, first), (1, second)):
        assert got[0] == "SyncTimeoutError", (rank, got)
        assert got[1] == (2,), (rank, got)
        assert TIMEOUT - 0.6 < got[2] < TIMEOUT + 2.0, (rank, got)  # rank 1 goes when rank 0 gives up
    assert late[0] == "CommunicationError", late
    assert "had given up waiting for this rank" in late[1], late
