"""Baseline (unsynced) behaviour of TRL's GRPOTrainer on 2 CPU ranks.

This documents the problem syncreward solves: with per-device batch 6 and
num_generations 4 on 2 ranks, each reward-function call sees only its rank's
6 completions, and one GRPO group per generation batch is split 2+2 across
ranks (prompt 1 in step 1, prompt 4 in step 2), so no single reward call ever
sees that whole group.
"""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("trl")

from .run import run_grpo  # noqa: E402

pytestmark = pytest.mark.trl

NPROC, PER_DEVICE, NUM_GEN, STEPS = 2, 6, 4, 2
PROBES = ["rewards_probe:probe_sync", "rewards_probe:probe_async"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    out = tmp_path_factory.mktemp("grpo_probe")
    return run_grpo(PROBES, out, nproc=NPROC, timeout=240, extra_args=["--max-steps", str(STEPS)])


def calls(result, rank, func):
    return [c for c in result["records"][rank] if c["func"] == func]


def test_runs_distributed_on_cpu_with_gloo(result):
    for rank in range(NPROC):
        s = result["summaries"][rank]
        assert s["rank"] == rank
        assert s["world_size"] == NPROC
        assert s["distributed_type"].endswith("MULTI_CPU")
        assert s["torch_dist_backend"] == "gloo"
        assert s["config"]["generation_batch_size"] == NPROC * PER_DEVICE == 12
        assert s["config"]["steps_per_generation"] == 1
        assert s["global_step"] == STEPS


@pytest.mark.parametrize("func", ["probe_sync", "probe_async"])
def test_each_reward_call_sees_only_local_completions(result, func):
    expected = {  # RepeatSampler order [0,0,0,0,1,1 | 1,1,2,2,2,2], then prompts 3..5
        0: [[0, 0, 0, 0, 1, 1], [3, 3, 3, 3, 4, 4]],
        1: [[1, 1, 2, 2, 2, 2], [4, 4, 5, 5, 5, 5]],
    }
    for rank in range(NPROC):
        cs = calls(result, rank, func)
        assert [c["global_step"] for c in cs] == list(range(STEPS))
        for c in cs:
            assert c["rank"] == rank
            assert c["n_completions"] == c["n_prompts"] == c["n_completion_ids"] == PER_DEVICE
            assert len(c["prompt_id"]) == len(c["group_tag"]) == PER_DEVICE
            assert c["is_async"] == (func == "probe_async")
            assert {"prompt_id", "group_tag", "solution", "trainer_state", "log_extra", "log_metric"} <= set(
                c["kwarg_names"]
            )
        assert [c["prompt_id"] for c in cs] == expected[rank]
    # async reward functions run on TRL's daemon event-loop thread, sync ones on the main thread
    thread = "GRPOTrainer-AsyncLoop" if func == "probe_async" else "MainThread"
    assert {c["thread"] for r in range(NPROC) for c in calls(result, r, func)} == {thread}


@pytest.mark.parametrize("func", ["probe_sync", "probe_async"])
def test_a_group_is_split_across_ranks(result, func):
    for step in range(STEPS):
        per_rank = {
            rank: Counter(tag for c in calls(result, rank, func) if c["global_step"] == step for tag in c["group_tag"])
            for rank in range(NPROC)
        }
        total = per_rank[0] + per_rank[1]
        assert len(total) == 3 and set(total.values()) == {NUM_GEN}  # every group complete globally...
        split = sorted(set(per_rank[0]) & set(per_rank[1]))
        second = f"grp-{3 * step + 1:03d}"  # ...but the second prompt's group is split 2 + 2
        assert split == [second]
        assert per_rank[0][second] == per_rank[1][second] == 2
        # no reward call ever saw that whole group
        for rank in range(NPROC):
            for c in calls(result, rank, func):
                assert Counter(c["group_tag"])[second] < NUM_GEN


def test_trl_logs_use_function_names_and_aligned_extra_columns(result):
    for rank in range(NPROC):
        s = result["summaries"][rank]
        assert s["reward_func_names"] == ["probe_sync", "probe_async"]
        assert s["logged_reward_names"] == ["probe_async", "probe_sync"]
        assert any("probe_sync/batch_size" in h for h in s["log_history"])  # log_metric passthrough
        log = s["completions_log"]
        # _logs keeps the last generation batch (12 rows, gathered over ranks in rank order)
        assert len(log["prompt"]) == NPROC * PER_DEVICE
        assert set(log["rewards"]) == {"probe_sync", "probe_async"}
        text_to_id = {row["prompt"]: row["prompt_id"] for row in s["dataset"]}
        ids = [text_to_id[p] for p in log["prompt"]]
        assert ids == [3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5]
        for func in ("probe_sync", "probe_async"):
            assert log["extra"][f"{func}/prompt_id"] == ids
            assert log["extra"][f"{func}/group_tag"] == [f"grp-{i:03d}" for i in ids]
