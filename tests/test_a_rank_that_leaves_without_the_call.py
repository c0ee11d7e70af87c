"""A rank that leaves the job without making a synced call the others wait in makes them raise at once, naming it.

Rank 1 of a 2-rank job (plain ``python`` processes, as a launcher starts them) leaves -- its script ends, it
destroys the default group first, or an exception outside syncreward ends it -- without making the synced
call rank 0 makes with ``timeout=120``. It leaves a record in the job's store as it goes (threading's exit
hook, or the default group's destruction), and rank 0 raises a ``CommunicationError`` naming it within
seconds, instead of waiting the 120 s and then saying rank 1 "did not make their first synced call". A rank
that made every call it was waited for and then left fails nobody: rank 0's call with it works, and only
the call rank 1 never made raises.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncreward.testing import free_port

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
