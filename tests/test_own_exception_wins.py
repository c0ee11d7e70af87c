"""A rank's own exception wins over a transport failure met while reporting it to the other ranks.

The reward raises on the scoring rank (``ValueError``, or a real Ctrl-C: ``KeyboardInterrupt``) after the
other rank has already left; reporting the failure to it then fails. The scoring rank must still raise
its own exception -- a user's ``except KeyboardInterrupt: save_checkpoint()`` must run -- with the
transport failure attached as a note, never the transport failure instead.

Checked on thread-ranks (``run_threads``, the peer leaves by aborting the group) and on real gloo ranks
(the peer gets SIGINT while it waits for its results, and destroys its groups).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.backends import resolve_backend
from syncreward.testing import run_ranks, run_threads


def _notes(e: BaseException) -> list[str]:
    return list(getattr(e, "__notes__", ()))


def _describe(e: BaseException) -> tuple[str, list[str]]:
    return type(e).__name__, _notes(e)


def _peer_leaves_then_raises(completions: Any, **kwargs: Any) -> list[float]:
    backend = resolve_backend("auto")
    assert backend is not None
    backend.group.abort("rank 1 left the job")  # type: ignore[attr-defined]
    raise ValueError("bad sample")


async def _peer_leaves_then_raises_async(completions: Any, **kwargs: Any) -> list[float]:
    return _peer_leaves_then_raises(completions)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_own_exception_wins_over_transport_failure_on_thread_ranks(kind: str) -> None:
    fn = _peer_leaves_then_raises if kind == "sync" else _peer_leaves_then_raises_async
    synced = synced_reward(timeout=20)(fn)

    async def call_async(rank: int) -> Any:
        return await synced([f"c{rank}"])

    def body(rank: int, world_size: int) -> tuple[str, list[str]]:
        try:
            if kind == "sync":
                synced([f"c{rank}"])
            else:
                asyncio.run(call_async(rank))
        except BaseException as e:
            return _describe(e)
        return "ok", []

    (r0, r1) = run_threads(body, 2, timeout=60)
    assert r0[0] == "ValueError", f"rank 0 raised {r0[0]} instead of its own ValueError (notes {r0[1]})"
    assert any("CommunicationError" in n for n in r0[1]), f"the transport failure is not attached: {r0[1]}"
    assert r1[0] == "CommunicationError", r1


# --------------------------------------------------------------------------------------------- gloo ranks


def _wait_for(path: Path, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _ctrl_c_body(rank: int, world_size: int, kind: str, tmp: str) -> tuple[str, list[str]]:
    import torch.distributed as dist

    # a Ctrl-C raises KeyboardInterrupt, as in a terminal: a runner started with SIGINT ignored (a shell's
    # background job) would pass that on to this fresh process, and the interrupts below would never arrive
    signal.signal(signal.SIGINT, signal.default_int_handler)
    scoring, gone = Path(tmp, "scoring"), Path(tmp, "gone")

    def reward(completions: Any, **kwargs: Any) -> list[float]:
        scoring.touch()
        _wait_for(gone)  # the other rank has left: reporting this rank's failure to it fails
        time.sleep(0.5)
        if kind == "KeyboardInterrupt":
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered while the reward runs
            time.sleep(10)
        raise ValueError("bad sample")

    synced = synced_reward(timeout=60)(reward)
    if rank == 1:  # Ctrl-C reaches it while it waits for its results
        threading.Thread(target=lambda: (_wait_for(scoring), os.kill(os.getpid(), signal.SIGINT)), daemon=True).start()
    try:
        synced([f"c{rank}"])
        got: tuple[str, list[str]] = ("ok", [])
    except KeyboardInterrupt as e:  # what a training script's `except KeyboardInterrupt: save_checkpoint()` sees
        got = _describe(e)
    except BaseException as e:
        got = _describe(e)
    if rank == 1:
        dist.destroy_process_group()  # leaves: its connections close
        gone.touch()
    return got


@pytest.mark.multiprocess
@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "ValueError"])
def test_own_exception_wins_over_transport_failure_on_gloo_ranks(tmp_path: Path, kind: str) -> None:
    (r0, r1) = run_ranks(_ctrl_c_body, 2, kind, str(tmp_path), timeout=120)
    assert r1[0] == "KeyboardInterrupt", r1
    assert r0[0] == kind, f"rank 0 raised {r0[0]} instead of its own {kind} (notes {r0[1]})"
    assert any("CommunicationError" in n for n in r0[1]), f"the transport failure is not attached: {r0[1]}"


def test_own_exception_wins_keeps_the_original_object() -> None:
    """The object raised is the reward's own (``is``), not a copy."""
    raised: list[BaseException] = []

    def reward(completions: Any, **kwargs: Any) -> list[float]:
        backend = resolve_backend("auto")
        backend.group.abort("rank 1 left the job")  # type: ignore[union-attr]
        e = ValueError("mine")
        raised.append(e)
        raise e

    synced = synced_reward(timeout=20)(reward)

    def body(rank: int, world_size: int) -> Any:
        try:
            synced([f"c{rank}"])
        except BaseException as e:
            return e
        return None

    (r0, _) = run_threads(body, 2, timeout=60)
    assert raised
    assert r0 is raised[0]
    assert not isinstance(r0, syncreward.CommunicationError)
