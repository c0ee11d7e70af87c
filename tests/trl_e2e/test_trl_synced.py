"""A real TRL GRPOTrainer on 2 CPU ranks with synced rewards (tiny offline model, groups split across ranks)."""

from __future__ import annotations

from collections import Counter

import pytest

from .run import run_grpo

pytestmark = [pytest.mark.trl, pytest.mark.multiprocess]

REWARDS = ["rewards_synced:synced_sync", "rewards_synced:synced_slow_judge", "rewards_synced:synced_fast_async"]
NAMES = ["synced_sync", "synced_slow_judge", "synced_fast_async"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_grpo(REWARDS, tmp_path_factory.mktemp("trl_synced"), nproc=2, timeout=300)


def _calls(run: dict, func: str) -> list[dict]:
    return [rec for recs in run["records"].values() for rec in recs if rec["func"] == func]


def test_synced_rewards_see_the_whole_generation_batch_with_whole_groups(run: dict) -> None:
    summary = run["summaries"][0]
    k = summary["config"]["num_generations"]
    per_rank = summary["config"]["per_device_train_batch_size"]
    assert per_rank % k, "the geometry must make TRL split a group across the ranks"
    for func in ("synced_sync", "synced_slow_judge"):  # mode="main": scored once, on rank 0
        calls = _calls(run, func)
        assert calls and {c["rank"] for c in calls} == {0}, calls
        for c in calls:
            assert c["n_completions"] == 2 * per_rank
            assert all(n == k for n in Counter(c["prompt_id"]).values()), c["prompt_id"]
            assert c["prompt_id"] == sorted(c["prompt_id"])  # rank order = TRL's gather order
    replicated = _calls(run, "synced_fast_async")  # mode="replicate": every rank, whole batch
    assert {c["rank"] for c in replicated} == {0, 1}
    assert all(c["n_completions"] == 2 * per_rank for c in replicated)


def test_rewards_land_on_their_own_rows_and_log_extra_stays_aligned(run: dict) -> None:
    for rank, summary in run["summaries"].items():
        table = summary["completions_log"]
        for name in NAMES:
            ids = table["extra"][f"{name}/prompt_id"]
            assert len(ids) == len(table["rewards"][name]) > 0, (rank, name)
            assert table["rewards"][name] == [float(i) for i in ids], (rank, name)


def test_every_rank_logs_the_same_metric_keys_with_the_global_batch_size(run: dict) -> None:
    keys = {rank: {k for h in s["log_history"] for k in h} for rank, s in run["summaries"].items()}
    assert keys[0] == keys[1]
    per_rank = run["summaries"][0]["config"]["per_device_train_batch_size"]
    values = [h["synced_sync/batch_size"] for h in run["summaries"][0]["log_history"] if "synced_sync/batch_size" in h]
    assert values and all(v == 2 * per_rank for v in values)


def test_reward_names_in_trl_logs_are_the_function_names(run: dict) -> None:
    for summary in run["summaries"].values():
        assert summary["reward_func_names"] == NAMES
        assert set(summary["logged_reward_names"]) == set(NAMES)


def test_concurrent_async_rewards_overlap_instead_of_blocking(run: dict) -> None:
    # TRL gathers the two async rewards on one event loop. While the slow judge awaits its I/O on
    # rank 0, the other async reward runs to completion on every rank.
    slow = _calls(run, "synced_slow_judge")
    fast = {(c["rank"], c["global_step"]): c["time"] for c in _calls(run, "synced_fast_async")}
    for call in slow:
        for rank in (0, 1):
            assert fast[(rank, call["global_step"])] < call["time"] - 0.5, (fast, call)
