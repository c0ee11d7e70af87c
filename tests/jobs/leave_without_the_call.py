"""One rank of a 2-rank gloo job where rank 1 leaves without making a synced call that rank 0 makes.

``python leave_without_the_call.py <how> <out dir>``, with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set
(as a launcher sets them). ``how`` says how rank 1 leaves: ``returns`` (its script ends, the default
group still there), ``destroys`` (``dist.destroy_process_group()`` first, as the README ends a script),
``raises`` (an uncaught exception outside syncreward), ``after_its_call`` (it makes the first synced call,
then ends with ``destroy_process_group()``: rank 0's first call must work, its second must not wait).
Rank 0 writes what its calls did to ``<out dir>/rank0.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch.distributed as dist

from syncreward import synced_reward


def plain(completions, **kwargs):
    return [float(len(c)) for c in completions]


def outcome(fn, *args):
    t0 = time.perf_counter()
    try:
        return {"kind": "ok", "value": fn(*args), "s": time.perf_counter() - t0}
    except Exception as e:
        return {"kind": type(e).__name__, "msg": str(e), "s": time.perf_counter() - t0}


def main() -> None:
    how, out = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # decorated once the job is up: syncreward sees the job on every rank
    reward = synced_reward(timeout=float(os.environ.get("LEAVE_TIMEOUT", "120")))(plain)
    comps = [f"r{rank}s{i}" for i in range(rank + 1)]
    if rank == 1:
        if how == "after_its_call":
            outcome(reward, comps)  # from the same place as rank 0's call: the calls pair
        if how in ("destroys", "after_its_call"):
            dist.destroy_process_group()
        if how == "raises":
            raise ValueError("rank 1 broke outside syncreward")
        return
    result = {}
    if how == "after_its_call":
        result["first"] = outcome(reward, comps)
        time.sleep(1.0)  # rank 1 has left by now
    result["call"] = outcome(reward, comps)
    result["after"] = outcome(reward, comps)
    with open(os.path.join(out, "rank0.json"), "w") as f:
        json.dump(result, f)
    # rank 0 hosts the store: the process ends without destroy_process_group (a gloo group whose peer is gone)


if __name__ == "__main__":
    main()
