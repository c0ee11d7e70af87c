"""A rank that leaves the job: the others raise at once where it left a call undone, never where it did its part.

A rank that leaves the job without making a synced call the others wait in makes them raise at once, naming it.

Rank 1 of a 2-rank job (plain ``python`` processes, as a launcher starts them) leaves -- its script ends, it
destroys the default group first, or an exception outside syncreward ends it -- without making the synced
call rank 0 makes with ``timeout=120``. It leaves a record in the job's store as it goes (threading's exit
hook, or the default group's destruction), and rank 0 raises a ``CommunicationError`` naming it within
seconds, instead of waiting the 120 s and then saying rank 1 "did not make their first synced call". A rank
that made every call it was waited for and then left fails nobody: rank 0's call with it works, and only
the call rank 1 never made raises.

Below, in its own section: a peer that leaves right after finishing its part never fails a call whose data
arrived.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from syncreward import synced_reward
from syncreward.backends import torch_distributed
from syncreward.testing import free_port, run_ranks

pytestmark = pytest.mark.multiprocess

JOB = Path(__file__).parent / "jobs" / "leave_without_the_call.py"
ROOT = Path(__file__).resolve().parents[1]


def _launch(how: str, out: Path) -> list[subprocess.CompletedProcess[str]]:
    port = free_port()
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(JOB), how, str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True,
            )
        )  # fmt: skip
    done = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=200)  # a hang detector: the old code waited the whole 120 s
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate(timeout=30)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


@pytest.mark.parametrize("how", ["returns", "destroys", "raises"])
def test_a_rank_that_leaves_without_the_call_is_named_at_once(tmp_path: Path, how: str) -> None:
    ranks = _launch(how, tmp_path)
    assert ranks[0].returncode == 0, ranks[0].stderr
    if how == "raises":
        assert ranks[1].returncode == 1, ranks[1].stderr
        assert "rank 1 broke outside syncreward" in ranks[1].stderr, ranks[1].stderr
    got = json.loads((tmp_path / "rank0.json").read_text())
    call, after = got["call"], got["after"]
    assert call["kind"] == "CommunicationError", call
    assert "without making its first synced call" in call["msg"], call
    if how == "destroys":
        assert "rank 1 destroyed its process group" in call["msg"], call
    elif how == "raises":
        assert "uncaught ValueError: rank 1 broke outside syncreward" in call["msg"], call
    else:
        assert "rank 1 exited" in call["msg"], call
    assert call["s"] < 10.0, f"rank 0 waited {call['s']:.1f}s for a rank that had left"
    assert after["kind"] == "GroupBrokenError", after


def test_a_rank_that_leaves_after_its_calls_fails_nobody_and_a_call_it_never_made_names_it(tmp_path: Path) -> None:
    ranks = _launch("after_its_call", tmp_path)
    assert ranks[0].returncode == 0, ranks[0].stderr
    assert ranks[1].returncode == 0, ranks[1].stderr
    got = json.loads((tmp_path / "rank0.json").read_text())
    assert got["first"]["kind"] == "ok", got["first"]
    assert got["first"]["value"] == [4.0], got["first"]
    call = got["call"]
    assert call["kind"] == "CommunicationError", call
    assert "rank 1 destroyed its process group without making this synced call" in call["msg"], call
    assert call["s"] < 10.0, call


# ---------------------------------------------------------------------------------------------
# A peer that leaves right after finishing its part never fails a call whose data arrived.
#
# Rank 0 hosts the rendezvous store and exits right after its last synced call. Rank 1's last call is
# waiting for its results when that happens: its data has arrived, but its wait looks at the store (the
# arrival record, the abort key), which is gone. The interleaving is forced on rank 1: its outbound wait
# reports one "slice timed out" after the data arrived and rank 0 has exited, so it then meets the dead
# store -- the call must still return its results.


def _plain(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) for c in completions]


class _LateWork:
    """A gloo work whose first wait completes, then waits until rank 0 has exited, then says it timed out."""

    def __init__(self, work: Any, store: Any) -> None:
        self._work, self._store, self._first = work, store, True

    def wait(self, timeout: Any = None) -> bool:
        if not self._first:
            return bool(self._work.wait(timeout))
        self._first = False
        self._work.wait()  # the data has arrived
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until rank 0 (and the store it hosts) is gone
            try:
                self._store.check(["abort"])
            except Exception:
                break
            time.sleep(0.05)
        raise RuntimeError("Operation timed out!")  # what gloo says when a wait slice expires


def _body(rank: int, world_size: int) -> tuple[str, Any]:
    synced = synced_reward(timeout=60)(_plain)
    first = synced([f"c{rank}"])
    if rank == 1:
        wait = torch_distributed.TorchDistributedBackend._wait

        def late_wait(self: Any, work: Any, channel: int, timeout: float, kind: str) -> None:
            if channel == 1:
                work = _LateWork(work, self._store)
            wait(self, work, channel, timeout, kind)

        torch_distributed.TorchDistributedBackend._wait = late_wait  # type: ignore[method-assign]
    try:
        last = synced([f"cc{rank}"])
    except Exception as e:
        return type(e).__name__, str(e)[:300]
    # rank 0 returns now: its process exits, with the rendezvous store
    return "ok", (first, last)


def test_peer_leaves_after_its_part_does_not_fail_a_call_whose_data_arrived() -> None:
    (r0, r1) = run_ranks(_body, 2, timeout=120)
    assert r0 == ("ok", ([2.0], [3.0])), r0
    assert r1 == ("ok", ([2.0], [3.0])), f"rank 1's last call failed although its data had arrived: {r1}"
