"""The templates in examples/: synced on local ranks == the plain function on the concatenated batch.

One 3-rank launch runs the four reward templates (groups are cut at rank boundaries: 20 rows over 3 ranks);
the torchrun and accelerate loops and the TRL example run under their real launchers; one template runs as a script.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from syncreward.testing import free_port, run_ranks

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))  # the templates are plain scripts; spawned ranks inherit sys.path

import batch_normalized  # noqa: E402
import diversity  # noqa: E402
import llm_judge_ranking  # noqa: E402
import pairwise_bradley_terry  # noqa: E402

WORLD = 3
BIN = Path(sys.executable).parent


def plain(module: Any, fn: Any) -> list[float]:
    """The undecorated reward on the whole batch, in this process."""
    out = fn.__wrapped__(**module.make_batch())
    return asyncio.run(out) if asyncio.iscoroutine(out) else out


CASES = {
    "llm_judge_ranking": (llm_judge_ranking, llm_judge_ranking.judge_ranking_reward),
    "batch_normalized": (batch_normalized, batch_normalized.batch_normalized_reward),
    "pairwise_bradley_terry": (pairwise_bradley_terry, pairwise_bradley_terry.bradley_terry_reward),
    "diversity": (diversity, diversity.diversity_reward),
}


def rank_body(rank: int, world_size: int) -> dict[str, Any]:
    return {name: module.run(rank, world_size) for name, (module, _) in CASES.items()}


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(rank_body, WORLD, timeout=180)


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", list(CASES))
def test_template_synced_equals_plain(results: list[dict[str, Any]], name: str) -> None:
    module, fn = CASES[name]
    parts = [r[name] for r in results]
    n = len(module.make_batch()["completions"])
    assert n % module.K == 0
    assert (n // WORLD) % module.K != 0
    per_rank: list[float] | None = None
    if isinstance(parts[0], dict):  # batch_normalized also returns the per-rank (unsynced) values
        per_rank = [x for p in parts for x in p["per_rank"]]
        parts = [p["synced"] for p in parts]
    assert [len(p) for p in parts] == [(r + 1) * n // WORLD - r * n // WORLD for r in range(WORLD)]
    synced = [x for p in parts for x in p]
    expected = plain(module, fn)
    assert synced == pytest.approx(expected, rel=1e-12, abs=1e-12)
    if per_rank is not None:
        assert max(abs(a - b) for a, b in zip(per_rank, synced, strict=True)) > 0.05


@pytest.mark.parametrize("name", list(CASES))
def test_template_one_process(name: str) -> None:
    module, fn = CASES[name]
    out = fn(**module.make_batch())  # no process group: the function is called directly
    out = asyncio.run(out) if asyncio.iscoroutine(out) else out
    assert out == plain(module, fn)
    assert all(math.isfinite(x) for x in out)


# --------------------------------------------------------------------------- real launchers


def _clean_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not (
            k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK")
            or k.startswith(("MASTER_", "ACCELERATE_", "TORCHELASTIC_"))
        )
    }
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return env


def _launch(cmd: list[str], timeout: float = 150, env: dict[str, str] | None = None) -> str:
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**_clean_env(), **(env or {})},
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks
        out, _ = proc.communicate()
        pytest.fail(f"{cmd[0]} did not finish within {timeout}s:\n{out[-4000:]}")
    assert proc.returncode == 0, f"exit code {proc.returncode}:\n{out[-4000:]}"
    return out


def _check_loop_output(out: str, backend: str) -> None:
    steps = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(steps) == 3, out[-4000:]
    assert all("synced == plain(global batch): True" in line and f"backend {backend}" in line for line in steps), out
    assert out.splitlines().count("done") == 1, out[-4000:]


@pytest.mark.multiprocess
def test_torchrun_loop() -> None:
    out = _launch(
        [str(BIN / "torchrun"), "--nproc_per_node", "2", "--nnodes", "1", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(EXAMPLES / "torchrun_loop.py")]
    )  # fmt: skip
    _check_loop_output(out, "TorchDistributedBackend")
    assert "rows per rank [6, 6]" in out  # 3 prompts x K=4: prompt 1 is split across the two ranks


@pytest.mark.multiprocess
def test_accelerate_loop() -> None:
    # --multi_gpu selects accelerate's torch.distributed launcher; on this CPU-only machine the script asks for
    # the CPU (gloo). `accelerate launch --cpu --num_processes 2` would start a single process without mpirun.
    out = _launch(
        [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
         str(EXAMPLES / "accelerate_loop.py")]
    )  # fmt: skip
    _check_loop_output(out, "AccelerateBackend")
    assert "processes 2, rows 12" in out


@pytest.mark.multiprocess
def test_template_runs_as_script() -> None:
    out = _launch([sys.executable, str(EXAMPLES / "diversity.py"), "--ranks", "2"], timeout=120)
    assert "2 ranks, diversity rewards per prompt" in out
    assert "per-rank scoring differs from the global-batch rewards by up to" in out
    assert "synced == single-process reference: True" in out


# Offline and on CPU ranks even on a GPU machine: nothing may be downloaded.
TRL_ENV = {
    "CUDA_VISIBLE_DEVICES": "",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "disabled",
}


TRL_GUIDE = EXAMPLES.parent / "docs" / "guides" / "trl.md"


def _guide_sample(path: Path = TRL_GUIDE) -> str:
    """The ``text`` block after ``<!-- output: examples/trl_grpo.py -->`` in the TRL guide."""
    m = re.search(r"^<!-- output: examples/trl_grpo.py -->\n```text\n(.*?)^```", path.read_text(), re.M | re.S)
    assert m is not None, f"{path}: no sample output block for examples/trl_grpo.py"
    return m.group(1)


def _first_call_blocks(out: str) -> dict[tuple[int, str], dict[str, list[float]]]:
    """{(rank, reward): {"prompt_id": [...], "per-rank": [...], "synced": [...]}} from the example's output."""
    blocks = {}
    for m in re.finditer(
        r"^rank (\d) (\w+) +prompt_id \[([\d, ]*)\]\n  per-rank \[([^\]]*)\]\n  synced   \[([^\]]*)\]$", out, re.M
    ):
        blocks[int(m.group(1)), m.group(2)] = {
            "prompt_id": [float(x) for x in m.group(3).split(",")],
            "per-rank": [float(x) for x in m.group(4).split(",")],
            "synced": [float(x) for x in m.group(5).split(",")],
        }
    return blocks


@pytest.mark.trl
@pytest.mark.multiprocess
def test_trl_grpo_example() -> None:
    pytest.importorskip("trl")
    out = _launch(
        [str(BIN / "torchrun"), "--nproc_per_node", "2", "--nnodes", "1", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), str(EXAMPLES / "trl_grpo.py")],
        timeout=300,
        env=TRL_ENV,
    )  # fmt: skip
    assert "generation batch: 12 completions = 3 prompts x 4, 6 per rank" in out, out[-4000:]
    assert "trained 2 steps on 2 ranks" in out, out[-4000:]
    assert out.split().count("done") == 1, out[-4000:]  # words, not lines: rank 1 may write between them
    assert "terminate called" not in out  # the example tears the process group down
    blocks = _first_call_blocks(out)
    assert set(blocks) == {(r, f) for r in (0, 1) for f in ("relative_brevity", "judge_rank")}, out[-4000:]
    assert blocks[0, "judge_rank"]["prompt_id"] == [0, 0, 0, 0, 1, 1]  # prompt 1 is split 2 + 2
    assert blocks[1, "judge_rank"]["prompt_id"] == [1, 1, 2, 2, 2, 2]
    # Synced, prompt 1's four completions are ranked together: 0, 1/3, 2/3, 1 across the two ranks. Per rank,
    # each rank ranks its two alone: 0 and 1 on both.
    split = lambda key: sorted(blocks[0, "judge_rank"][key][4:] + blocks[1, "judge_rank"][key][:2])  # noqa: E731
    assert split("synced") == pytest.approx([0, 0.33, 0.67, 1], abs=0.01)
    assert split("per-rank") == [0, 0, 1, 1]
    # Synced, the brevity reward is centred on the whole generation batch.
    synced = blocks[0, "relative_brevity"]["synced"] + blocks[1, "relative_brevity"]["synced"]
    assert abs(sum(synced)) < 0.05
    assert "FutureWarning" not in out  # the example silences transformers' gradient_checkpointing renames
    # The guide's sample output is this run's: the same per-rank blocks (their order between ranks varies), and
    # every other line it shows.
    sample = _guide_sample()
    assert _first_call_blocks(sample) == blocks, (sample, out[-4000:])
    block_lines = re.compile(r"^(rank \d \w+ +prompt_id|  per-rank|  synced) ")
    whole_lines = set(out.splitlines())  # a line of the sample is a whole line of the run, not a prefix of one
    missing = [x for x in sample.splitlines() if x.strip() and not block_lines.match(x) and x not in whole_lines]
    assert not missing, (missing, out[-4000:])


@pytest.mark.trl
def test_trl_grpo_example_in_one_process() -> None:
    # `python examples/trl_grpo.py`, as the other examples run (ddp_backend="gloo" needs a process group)
    pytest.importorskip("trl")
    out = _launch([sys.executable, str(EXAMPLES / "trl_grpo.py")], timeout=240, env=TRL_ENV)
    assert "generation batch: 8 completions = 2 prompts x 4, 8 per rank" in out, out[-4000:]
    assert "trained 2 steps on 1 ranks" in out, out[-4000:]
    assert out.split().count("done") == 1, out[-4000:]
