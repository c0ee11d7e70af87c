"""A reward group for the TRL end-to-end test (importable as ``rewards_grouped:<name>``).

Three rewards -- two plain, one ``async def`` -- synced as one group with ``synced_rewards``: TRL hands
each the same column objects every step, so the columns travel once per step. Each records what it
received and returns ``float(prompt_id)`` per completion (so the test checks every reward's rows).

After every call a ``group_stats`` line records how many inbound exchanges this rank has made so far:
the backend's ``all_to_all`` and ``gather`` calls on channel 0, the first of the two channels of the
``Backend`` protocol, which carries every call's inputs (counted by wrapping the torch backend's method, which the
accelerate backend inherits). A call that gathered its columns made one or more; a call served by what
an earlier call of its group gathered made none.
"""

from __future__ import annotations

import asyncio
import json
import os

from rewards_probe import OUT_ENV, _lock, _log, current_rank, record

from syncreward import synced_rewards
from syncreward.backends.torch_distributed import TorchDistributedBackend

INBOUND_CHANNEL = 0
_inbound = [0]


def _counting(method):  # type: ignore[no-untyped-def]
    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs.get("channel") == INBOUND_CHANNEL:
            with _lock:
                _inbound[0] += 1
        return method(self, *args, **kwargs)

    return counted


# main's inbound is a gather to rank 0 over the torch backend (an all_to_all elsewhere): count both
TorchDistributedBackend.all_to_all = _counting(TorchDistributedBackend.all_to_all)  # type: ignore[method-assign]
TorchDistributedBackend.gather = _counting(TorchDistributedBackend.gather)  # type: ignore[method-assign]


def _stats() -> None:
    out = os.environ.get(OUT_ENV)
    if out:
        with _lock:
            inbound = _inbound[0]
        rec = {"func": "group_stats", "rank": current_rank(), "inbound_exchanges": inbound}
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
