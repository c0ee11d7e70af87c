"""The accelerate backend under a real `accelerate launch` on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from syncreward.testing import free_port

pytest.importorskip("accelerate")
pytestmark = pytest.mark.multiprocess

JOB = Path(__file__).parent / "jobs" / "accelerate_job.py"


def _clean_env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("ACCELERATE_")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def test_accelerate_launch_syncs_over_accelerate_backend(tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), str(JOB),
    ]
    env = {**_clean_env(), "SYNCREWARD_JOB_OUT": str(tmp_path)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank*.json"))]
    assert [r["rank"] for r in results] == [0, 1], proc.stdout + proc.stderr
    everything = [c for r in results for c in r["completions"]]
    mean = sum(map(len, everything)) / len(everything)
    expected = [len(c) - mean for c in everything]
    got = {key: [x for r in results for x in r[key]] for key in ("main", "replicate", "async")}
    assert got == {"main": expected, "replicate": expected, "async": expected}
    for r in results:
        assert r["is_accelerate_backend"], r
    assert results[1]["error"] == ["RuntimeError", None]
    assert results[0]["error"] == ["RemoteError", 1]
