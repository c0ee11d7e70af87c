"""TRL's real call, inside a benchmark rank: every column TRL hands a reward, the reward reading two.

TRL 1.x's ``GRPOTrainer`` calls every reward as ``f(prompts=..., completions=..., completion_ids=...,
<every dataset column>=..., trainer_state=..., log_extra=..., log_metric=...)``. The ``trlcall`` payload
is that call with long completions (``_payloads``: 64 per rank, ~8 KB of text and ~2k token ids each, a
``solution`` column). The variants, in ``bench_exchange``'s names:

* ``main``: open-r1's ``accuracy_reward(completions, solution, **kwargs)``, synced (``mode="main"``);
  ``main_old``: the same through the ``--ab`` revision's package;
* ``main_ids`` / ``main_ids_old``: a reward that reads ``completion_ids`` through its ``**kwargs``, so
  every column travels (the conservative path: no slower than before);
* ``handrolled``: that reward's hand-rolled code: ``all_gather_object`` of the two columns it reads,
  score on rank 0, ``broadcast_object_list``, each rank slices its part;
* ``dict_gather``: one ``all_gather_object`` of a dict of every per-sample column TRL passes; every
  rank scores the whole batch and keeps its slice;
* ``raw_to_root`` / ``raw_all_gather``: the raw transfer of the two columns the reward reads (one frame
  per rank, already serialised).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from _payloads import local_count, make_batch

from syncreward import synced_reward
from syncreward.backends.torch_distributed import TorchDistributedBackend

__all__ = ["PAYLOADS", "call_for", "expected", "variants"]

PAYLOADS = ("trlcall",)
READ = ("completions", "solution")  # what accuracy_reward reads


@dataclass
class TrainerState:
    """What TRL passes as ``trainer_state`` (``transformers.TrainerState``), as far as a reward sees it."""

    global_step: int = 0


def _log(*args: Any, **kwargs: Any) -> None:
    return None


def accuracy_reward(completions, solution, **kwargs):  # open-r1's signature
    """open-r1's accuracy reward, in shape: the completion's answer against the solution."""
    return [1.0 if c.endswith(s) else 0.0 for c, s in zip(completions, solution, strict=True)]


def ids_reward(completions, solution, **kwargs):
    """The same, plus a length term read from ``completion_ids`` through ``**kwargs``."""
    ids = kwargs["completion_ids"]
    return [(1.0 if c.endswith(s) else 0.0) + 1e-4 * len(i) for c, s, i in zip(completions, solution, ids, strict=True)]


def call_for(payload: str, rank: int, world_size: int) -> dict[str, Any]:
    """One rank's call as TRL makes it: per-sample lists, the trainer state and the log functions."""
    batch = make_batch(payload, rank, world_size)
    n = len(batch["completions"])
    return {
        "prompts": [f"Solve problem {rank}-{i // 8}: what is the value of x? Show your reasoning." for i in range(n)],
        "completions": batch["completions"],
        "completion_ids": batch["completion_ids"],
        "solution": batch["solution"],
        "trainer_state": TrainerState(global_step=7),
        "log_extra": _log,
        "log_metric": _log,
    }


def columns(call: dict[str, Any]) -> dict[str, list[Any]]:
    """The per-sample columns of a call (what a hand-rolled gather of everything moves)."""
    return {k: v for k, v in call.items() if isinstance(v, list)}


def expected(payload: str, rank: int, world_size: int) -> dict[str, list[float]]:
    """Each reward's oracle: the plain function on the concatenated global batch, this rank's slice."""
    calls = [columns(call_for(payload, r, world_size)) for r in range(world_size)]
    flat = {k: [x for c in calls for x in c[k]] for k in calls[0]}
    lo = sum(local_count(payload, r, world_size) for r in range(rank))
    hi = lo + local_count(payload, rank, world_size)
    return {"accuracy": accuracy_reward(**flat)[lo:hi], "ids": ids_reward(**flat)[lo:hi]}


def handrolled(call: dict[str, Any]) -> list[float]:
    """The reward's hand-rolled code: gather the two columns it reads, score on rank 0, broadcast, slice."""
    w, me = dist.get_world_size(), dist.get_rank()
    gathered: dict[str, list[Any]] = {}
    for key in READ:
        parts: list[Any] = [None] * w
        dist.all_gather_object(parts, call[key])
        gathered[key] = parts
    counts = [len(p) for p in gathered["completions"]]
    box: list[Any] = [None]
    if me == 0:
        box[0] = accuracy_reward(**{k: [x for p in parts for x in p] for k, parts in gathered.items()})
    dist.broadcast_object_list(box, src=0)
    lo = sum(counts[:me])
    return box[0][lo : lo + counts[me]]  # type: ignore[no-any-return]


def dict_gather(call: dict[str, Any]) -> list[float]:
    """One all_gather_object of every per-sample column; every rank scores the whole batch, keeps its slice."""
    mine = columns(call)
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, mine)
    me = dist.get_rank()
    lo = sum(len(p["completions"]) for p in parts[:me])
    flat = {k: [x for p in parts for x in p[k]] for k in mine}
    return accuracy_reward(**flat)[lo : lo + len(mine["completions"])]


def variants(call: dict[str, Any], old_package: str | None, raw_type: Any, load_old: Any) -> dict[str, Any]:
    """The variants of the ``trlcall`` payload (``bench_exchange``'s names); each synced one on its own backend."""
    raw = raw_type({k: call[k] for k in READ})
    main = synced_reward(mode="main", backend=TorchDistributedBackend())(accuracy_reward)
    main_ids = synced_reward(mode="main", backend=TorchDistributedBackend())(ids_reward)
    out: dict[str, Any] = {
        "direct": lambda: accuracy_reward(**call),
        "main": lambda: main(**call),
        "main_ids": lambda: main_ids(**call),
        "handrolled": lambda: handrolled(call),
        "dict_gather": lambda: dict_gather(call),
        "raw_to_root": raw.to_root,
        "raw_all_gather": raw.all_gather,
    }
    if old_package:
        old, Old = load_old(old_package)
        main_old = old.synced_reward(mode="main", backend=Old())(accuracy_reward)
        main_ids_old = old.synced_reward(mode="main", backend=Old())(ids_reward)
        out["main_old"] = lambda: main_old(**call)
        out["main_ids_old"] = lambda: main_ids_old(**call)
    out["_raw"] = raw  # not a variant: its frame size
    return out
