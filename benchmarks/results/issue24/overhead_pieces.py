"""The single-process path of a synced call, piece by piece (timeit, min of 7 repeats, ns per call)."""

import timeit

import torch.distributed as dist

import syncreward.backends as B
from syncreward import synced_reward
from syncreward._batch import check_result
from syncreward._codec import container_of
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
f = synced_reward(_tiny)
binder = f.__syncreward_spec__.binder
res = _tiny(**kw)
be = B.resolve_backend("auto")

tests = {
    "direct _tiny(**kw)": lambda: _tiny(**kw),
    "synced auto": lambda: f(**kw),
    "nested()": nested,
    "resolve_backend('auto')": lambda: B.resolve_backend("auto", None),
    "  _context_backend.get": B._context_backend.get,
    "  _ray_joined": B._ray_joined,
    "  _accelerate_active": B._accelerate_active,
    "  _torch_active": B._torch_active,
    "    dist.is_available": dist.is_available,
    "    dist.is_initialized": dist.is_initialized,
    "  _env_world_size": B._env_world_size,
    "be.world_size": lambda: be.world_size,
    "binder.local_count": lambda: binder.local_count((), kw),
    "  container_of(list)": lambda: container_of(kw["prompts"]),
    "check_result": lambda: check_result(res, 8, "x"),
    "empty lambda": lambda: None,
}
for k, t in tests.items():
    print(f"{k:<28}{min(timeit.repeat(t, number=100000, repeat=7)) / 100000 * 1e9:8.0f} ns")
