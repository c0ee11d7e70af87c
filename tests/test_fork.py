"""Fork: a forked child cannot use its parent's syncreward groups, and must say so at once.

A dataloader worker or a subprocess helper forked from a rank inherits the parent's gloo groups and
rendezvous-store connection; using them from the child would hang, or corrupt the parent's exchanges.
A synced call in the child raises BackendError mentioning the fork, and the parent is unaffected.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import select
import signal
import tempfile
import time
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks


def _reward(completions: Any, **kwargs: Any) -> list[int]:
    return [len(completions)] * len(completions)


_CHILD_DEADLINE = 30.0  # generous: the test asserts the child's own timing (<= 2s), not the machine's load


def _call_in_forked_child(f: Any, rank: int) -> dict[str, Any]:
    """Fork; the child makes one synced call and reports through a pipe.

    Bounded: the child is killed at ``_CHILD_DEADLINE``; if it is still running after 5s, it writes its Python
    stacks to a file first, so a hang is reported with where the child was.
    """
    stacks = tempfile.NamedTemporaryFile(prefix="syncreward-fork-child-", suffix=".txt", delete=False)
    stacks.close()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running any exit handler of the parent's
        try:
            os.close(r)
            dump = open(stacks.name, "w")  # noqa: SIM115 - stays open until os._exit
            faulthandler.dump_traceback_later(5.0, file=dump)
            t0 = time.monotonic()
            try:
                value = f([f"child{rank}"])
                report = {"kind": "ok", "info": repr(value)}
            except syncreward.BackendError as e:
                report = {"kind": "BackendError", "info": str(e)}
            except BaseException as e:
                report = {"kind": type(e).__name__, "info": str(e)}
            report["seconds"] = time.monotonic() - t0
            faulthandler.cancel_dump_traceback_later()
            os.write(w, json.dumps(report).encode()[:60000])
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    deadline = time.monotonic() + _CHILD_DEADLINE
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
    with open(stacks.name) as dump:
        where = dump.read()
    os.unlink(stacks.name)
    if not data:
        info = f"the child reported nothing within {_CHILD_DEADLINE:.0f}s (killed); its stacks at 5s:\n{where}"
        return {"kind": "hung", "info": info, "seconds": _CHILD_DEADLINE}
    return json.loads(data)  # type: ignore[no-any-return]


def _fork_body(rank: int, world_size: int, call_first: bool) -> dict[str, Any]:
    f = synced_reward(timeout=_CHILD_DEADLINE + 30)(_reward)  # the parent's calls outlast a slow child's report
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
    results = run_ranks(_fork_body, 2, call_first, timeout=3 * _CHILD_DEADLINE + 60)
    problems = []
    for rank, got in enumerate(results):
        if call_first and got["before"] != [2]:
            problems.append(f"rank {rank}: the call before the fork gave {got['before']}")
        child = got["child"]
        if child["kind"] != "BackendError" or "fork" not in child["info"].lower():
            problems.append(f"rank {rank}: the forked child's call gave {child['kind']}: {child['info'][:3000]}")
        if child["seconds"] > 2.0:
            problems.append(f"rank {rank}: the forked child's call took {child['seconds']:.1f}s")
        if got["after"] != ("ok", [4, 4]):
            problems.append(f"rank {rank}: the parent's call after the fork gave {got['after']}")
    assert not problems, "\n".join(problems)
