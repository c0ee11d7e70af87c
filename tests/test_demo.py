"""``python -m syncreward demo``: its compact reward equals the example's port, and the command runs."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from syncreward import _demo
from syncreward.__main__ import main

FIDELITY = Path(__file__).resolve().parents[1] / "examples" / "visualquality_r1" / "fidelity.py"


def _example() -> ModuleType:
    if not FIDELITY.exists():
        pytest.skip("examples/ not present")
    spec = importlib.util.spec_from_file_location("demo_vq_fidelity", FIDELITY)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("images", [1, 2, 3, 8])
def test_compact_fidelity_equals_example(k: int, images: int) -> None:
    fid = _example()
    for seed in range(3):
        batch = _demo.make_batch(images, k, seed)
        if seed == 2:  # ties in MOS and in scores
            batch["mos"] = [float(round(m)) for m in batch["mos"]]
            batch["scores"] = [float(round(s)) for s in batch["scores"]]
        ours = _demo.fidelity_reward(batch["scores"], batch["mos"], k)
        completions = [f"<think>...</think><answer>{s}</answer>" for s in batch["scores"]]
        solutions = [f"<answer> {m} </answer>" for m in batch["mos"]]
        theirs = fid.fidelity_rewards(completions, solutions, k)
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-15)


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
        and not k.startswith(("MASTER_", "ACCELERATE_", "TORCHELASTIC_"))
    }
    env["OMP_NUM_THREADS"] = "1"
    return env


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "syncreward", *args], capture_output=True, text=True, timeout=timeout, env=_env()
    )


@pytest.mark.multiprocess
def test_demo_runs() -> None:
    done = _cli("demo", "--ranks", "2", "--images", "4", "--generations", "3", "--seed", "5", timeout=150)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "fidelity reward on 2 local CPU ranks" in out
    assert "4 images x 3 generations = 12 completions, 6 per rank, seed 5" in out
    rows = [line.split() for line in out.splitlines() if line.strip().split(" ")[0] in ("0", "1")]
    assert [r[:2] for r in rows] == [["0", "0-1"], ["1", "2-3"]], out
    for r in rows:
        assert r[2:6] == ["1", "->", "3", "other"], out  # comparison set: 1 other image unsynced, 3 synced
        assert float(r[7]) > 0.0  # unsynced drift
        assert r[8] == "True"  # synced == reference
        assert float(r[9]) > 0.0  # ms per call
    assert "rewards equal the single-process reference on all 2 ranks: True" in out
    assert "which lie between 0 and 1, drift from the global-batch rewards by up to" in out  # a drift with a scale


@pytest.mark.multiprocess
def test_demo_one_rank() -> None:
    done = _cli("demo", "--ranks", "1", "--images", "3", "--generations", "2", timeout=90)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "fidelity reward on 1 local CPU rank (" in out
    assert "nothing to sync" in out
    assert "instead of" not in out
    assert "reference on the single rank: True" in out


def test_help() -> None:
    top = _cli("--help")
    assert top.returncode == 0
    assert "demo" in top.stdout
    demo = _cli("demo", "--help")
    assert demo.returncode == 0
    for option in ("--ranks", "--images", "--generations", "--seed", "default: 4"):
        assert option in demo.stdout, demo.stdout


def test_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["demo", "--ranks", "3", "--images", "4"])
    assert e.value.code == 2
    assert "multiple of --ranks" in capsys.readouterr().err
    assert main([]) == 2  # no command: help
    with pytest.raises(ValueError, match="positive"):
        _demo.run_demo(ranks=0)
