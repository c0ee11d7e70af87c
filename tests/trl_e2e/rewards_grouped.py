"""A reward group for the TRL end-to-end test (importable as ``rewards_grouped:<name>``).

Three rewards -- two plain, one ``async def`` -- synced as one group with ``synced_rewards``: TRL hands
each the same column objects every step, so the columns travel once per step. Each records what it
received and returns ``float(prompt_id)`` per completion (so the test checks every reward's rows); the
group's hit/miss counts are recorded as a ``group_stats`` line after every call.
"""

from __future__ import annotations

import asyncio
import json
import os

from rewards_probe import OUT_ENV, _lock, _log, current_rank, record

from syncreward import synced_rewards


def _stats() -> None:
    group = group_accuracy.__syncreward_spec__.impl.group  # type: ignore[attr-defined]
    out = os.environ.get(OUT_ENV)
    if out:
        rec = {"func": "group_stats", "rank": current_rank(), "hits": group.hits, "misses": group.misses}
        with _lock, open(os.path.join(out, f"rank{rec['rank']}.jsonl"), "a") as fh:
            fh.write(json.dumps(rec) + "\n")


def group_accuracy(prompts, completions, completion_ids=None, **kwargs):
    record("group_accuracy", False, prompts, completions, completion_ids, kwargs)
    _log("group_accuracy", kwargs, len(completions))
    _stats()
    return [float(p) for p in kwargs["prompt_id"]]


def group_format(prompts, completions, completion_ids=None, **kwargs):
    record("group_format", False, prompts, completions, completion_ids, kwargs)
    _log("group_format", kwargs, len(completions))
    _stats()
    return [float(p) for p in kwargs["prompt_id"]]


async def group_judge(prompts, completions, completion_ids=None, **kwargs):
    await asyncio.sleep(0.05)
    record("group_judge", True, prompts, completions, completion_ids, kwargs)
    _log("group_judge", kwargs, len(completions))
    _stats()
    return [float(p) for p in kwargs["prompt_id"]]


group_accuracy, group_format, group_judge = synced_rewards(group_accuracy, group_format, group_judge)
