"""Fork: a forked child cannot use its parent's syncreward groups, and must say so at once.

A dataloader worker or a subprocess helper forked from a rank inherits the parent's gloo groups and
rendezvous-store connection; using them from the child would hang, or corrupt the parent's exchanges.
A synced call in the child raises BackendError mentioning the fork, and the parent is unaffected.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import time
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks


def _reward(completions: Any, **kwargs: Any) -> list[int]:
    return [len(completions)] * len(completions)


def _call_in_forked_child(f: Any, rank: int) -> dict[str, Any]:
    """Fork; the child makes one synced call and reports through a pipe. Bounded: the child is killed at 8s."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running any exit handler of the parent's
        try:
            os.close(r)
            t0 = time.monotonic()
            try:
                value = f([f"child{rank}"])
                report = {"kind": "ok", "info": repr(value)}
            except syncreward.BackendError as e:
                report = {"kind": "BackendError", "info": str(e)}
            except BaseException as e:
                report = {"kind": type(e).__name__, "info": str(e)}
            report["seconds"] = time.monotonic() - t0
            os.write(w, json.dumps(report).encode()[:60000])
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    deadline = time.monotonic() + 8.0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([r], [], [], 0.1)
        if ready:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
    os.close(r)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    if not data:
        return {"kind": "hung", "info": "the child reported nothing within 8s (killed)", "seconds": 8.0}
    return json.loads(data)  # type: ignore[no-any-return]


def _fork_body(rank: int, world_size: int, call_first: bool) -> dict[str, Any]:
    f = synced_reward(timeout=2)(_reward)
    out: dict[str, Any] = {}
    if call_first:
        out["before"] = f([f"a{rank}"])
    out["child"] = _call_in_forked_child(f, rank)
    try:
        out["after"] = ("ok", f([f"b{rank}", f"c{rank}"]))
    except Exception as e:
        out["after"] = (type(e).__name__, str(e)[:300])
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize("call_first", [True, False], ids=["after-a-call", "before-any-call"])
def test_fork_child_synced_call_raises_and_parent_continues(call_first: bool) -> None:
    results = run_ranks(_fork_body, 2, call_first, timeout=60)
    problems = []
    for rank, got in enumerate(results):
        if call_first and got["before"] != [2]:
            problems.append(f"rank {rank}: the call before the fork gave {got['before']}")
        child = got["child"]
        if child["kind"] != "BackendError" or "fork" not in child["info"].lower():
            problems.append(f"rank {rank}: the forked child's call gave {child['kind']}: {child['info'][:300]}")
        if child["seconds"] > 2.0:
            problems.append(f"rank {rank}: the forked child's call took {child['seconds']:.1f}s")
        if got["after"] != ("ok", [4, 4]):
            problems.append(f"rank {rank}: the parent's call after the fork gave {got['after']}")
    assert not problems, "\n".join(problems)
