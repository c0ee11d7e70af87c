"""The benchmark harness still runs: one tiny round of every variant on 2 ranks (not a timing test)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_exchange.py"


def test_bench_exchange_smoke(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--world-sizes", "2",
        "--rounds", "1",
        "--warmup", "0",
        "--payloads", "trl", "skewed",
        "--profile-calls", "1",
        "--profile-payloads", "trl",
        "--shard-rounds", "1",
        "--overhead-number", "200",
        "--overhead-repeat", "1",
        "--timeout", "240",
        "--out", str(out),
        "--markdown", str(tmp_path / "tables.md"),
    ]  # fmt: skip
    if importlib.util.find_spec("matplotlib") is not None:
        cmd += ["--plot-dir", str(tmp_path / "img")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

    results = json.loads(out.read_text())
    res = results["world_sizes"]["2"]
    for payload in ("trl", "skewed"):
        variants = res["payloads"][payload]["variants"]
        expected = {"direct", "handrolled", "fused_objects", "main", "replicate", "shard", "raw_all_gather"}
        assert set(variants) >= expected
        for name, v in variants.items():
            assert v["correct"] in (True, None), (payload, name)  # None: raw/probe variants compute nothing
            assert v["n"] == 1
        assert variants["direct"]["collectives"] == 0
        assert variants["handrolled"]["collectives"] == 10  # 4 columns x (sizes + data) + broadcast (sizes + data)
        assert variants["raw_all_gather"]["collectives"] == 1
        assert 1 <= variants["main"]["collectives"] <= 4
    skewed = res["payloads"]["skewed"]
    assert skewed["n_local"] == [0, 512]
    # rank 0 (empty) receives exactly rank 1's frame in main mode's payload all_to_all
    assert skewed["variants"]["main"]["recv_peak_rank0"] <= 1.25 * skewed["frame_total"]
    assert set(res["payloads"]["trl"]["profile"]["0"]) >= {"total", "score", "pre:gather"}  # main's inbound
    assert set(res["judge"]["variants"]) == {"direct", "main", "shard", "async_main", "async_shard"}
    assert results["overhead"]["ns_per_call"]["direct"] > 0
    assert results["goals"]
    assert "| `main` |" in (tmp_path / "tables.md").read_text()
    if "--plot-dir" in cmd:
        assert (tmp_path / "img" / "performance.png").stat().st_size > 10_000


def test_bench_trl_call_smoke(tmp_path: Path) -> None:
    """``--row trl``: TRL's real call; the reward reading two columns sends less than one reading all."""
    out = tmp_path / "results.json"
    cmd = [sys.executable, str(SCRIPT), "--row", "trl", "--world-sizes", "2", "--rounds", "1", "--warmup", "0"]
    cmd += ["--timeout", "240", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    variants = json.loads(out.read_text())["world_sizes"]["2"]["payloads"]["trlcall"]["variants"]
    assert set(variants) == {"main", "main_ids", "handrolled", "dict_gather", "raw_to_root", "raw_all_gather"}
    for name, v in variants.items():
        assert v["correct"] in (True, None), name
    assert variants["main"]["sent_total"] < 0.6 * variants["main_ids"]["sent_total"]


def test_scale_model_smoke(tmp_path: Path) -> None:
    """benchmarks/scale.py runs and its closed-form model matches the counts it measures (W=2, 3)."""
    out = tmp_path / "scale.json"
    cmd = [
        sys.executable, str(ROOT / "benchmarks" / "scale.py"),
        "--world-sizes", "2", "3", "--calls", "2", "--warmup", "10", "--wire-cpu", "8",  # warm-up: past BLOCK_LAG
        "--fd-headroom", "0", "--timeout", "60", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    results = json.loads(out.read_text())
    assert results["model_exact"], results


def test_bench_group_keys_smoke() -> None:
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "bench_group_keys.py"),
        "--rows",
        "8",
        "--world",
        "2",
        "--rounds",
        "2",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    assert "| conversational prompts | 2 |" in out, out


def test_bench_codec_tensors_smoke() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_codec.py"), "--payloads", "--tensors", "1", "--rounds", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True, cwd=ROOT).stdout
    assert "tensors, strided views" in out, out


def test_call_tree_counts_every_rank_s_calls_under_the_wrapper() -> None:
    cmd = [sys.executable, str(ROOT / "benchmarks" / "call_tree.py"), "--depth", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True, cwd=ROOT).stdout
    for rank in (0, 1):
        assert f"== rank {rank}: " in out, out
    assert out.count("sync_wrapper (_decorator.py)") == 2, out
    assert out.count("call_sync (_lifecycle.py)") == 2, out


def test_gpu_check_passes_every_case_without_a_gpu() -> None:
    """benchmarks/gpu_check.py --device cpu: every case of the GPU check (the default device is meta), W=2."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--world-sizes", "2"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert sum(line.startswith("PASS W=2 ") for line in lines) == 16, run.stdout
    assert not any(line.startswith("FAIL") for line in lines), run.stdout
