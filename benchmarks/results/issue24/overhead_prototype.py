"""Scratch prototype (not library code): what the single-process path of sync_wrapper costs, and two cuts.

Run from the repository root with PYTHONPATH=$PWD. Interleaved repeats, min per variant (ns per call).

* ``today``: the decorated function (``_decorator.sync_wrapper``);
* ``proto_fast_auto``: the same path with ``resolve_backend("auto")`` replaced by a check that answers
  "local" from the state ``_auto`` reads, in the order it reads it, without three function calls
  (``_ray_joined``, ``_accelerate_active``, ``_torch_active``: ``dist.is_available() and dist.is_initialized()``
  reads ``torch.distributed.distributed_c10d.GroupMember.WORLD``);
* ``proto_fast_auto_count``: and ``binder.local_count`` replaced by ``len`` of the first per-sample keyword
  (TRL's first keyword, ``prompts``) when the binder's fast keyword path applies.
"""

import sys
import timeit

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

import syncreward.backends as B
from syncreward import synced_reward
from syncreward._batch import check_result
from syncreward._lifecycle import nested


def _tiny(prompts, completions, completion_ids, solution, **kwargs):
    return [0.0] * len(completions)


n = 8
kw = {
    "prompts": ["p"] * n,
    "completions": ["c"] * n,
    "completion_ids": [[1, 2]] * n,
    "solution": ["1"] * n,
    "trainer_state": None,
}
today = synced_reward(_tiny)
spec = today.__syncreward_spec__
binder, name, func = spec.binder, spec.name, _tiny
LOCAL = B._LOCAL
ctx = B._context_backend


def _fast_auto():
    """``_auto(None)`` for the common single-process state, else the full resolution."""
    if (
        ctx.get() is None
        and not B._thread_ranks_running
        and "syncreward.backends.ray" not in sys.modules
        and "accelerate.state" not in sys.modules
        and c10d.GroupMember.WORLD is None
        and B._env_world_size() == "1"
    ):
        return LOCAL
    return B.resolve_backend("auto", None)


def proto_fast_auto(*args, **kwargs):
    if nested():
        return func(*args, **kwargs)
    be = _fast_auto()
    if be.world_size == 1:
        return check_result(func(*args, **kwargs), binder.local_count(args, kwargs), name)
    raise AssertionError


shared = binder.shared


def proto_fast_auto_count(*args, **kwargs):
    if nested():
        return func(*args, **kwargs)
    be = _fast_auto()
    if be.world_size == 1:
        count = None
        if not args:
            for k, v in kwargs.items():
                if k not in shared and type(v) is list:
                    count = len(v)
                    break
        if count is None:
            count = binder.local_count(args, kwargs)
        return check_result(func(*args, **kwargs), count, name)
    raise AssertionError


assert dist.is_available()
assert not dist.is_initialized()
variants = {
    "direct": lambda: _tiny(**kw),
    "today": lambda: today(**kw),
    "proto_fast_auto": lambda: proto_fast_auto(**kw),
    "proto_fast_auto_count": lambda: proto_fast_auto_count(**kw),
}
best = {k: float("inf") for k in variants}
for _ in range(9):
    for k, f in variants.items():
        best[k] = min(best[k], timeit.timeit(f, number=100_000) / 100_000 * 1e9)
for k, v in best.items():
    print(f"{k:<24}{v:8.0f} ns   overhead {v - best['direct']:6.0f} ns")
