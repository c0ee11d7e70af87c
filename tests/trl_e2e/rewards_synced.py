"""Synced reward functions for the TRL end-to-end tests (importable as ``rewards_synced:<name>``).

Each records what it received (``rewards_probe.record``) on the rank(s) where it runs, logs through
TRL's ``log_extra``/``log_metric``, and returns ``float(prompt_id)`` per completion so the tests can
check that every reward lands on its own row.
"""

from __future__ import annotations

import asyncio
import os

from rewards_probe import _log, record

from syncreward import synced_reward


@synced_reward
def synced_sync(prompts, completions, completion_ids=None, **kwargs):
    """A sync synced reward: sees the whole generation batch on rank 0."""
    record("synced_sync", False, prompts, completions, completion_ids, kwargs)
    _log("synced_sync", kwargs, len(completions))
    return [float(p) for p in kwargs["prompt_id"]]


@synced_reward
async def synced_slow_judge(prompts, completions, completion_ids=None, **kwargs):
    """An async synced reward awaiting slow I/O (a judge call) on the scoring rank."""
    await asyncio.sleep(float(os.environ.get("SLOW_JUDGE_S", "1.0")))
    record("synced_slow_judge", True, prompts, completions, completion_ids, kwargs)
    _log("synced_slow_judge", kwargs, len(completions))
    return [float(p) for p in kwargs["prompt_id"]]


@synced_reward(mode="replicate")
async def synced_fast_async(prompts, completions, completion_ids=None, **kwargs):
    """A second async synced reward that TRL runs concurrently with the slow judge."""
    await asyncio.sleep(0)
    record("synced_fast_async", True, prompts, completions, completion_ids, kwargs)
    _log("synced_fast_async", kwargs, len(completions))
    return [float(p) for p in kwargs["prompt_id"]]
