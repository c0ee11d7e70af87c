"""A real TRL GRPOTrainer on 2 CPU ranks, conversational prompts, a shard-mode reward with group_by="prompts".

Geometry (train.py's default): 3 prompts x 4 generations, 6 rows per rank, prompt 1 split 2 + 2. Grouped by
prompt, rank 0 scores prompt 0 (4 samples) and rank 1 prompts 1 and 2 (8 samples).
"""

from __future__ import annotations

from collections import Counter

import pytest

from .run import run_grpo

pytestmark = [pytest.mark.trl, pytest.mark.multiprocess]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_grpo(
        ["rewards_shard:shard_by_prompts"],
        tmp_path_factory.mktemp("trl_shard"),
        nproc=2,
        timeout=300,
        extra_args=["--conversational"],
    )


def test_group_by_prompts_in_trl_with_conversational_prompts_scores_whole_groups(run: dict) -> None:
    k = run["summaries"][0]["config"]["num_generations"]
    calls = [rec for recs in run["records"].values() for rec in recs if rec["func"] == "shard_by_prompts"]
    assert {c["rank"] for c in calls} == {0, 1}, calls
    assert all(p.startswith("[{") for c in calls for p in c["prompts"]), "the prompts must be conversational"
    for c in calls:
        assert all(n == k for n in Counter(c["prompt_id"]).values()), c["prompt_id"]
    assert sorted(p for c in calls for p in c["prompt_id"]) == sorted(p for p in range(3) for _ in range(k))


def test_group_by_prompts_in_trl_rewards_land_on_their_own_rows(run: dict) -> None:
    for rank, summary in run["summaries"].items():
        table = summary["completions_log"]
        ids = table["extra"]["shard_by_prompts/prompt_id"]
        assert len(ids) == len(table["rewards"]["shard_by_prompts"]) > 0, rank
        assert table["rewards"]["shard_by_prompts"] == [float(i) for i in ids], rank


def test_log_metric_in_shard_mode_in_trl_logs_the_batch_mean(run: dict) -> None:
    # 2 of the 3 prompts (0 and 2) are even, 4 completions each: 8/12 of the batch. The scoring ranks saw 4/4
    # (rank 0) and 4/8 (rank 1): their plain mean, 0.75, is what TRL logged before.
    for rank, summary in run["summaries"].items():
        logged = [
            h["shard_by_prompts/even_prompt"] for h in summary["log_history"] if "shard_by_prompts/even_prompt" in h
        ]
        assert logged == [pytest.approx(8 / 12)], (rank, logged)
