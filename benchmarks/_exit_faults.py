"""Faults that end a rank, run as real processes: how long until each rank raises, and until it *exits*.

Used by ``benchmarks/time_to_error.py`` (figures) and ``tests/test_exit.py`` (the exit guarantees of
docs/reliability.md). :func:`launch` starts ``world_size`` plain ``python`` processes of this file (not
``multiprocessing`` children: a launcher must see each process end on its own, as torchrun does), each
joins a gloo job on a free port and runs one rank of a scenario:

``dying_main``
    rank 0's main thread raises an uncaught exception while an ``async`` synced call is in flight
    (rank 1 arrives ``late`` seconds later);
``sys_exit``
    the same with ``sys.exit(3)``;
``sigint_async`` / ``sigint_sync``
    the launcher sends SIGINT to rank 0 only, while its ``async`` (or plain) synced call waits for rank 1;
``timeout`` / ``timeout_destroy``
    3 ranks, ``timeout=T``: rank 2 hangs, rank 1 is ``late`` seconds late; ranks 0 and 1 raise
    ``SyncTimeoutError`` and end (after ``destroy_process_group()`` in ``timeout_destroy``);
``killed_peer``
    rank 1's process is killed (``os._exit``) inside the reward; rank 0 raises and ends;
``clean``
    no fault: every rank ends after its last call (the floor of the exit times).

Each rank writes JSON lines to its stdout: ``{"event": "raised", "t": ..., "type": ..., "message": ...}``
when its call raises, ``{"event": "in_flight", "t": ...}`` when its call is waiting, ``exit_hooks_done``
once the exit hooks ran. :func:`launch`
returns per rank what it wrote, its exit status, its stderr tail and ``exit_s``: seconds from the fault
(the raise on that rank, or the signal) to the end of the process.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import faulthandler
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SCENARIOS = (
    "clean",
    "dying_main",
    "sys_exit",
    "sigint_async",
    "sigint_sync",
    "timeout",
    "timeout_destroy",
    "killed_peer",
)
WORLD_SIZES = {"timeout": 3, "timeout_destroy": 3}


EXIT_STACKS_S = 5.0  # an exit slower than this writes every thread's stack to stderr (the launcher keeps its tail)


def _stacks_if_exit_is_slow() -> None:
    """At the start of interpreter exit: if the exit takes ``EXIT_STACKS_S``, say where every thread waits."""
    faulthandler.dump_traceback_later(EXIT_STACKS_S, exit=False)


def _emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def _raised(e: BaseException) -> None:
    _emit("raised", type=type(e).__name__, message=str(e)[:600])


def lengths(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


def dies_on_rank_1(completions: Any, **kwargs: Any) -> list[float]:
    if os.environ["RANK"] == "1":
        _emit("fault")
        os._exit(9)  # as a segfault or an OOM kill
    return lengths(completions)


async def async_lengths(completions: Any, **kwargs: Any) -> list[float]:
    return lengths(completions)


def _rank_main(scenario: str, rank: int, world_size: int, timeout: float, late: float) -> None:
    import torch.distributed as dist

    from syncreward import synced_reward

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    plain = synced_reward(timeout=timeout)(lengths)
    aplain = synced_reward(timeout=timeout)(async_lengths)
    batch = [f"r{rank}" + "x" * i for i in range(2)]
    plain(batch)  # every rank connected: the fault comes in the second call
    # registered after syncreward's and torch's threading exit hooks, so it runs first (they run last-in first)
    threading._register_atexit(_stacks_if_exit_is_slow)  # type: ignore[attr-defined]
    _emit("ready")

    if scenario == "clean":
        plain(batch)
        _emit("fault")  # no fault: the floor, the time a process of this job takes to end after its last call
    elif scenario in ("dying_main", "sys_exit", "sigint_async"):
        if rank == 0:

            async def body() -> None:
                task = asyncio.ensure_future(aplain(batch))
                await asyncio.sleep(0.5)
                _emit("in_flight")
                if scenario == "dying_main":
                    _emit("fault")
                    raise RuntimeError("the training loop failed on rank 0")
                if scenario == "sys_exit":
                    _emit("fault")
                    sys.exit(3)
                await task  # SIGINT arrives here

            asyncio.run(body())
        else:
            time.sleep(late)
            try:
                asyncio.run(aplain(batch))
            except BaseException as e:
                _raised(e)
                raise
    elif scenario == "sigint_sync":
        if rank == 0:
            threading.Timer(0.5, _emit, ("in_flight",)).start()
            try:
                plain(batch)
            except BaseException as e:
                _raised(e)
                raise
        else:
            time.sleep(late)
            try:
                plain(batch)
            except BaseException as e:
                _raised(e)
                raise
    elif scenario in ("timeout", "timeout_destroy"):
        if rank == world_size - 1:
            time.sleep(3600)  # hung (alive, never arrives): the launcher kills it
        if rank == 1:
            time.sleep(late)
        try:
            plain(batch)
        except Exception as e:
            _raised(e)
            if scenario == "timeout_destroy":
                dist.destroy_process_group()
                _emit("destroyed")
            return
    elif scenario == "killed_peer":
        scored = synced_reward(timeout=timeout, mode="replicate")(dies_on_rank_1)
        try:
            scored(batch)
        except Exception as e:
            _raised(e)
            return
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


def launch(
    scenario: str,
    *,
    timeout: float = 30.0,
    late: float = 15.0,
    world_size: int | None = None,
    hung: set[int] | None = None,
    limit: float = 120.0,
    pythonpath: str | None = None,
) -> list[dict[str, Any]]:
    """Run ``scenario`` on fresh processes and say, per rank, what it did and when it ended.

    Args:
        scenario: one of ``SCENARIOS``.
        timeout: the synced functions' ``timeout=``.
        late: how many seconds after the others rank 1 makes the faulty call.
        world_size: ranks (default: 3 for the timeout scenarios, else 2).
        hung: ranks that are not expected to end by themselves: once every other rank ended (or at
            ``limit``) they are killed. Default: the hung rank of the timeout scenarios.
        limit: seconds before every rank still running is killed.
        pythonpath: where the ranks import syncreward from (another copy, to compare); by default
            the copy this process imported.

    Returns:
        Per rank: ``events`` (by name), ``returncode``, ``stderr`` (its tail), ``killed_by_launcher``,
        ``exit_s`` (seconds from this rank's fault -- its own ``fault`` event, the signal sent to it, or
        else its raise -- to the end of its process), ``hooks_s`` (from the same fault to the end of the
        exit hooks, syncreward's and torch's: the rest is the interpreter's teardown) and ``error_s``
        (from the job's first fault to this rank's raise).
    """
    import syncreward
    from syncreward.testing import free_port

    world_size = world_size or WORLD_SIZES.get(scenario, 2)
    if hung is None:
        hung = {world_size - 1} if scenario.startswith("timeout") else set()
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="syncreward-exit-"))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    if pythonpath is None:
        pythonpath = str(Path(syncreward.__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([pythonpath, *filter(None, [os.environ.get("PYTHONPATH")])])
    procs = []
    for r in range(world_size):
        out, err = open(tmp / f"{r}.out", "w"), open(tmp / f"{r}.err", "w")  # noqa: SIM115
        cmd = [sys.executable, __file__, scenario, str(r), str(world_size), str(timeout), str(late)]
        procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, env={**env, "RANK": str(r)}))
        out.close()
        err.close()
    ended: dict[int, float] = {}
    signalled: float | None = None
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for r, p in enumerate(procs):
            if r not in ended and p.poll() is not None:
                ended[r] = time.time()
        if all(r in ended or r in hung for r in range(world_size)):
            break
        if scenario.startswith("sigint") and signalled is None and '"in_flight"' in (tmp / "0.out").read_text():
            procs[0].send_signal(signal.SIGINT)
            signalled = time.time()
        time.sleep(0.01)
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    events = [
        {e["event"]: e for e in map(json.loads, (tmp / f"{r}.out").read_text().splitlines()) if "event" in e}
        for r in range(world_size)
    ]
    faults = [ev["fault"]["t"] for ev in events if "fault" in ev] + ([signalled] if signalled is not None else [])
    t_fault = min(faults) if faults else None
    results = []
    for r, p in enumerate(procs):
        ev = events[r]
        own = ev.get("fault", {}).get("t") or (signalled if r == 0 else None) or ev.get("raised", {}).get("t")
        raised = ev.get("raised", {}).get("t")
        results.append(
            {
                "rank": r,
                "events": ev,
                "returncode": p.returncode,
                "exit_s": None if (r not in ended or own is None) else ended[r] - own,
                "hooks_s": None if ("exit_hooks_done" not in ev or own is None) else ev["exit_hooks_done"]["t"] - own,
                "error_s": None if (raised is None or t_fault is None) else raised - t_fault,
                "killed_by_launcher": r not in ended,
                "stderr": (tmp / f"{r}.err").read_text()[-12000:],  # (room for the stacks of a slow exit)
            }
        )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=SCENARIOS)
    parser.add_argument("rank", type=int)
    parser.add_argument("world_size", type=int)
    parser.add_argument("timeout", type=float)
    parser.add_argument("late", type=float)
    a = parser.parse_args()
    with contextlib.suppress(AttributeError):
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # registered before syncreward and torch are imported, so it runs after their exit hooks: what is left
    # after it is the interpreter's own teardown
    atexit.register(_emit, "exit_hooks_done")
    _rank_main(a.scenario, a.rank, a.world_size, a.timeout, a.late)
