"""examples/expensive_reward.py: local per-sample work, then a synced combine, equals the reward synced whole.

One 3-rank gloo launch (16 rows over 3 ranks: 5, 5, 6; an unscorable row on rank 0) checks the composed
reward against the main-mode reward and the single-process reference; quick thread-rank tests cover an
empty rank and one process; one tiny launch of benchmarks/bench_expensive.py checks that it still runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from syncreward.testing import run_ranks, run_threads

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))  # the example is a plain script; spawned ranks inherit sys.path

import expensive_reward as ex  # noqa: E402

WORLD = 3


def reference(batch: dict[str, list[str]]) -> list[float | None]:
    """The reward computed in one process on the whole batch."""
    return ex.normalise([ex.verify(c, s) for c, s in zip(batch["completions"], batch["solution"], strict=True)])


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(ex.run, WORLD, timeout=180)


@pytest.mark.multiprocess
def test_composed_equals_main_and_the_reference_on_gloo_ranks(results: list[dict[str, Any]]) -> None:
    batch = ex.make_batch()
    n = len(batch["completions"])
    assert [len(r["composed"]) for r in results] == [(r + 1) * n // WORLD - r * n // WORLD for r in range(WORLD)]
    composed = [x for r in results for x in r["composed"]]
    assert composed == [x for r in results for x in r["main"]]  # exactly, not approximately
    assert composed == reference(batch)
    assert composed.count(None) == 1  # the program that never finishes: unscored, not a crash
    per_rank = [x for r in results for x in r["per_rank"]]
    assert max(abs(a - b) for a, b in zip(per_rank, composed, strict=True) if a is not None and b is not None) > 0.1


def test_composed_on_thread_ranks_with_an_empty_rank() -> None:
    batch = ex.make_batch(num_prompts=2)
    slices = [ex.local_slice(batch, 0, 2), {"completions": [], "solution": []}, ex.local_slice(batch, 1, 2)]
    got = run_threads(lambda rank, world_size: ex.verified_reward(**slices[rank]), 3)
    assert [len(g) for g in got] == [4, 0, 4]
    assert [x for g in got for x in g] == reference(batch)


def test_composed_in_one_process() -> None:
    batch = ex.make_batch(num_prompts=2)  # no process group: the synced combine is simply called
    assert ex.verified_reward(**batch) == ex.verified_reward_main(**batch) == reference(batch)


@pytest.mark.multiprocess
def test_bench_expensive_smoke(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_expensive.py"), "--world-sizes", "2", "--per-rank", "4",
           "--rounds", "2", "--warmup", "0", "--timeout", "150", "--out", str(tmp_path / "r.json")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]  # exit 1: composed != main somewhere
    assert "composed/unsynced" in proc.stdout


@pytest.mark.multiprocess
def test_expensive_reward_example_prints_the_three_timings() -> None:
    # the guide's headline is a timing: the example prints it too, not only that the rewards are right
    cmd = [sys.executable, str(ROOT / "examples" / "expensive_reward.py"), "--ranks", "2", "--rounds", "2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "composed == main-mode reward: True" in proc.stdout
    line = next((x for x in proc.stdout.splitlines() if x.startswith("ms per call")), "")
    m = re.fullmatch(
        r"ms per call \(median of 2 calls, slowest rank\): unsynced ([\d.]+) \(wrong\), synced whole ([\d.]+), "
        r"composed ([\d.]+)",
        line,
    )
    assert m is not None, proc.stdout
    unsynced, whole, composed = map(float, m.groups())
    assert unsynced >= 8 * 4  # 8 completions per rank at 4 ms each, at least
    assert composed >= 8 * 4  # the same local work, then the synced combine
    assert whole >= 16 * 4  # rank 0 verifies all 16
