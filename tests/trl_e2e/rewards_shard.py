"""A shard-mode reward grouped by TRL's own ``prompts`` (importable as ``rewards_shard:<name>``).

``shard_by_prompts`` uses ``group_by="prompts"`` -- no ``prompt_id`` column -- so it works only if TRL's
prompts, plain or conversational (lists of message dicts), are group keys. It records what it received on
each scoring rank, logs ``log_extra``/``log_metric`` (``<name>/even_prompt``: the fraction of its samples
whose prompt id is even, a per-sample mean) and returns ``float(prompt_id)`` per completion.
"""

from __future__ import annotations

from rewards_probe import _log, record

from syncreward import synced_reward


@synced_reward(mode="shard", group_by="prompts")
def shard_by_prompts(prompts, completions, completion_ids=None, **kwargs):
    record("shard_by_prompts", False, prompts, completions, completion_ids, kwargs)
    _log("shard_by_prompts", kwargs, len(completions))
    ids = kwargs["prompt_id"]
    kwargs["log_metric"]("shard_by_prompts/even_prompt", sum(p % 2 == 0 for p in ids) / len(ids))
    return [float(p) for p in ids]
