"""Recording reward functions for the TRL end-to-end harness.

Every call appends one JSON line to ``$TRL_E2E_OUT/rank{R}.jsonl`` describing
what the reward function received (rank, batch size, ``prompt_id`` /
``group_tag`` values, kwarg names, global step, ...).  The functions are
importable as ``rewards_probe:<name>`` (``train.py``'s directory is on
``sys.path``) or by file path.

Besides recording, each probe calls ``log_extra`` with two columns named after
itself (``<name>/prompt_id`` and ``<name>/group_tag``) and ``log_metric`` with
``<name>/batch_size`` -- so tests can check that TRL's completions table stays
aligned and that metric names come from the function name.

``probe_sync`` / ``probe_async`` return 0.0 per sample (the baseline);
``probe_echo_id`` returns ``float(prompt_id)`` so tests can check that rewards
land on the right rows.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

OUT_ENV = "TRL_E2E_OUT"
_lock = threading.Lock()


def current_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except Exception:  # pragma: no cover - torch always importable in the harness
        pass
    return int(os.environ.get("RANK", "0"))


def record(
    func_name: str, is_async: bool, prompts, completions, completion_ids, kwargs
) -> dict:
    """Build the record for one reward call and append it to ``rank{R}.jsonl``."""
    rank = current_rank()
    state = kwargs.get("trainer_state")
    rec = {
        "func": func_name,
        "is_async": is_async,
        "rank": rank,
        "pid": os.getpid(),
        "thread": threading.current_thread().name,
        "time": time.time(),
        "global_step": getattr(state, "global_step", None),
        "n_completions": len(completions),
        "n_prompts": len(prompts),
        "n_completion_ids": len(completion_ids) if completion_ids is not None else None,
        "prompt_id": list(kwargs.get("prompt_id", [])),
        "group_tag": list(kwargs.get("group_tag", [])),
        "solution": list(kwargs.get("solution", [])),
        "prompts": [p if isinstance(p, str) else repr(p) for p in prompts],
        "completions": [c if isinstance(c, str) else repr(c) for c in completions],
        "kwarg_names": sorted(kwargs),
    }
    out = os.environ.get(OUT_ENV)
    if out:
        with _lock, open(os.path.join(out, f"rank{rank}.jsonl"), "a") as fh:
            fh.write(json.dumps(rec) + "\n")
    return rec


def _log(func_name: str, kwargs, n: int) -> None:
    log_extra = kwargs.get("log_extra")
    if log_extra is not None:
        log_extra(f"{func_name}/prompt_id", list(kwargs.get("prompt_id", [None] * n)))
        log_extra(f"{func_name}/group_tag", list(kwargs.get("group_tag", [None] * n)))
    log_metric = kwargs.get("log_metric")
    if log_metric is not None:
        log_metric(f"{func_name}/batch_size", float(n))


def probe_sync(prompts, completions, completion_ids=None, **kwargs):
    """Sync probe: record the call, return 0.0 per completion."""
    record("probe_sync", False, prompts, completions, completion_ids, kwargs)
    _log("probe_sync", kwargs, len(completions))
    return [0.0] * len(completions)


async def probe_async(prompts, completions, completion_ids=None, **kwargs):
    """Async probe: record the call (after yielding once), return 0.0 per completion."""
    await asyncio.sleep(0)
    record("probe_async", True, prompts, completions, completion_ids, kwargs)
    _log("probe_async", kwargs, len(completions))
    return [0.0] * len(completions)


def probe_echo_id(prompts, completions, completion_ids=None, **kwargs):
    """Sync probe returning ``float(prompt_id)`` per completion (alignment checks)."""
    record("probe_echo_id", False, prompts, completions, completion_ids, kwargs)
    return [float(p) for p in kwargs["prompt_id"]]
