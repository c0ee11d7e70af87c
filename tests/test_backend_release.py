"""A destroyed job's syncreward groups go with it: sockets and threads stay flat across re-initialisations.

Issue 15: the backend cache kept every earlier job's gloo groups alive, so each cycle of
``init_process_group`` -> synced call -> ``destroy_process_group`` left ~19-29 file descriptors and ~9
OS threads behind.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from syncreward import synced_reward
from syncreward.testing import free_port, run_ranks

pytestmark = pytest.mark.multiprocess

CYCLES = 6


def batch_normalized(completions: Any, **kwargs: Any) -> list[float]:
    mean = sum(map(len, completions)) / len(completions)
    return [len(c) - mean for c in completions]


synced = synced_reward(timeout=10)(batch_normalized)


def _counts() -> dict[str, int]:
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "py_threads": threading.active_count(),
        "os_threads": len(os.listdir("/proc/self/task")),
    }


def cycles_body(rank: int, world_size: int, ports: list[int]) -> dict[str, Any]:
    """One job per port in one process (backend="none" leaves init to us).

    Each job rendezvouses on its own port: re-creating torch's store on the port of the job just destroyed
    races with the other rank's connection (a timeout at init under load, whatever syncreward does).
    """
    import datetime

    import torch.distributed as dist

    counts = []
    results = []
    for port in ports:
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=20))
        results.append(synced([f"r{rank}-" + "x" * i for i in range(rank + 2)]))
        dist.destroy_process_group()
        counts.append(_counts())
    return {"counts": counts, "results": results}


def test_init_call_destroy_cycles_keep_fds_and_threads_flat() -> None:
    ports: set[int] = set()
    while len(ports) < CYCLES:  # distinct: two calls may hand out the same free port
        ports.add(free_port())
    out = run_ranks(cycles_body, 2, sorted(ports), timeout=120, backend="none")
    expected = batch_normalized([f"r{r}-" + "x" * i for r in range(2) for i in range(r + 2)])
    for rank, res in enumerate(out):
        lo = 0 if rank == 0 else 2
        assert all(r == expected[lo : lo + rank + 2] for r in res["results"]), (rank, res["results"])
        counts = res["counts"]
        second, last = counts[1], counts[-1]  # the first cycles may start pools and caches of their own
        assert last["fds"] - second["fds"] <= 2, (rank, counts)
        assert last["os_threads"] - second["os_threads"] <= 1, (rank, counts)
        assert last["py_threads"] - second["py_threads"] <= 1, (rank, counts)


def released_backend_body(rank: int, world_size: int) -> str:
    """A backend kept across destroy_process_group() refuses calls instead of using a dead job's store."""
    import datetime

    import numpy as np
    import torch.distributed as dist

    import syncreward
    from syncreward import BackendError

    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=20))
    backend = syncreward.resolve_backend("torch")
    backend.all_gather(np.array([rank]), channel=0, timeout=10)
    dist.destroy_process_group()
    try:
        backend.all_gather(np.array([rank]), channel=0, timeout=10)
    except BackendError as e:
        return str(e)
    return "no error"


def test_a_backend_kept_across_destroy_is_released() -> None:
    for text in run_ranks(released_backend_body, 2, timeout=120, backend="none"):
        assert "was released" in text, text


def held_world_body(rank: int, world_size: int) -> list[tuple[int, bool]]:
    """Someone else keeps each job's WORLD group object: the next job's first call releases the old backend."""
    import datetime

    import torch.distributed as dist

    from syncreward.backends import _cache

    held = []
    out = []
    previous: Any = None
    base = int(os.environ["MASTER_PORT"])
    for i in range(3):
        # a held WORLD keeps torch's own store server listening: the next job needs a port of its own
        os.environ["MASTER_PORT"] = str(base + 1 + i)
        dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=20))
        held.append(dist.group.WORLD)  # so its finalizer cannot run at destroy
        synced([f"r{rank}"])
        out.append((len(_cache._backends), previous is None or previous._released))
        (previous,) = _cache._backends.values()
        dist.destroy_process_group()
    return out


def test_a_destroyed_job_still_referenced_elsewhere_is_released_at_the_next_jobs_call() -> None:
    for res in run_ranks(held_world_body, 2, timeout=120, backend="none"):
        assert res == [(1, True)] * 3, res
