"""A rank whose own step fails (out of memory building a buffer) makes every other rank raise within seconds.

The failure is this rank's alone, inside a collective step: the receive buffer of the torch backend
(``torch.empty``), its block of ``main``'s inbound gather, or reading its result block. Before, the
rank raised at once and the others waited in that exchange for the whole ``timeout=`` (here 60 s) and
then blamed a rank that "did not arrive". Now the failing rank leaves its error in the groups' abort
record and every other rank raises a ``CommunicationError`` naming that rank and its error, within a
poll slice; the group is then unusable on every rank (``GroupBrokenError``), as after any half-done
exchange. Each case runs over its own process group, so one launch serves them all.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from _helpers import outcome

from syncreward import _exchange, synced_reward
from syncreward.testing import run_ranks

pytestmark = pytest.mark.multiprocess

TIMEOUT = 60.0
FAILING = 1


def _plain(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def _out_of_memory(*args: Any, **kwargs: Any) -> Any:
    raise MemoryError("injected: cannot allocate the buffer")


class _FailingChunk:
    """``_exchange.ResultChunk`` whose ``unpack`` (reading the received result block) runs out of memory."""

    HEADER = _exchange.ResultChunk.HEADER

    @staticmethod
    def unpack(*args: Any, **kwargs: Any) -> Any:
        raise MemoryError("injected: cannot read the result block")


# where the failure is injected on rank 1: (module, attribute, replacement, warm-up calls first). main over torch
# gathers to rank 0: rank 1 builds its gather block (not all_to_all blocks) and reads no headers, only its result
# block (rank 0 alone reads the headers)
POINTS = {
    "receive_buffer": (torch, "empty", _out_of_memory, 1),
    "send_blocks": (_exchange, "_gather_block", _out_of_memory, 1),
    "send_blocks_at_the_first_call": (_exchange, "_gather_block", _out_of_memory, 0),
    "reading_the_result_block": (_exchange, "ResultChunk", _FailingChunk, 1),
}


def _body(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (module, attribute, replacement, warmups) in POINTS.items():
        group = dist.new_group(list(range(world_size)))  # a group, a backend and a session of its own
        reward = synced_reward(timeout=TIMEOUT, process_group=group)(_plain)
        comps = [f"r{rank}s{i}" for i in range(rank + 2)]
        for _ in range(warmups):
            reward(comps)
        original = getattr(module, attribute)
        if rank == FAILING:
            setattr(module, attribute, replacement)
        try:
            out[name] = outcome(reward, comps)
        finally:
            setattr(module, attribute, original)
        out[f"{name}/after"] = outcome(reward, comps)
        dist.barrier()
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(_body, 3, timeout=240)


# Reading the result block fails after the call's last exchange completed everywhere: the other ranks need nothing
# more from rank 1 in that call and may return their results; they learn of rank 1's failure at their next call
# instead, at once.
COMPLETE_ELSEWHERE = {"reading_the_result_block"}


def _names_the_failure(o: tuple[str, Any, float]) -> bool:
    kind, message, seconds = o
    return (
        kind == "CommunicationError"
        and f"on rank {FAILING}" in message
        and "MemoryError" in message
        and "injected" in message
        and "did not arrive" not in message
        and seconds < 5.0
    )


@pytest.mark.parametrize("point", list(POINTS))
def test_a_local_failure_in_a_step_reaches_every_rank_within_seconds(
    results: list[dict[str, Any]], point: str
) -> None:
    kind, message, _ = results[FAILING][point]
    assert kind == "MemoryError", results[FAILING][point]  # the failing rank raises its own error
    assert "injected" in message
    for rank, res in enumerate(results):
        if rank == FAILING:
            continue
        got = res[point]
        if point in COMPLETE_ELSEWHERE and got[0] == "ok":
            assert got[1] == [4.0] * (rank + 2), (rank, got)  # its own results, right
            continue
        assert _names_the_failure(got), f"rank {rank}: {got}"


@pytest.mark.parametrize("point", list(POINTS))
def test_after_a_local_failure_in_a_step_the_group_is_broken_on_every_rank(
    results: list[dict[str, Any]], point: str
) -> None:
    for rank, res in enumerate(results):
        got = res[f"{point}/after"]
        if res[point][0] == "ok":  # it learns now, naming the failure
            assert _names_the_failure(got), f"rank {rank}: {got}"
            continue
        assert got[0] == "GroupBrokenError", (rank, got)
        assert got[2] < 1.0, (rank, got)


def test_a_local_failure_in_a_step_reaches_every_rank_within_seconds_on_thread_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test double does what real ranks do: its backend's ``abort`` breaks the group at once."""
    import threading
    import time

    from syncreward.testing import run_threads

    original = _exchange._gather_block  # (main over the thread backend gathers to rank 0)

    def blocks(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == f"syncreward-rank{FAILING}":
            _out_of_memory()
        return original(*args, **kwargs)

    monkeypatch.setattr(_exchange, "_gather_block", blocks)
    reward = synced_reward(timeout=TIMEOUT)(_plain)

    def body(rank: int, world_size: int) -> tuple[str, Any, float]:
        t0 = time.monotonic()
        try:
            reward([f"r{rank}"])
        except BaseException as e:
            return type(e).__name__, str(e), time.monotonic() - t0
        return "ok", None, time.monotonic() - t0

    for rank, (kind, message, seconds) in enumerate(run_threads(body, 3, timeout=120)):
        if rank == FAILING:
            assert kind == "MemoryError", (kind, message)
            continue
        assert kind == "CommunicationError", (rank, kind, message)
        assert f"MemoryError on rank {FAILING}" in message, (rank, message)
        assert seconds < 5.0, (rank, seconds)
