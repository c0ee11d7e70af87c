"""Run code on N local ranks: a test double for distributed reward functions.

:func:`run_ranks` starts ``world_size`` fresh processes on this machine, joins them into a
``torch.distributed`` gloo job on a free localhost port (with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set, so ``accelerate.PartialState()`` works inside too), calls
``fn(rank, world_size, *args)`` on each, and returns the per-rank return values in rank order. It never
hangs: every wait has a deadline, and a failure raises :class:`RanksFailed` with the traceback (or, for a
hung rank, the stack dump) of every rank that did not finish.

Example:
    Test that a synced reward on 3 ranks equals the plain function on the concatenated batch::

        from syncreward import synced_reward
        from syncreward.testing import run_ranks

        def normalised(completions, **kwargs):
            lengths = [len(c) for c in completions]
            mean = sum(lengths) / len(lengths)
            return [x - mean for x in lengths]

        synced = synced_reward(normalised)

        def body(rank, world_size, batches):
            return synced(completions=batches[rank])

        def test_normalised():
            batches = [["a", "bb"], ["ccc"], ["dddd", "e", "ff"]]
            expected = normalised([c for b in batches for c in b])
            got = run_ranks(body, 3, batches)
            assert [x for part in got for x in part] == expected

    ``fn``, its arguments and its return values must be picklable (define ``fn`` at module level).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import queue
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["RanksFailed", "free_port", "run_ranks"]

_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


class RanksFailed(AssertionError):
    """Some ranks raised, crashed or hung. ``failures`` maps each such rank to what it printed."""

    def __init__(self, message: str, failures: Mapping[int, str]) -> None:
        self.failures = dict(failures)
        details = "\n".join(f"----- rank {r} -----\n{text.rstrip()}" for r, text in sorted(self.failures.items()))
        super().__init__(f"{message}\n{details}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _child(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
    log_path: str,
    env: Mapping[str, str],
) -> None:
    log = open(log_path, "w", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    import faulthandler

    faulthandler.enable(log)
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    import torch.distributed as dist

    try:
        if backend != "none":
            dist.init_process_group(backend, rank=rank, world_size=world_size)
        value = fn(rank, world_size, *args)
        # plain pickle: torch's multiprocessing reductions would share tensors through file descriptors
        # that die with this process before the parent reads them
        results.put((rank, "ok", pickle.dumps(value)))
    except BaseException as e:
        text = "".join(traceback.format_exception(e))
        print(text, file=log)
        results.put((rank, "error", text))
    finally:
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        log.flush()


def _tail(path: str, limit: int = 8000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-limit:]
    except OSError:
        return ""


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    backend: str = "gloo",
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes and return their results.

    Args:
        fn: a picklable (module-level) function.
        world_size: number of ranks (processes).
        *args: extra picklable arguments passed to every rank.
        timeout: seconds for the whole run, start-up included; a rank still running after it is dumped
            (its stack is shown) and killed.
        backend: ``torch.distributed`` backend to initialise (``"gloo"``), or ``"none"`` to leave it to ``fn``.
        env: extra environment variables for the ranks.

    Returns:
        The values ``fn`` returned, in rank order.

    Raises:
        RanksFailed: a rank raised, died or did not finish in time; holds every failing rank's output.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="syncreward-ranks-")
    logs = [os.path.join(tmp, f"rank{r}.log") for r in range(world_size)]
    clean_env = {k: v for k, v in (env or {}).items()}
    saved = {k: os.environ.pop(k) for k in _DIST_ENV if k in os.environ}
    try:
        procs = [
            ctx.Process(
                target=_child,
                args=(r, world_size, port, backend, fn, args, results, logs[r], clean_env),
                name=f"syncreward-rank{r}",
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
    finally:
        os.environ.update(saved)
    deadline = time.monotonic() + timeout
    outcome: dict[int, tuple[str, Any]] = {}
    try:
        while len(outcome) < world_size:
            try:
                rank, status, value = results.get(timeout=0.1)
                outcome[rank] = (status, value)
                continue
            except queue.Empty:
                pass
            dead = [r for r, p in enumerate(procs) if r not in outcome and p.exitcode is not None]
            if dead:  # give a rank that just posted its result a moment to be read
                time.sleep(0.2)
                while True:
                    try:
                        rank, status, value = results.get_nowait()
                        outcome[rank] = (status, value)
                    except queue.Empty:
                        break
                for r in dead:
                    if r not in outcome:
                        outcome[r] = ("died", f"process exited with code {procs[r].exitcode}\n{_tail(logs[r])}")
            if time.monotonic() > deadline:
                break
    finally:
        hung = [r for r in range(world_size) if r not in outcome]
        for r in hung:
            pid = procs[r].pid
            if procs[r].is_alive() and pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGUSR1)
        if hung:
            time.sleep(0.5)
        for p in procs:
            p.join(timeout=max(0.0, min(5.0, deadline + 5.0 - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        results.close()
    failures = {r: f"rank did not finish within {timeout:.0f}s; its stack:\n{_tail(logs[r])}" for r in hung}
    for r, (status, value) in outcome.items():
        if status != "ok":
            failures[r] = value if status == "error" else str(value)
    if failures:
        raise RanksFailed(f"{len(failures)} of {world_size} ranks failed", failures)
    return [pickle.loads(outcome[r][1]) for r in range(world_size)]
