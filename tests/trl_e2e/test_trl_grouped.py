"""A real TRL GRPOTrainer on 2 CPU ranks with a reward group: three rewards (one async), columns sent once a step."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

import pytest

from .run import run_grpo

pytestmark = [pytest.mark.trl, pytest.mark.multiprocess]

NAMES = ["group_accuracy", "group_format", "group_judge"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    rewards = [f"rewards_grouped:{name}" for name in NAMES]
    return run_grpo(rewards, tmp_path_factory.mktemp("trl_grouped"), nproc=2, timeout=300)


def test_reward_group_in_trl_every_reward_sees_the_whole_batch_on_its_own_rows(run: dict) -> None:
    summary = run["summaries"][0]
    k = summary["config"]["num_generations"]
    per_rank = summary["config"]["per_device_train_batch_size"]
    calls = [rec for recs in run["records"].values() for rec in recs if rec["func"] in NAMES]
    for name in NAMES:
        mine = [c for c in calls if c["func"] == name]
        assert mine and {c["rank"] for c in mine} == {0}, name  # main mode: scored on rank 0
        for c in mine:
            assert c["n_completions"] == 2 * per_rank, (name, c["n_completions"])
            assert all(n == k for n in Counter(c["prompt_id"]).values()), c["prompt_id"]
    for rank, s in run["summaries"].items():
        assert s["reward_func_names"] == NAMES
        for name in NAMES:
            ids = s["completions_log"]["extra"][f"{name}/prompt_id"]
            assert s["completions_log"]["rewards"][name] == [float(i) for i in ids], (rank, name)


def test_reward_group_in_trl_gathers_the_columns_once_per_step(run: dict) -> None:
    stats = [rec for rec in run["records"][0] if rec["func"] == "group_stats"]
    steps = len(stats) // len(NAMES)
    assert steps >= 1
    counts = [0] + [rec["inbound_exchanges"] for rec in stats]
    gathered = [after > before for before, after in pairwise(counts)]
    # one gathering per step (the step's first reward); the other two rewards of the step exchange no inputs
    assert gathered == [True, False, False] * steps, stats
