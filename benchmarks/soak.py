"""Soak: many synced calls on local gloo ranks; does anything grow that should not?

    python benchmarks/soak.py                      # 10,000 calls on 2 ranks
    python benchmarks/soak.py --calls 300 --json /tmp/soak.json

Every rank warms up first (syncreward's gloo groups, the executor's threads, size predictions and
allocator pools all settle), then measures its resident set size, open file descriptors, threads and
``torch.distributed`` process groups, makes ``--calls`` synced calls, and measures again. The calls
cycle through every path: ``main`` with strings and token ids, ``replicate`` returning a dict with a
tensor, ``shard`` by ``group_size``, two concurrent ``async`` calls on a fresh event loop, ``log_extra``
/ ``log_metric`` replay, a reply that outgrows its predicted size, and every 97th call one that raises
on one rank (the error path). Batch sizes vary per call and differ between ranks.

The goal (docs/reliability.md): RSS growth under 20 MB over 10,000 calls, and no growth at all in file
descriptors, threads or process groups. The exit status is 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import threading
import time
from typing import Any

import torch

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks

GOAL_RSS_MB = 20.0


# --------------------------------------------------------------------------------------------- rewards


def lengths(completions: Any, completion_ids: Any, **kwargs: Any) -> list[float]:
    mean = sum(map(len, completions)) / max(len(completions), 1)
    return [len(c) - mean + len(ids) / 100 for c, ids in zip(completions, completion_ids, strict=True)]


def as_dict(completions: Any, feats: Any, **kwargs: Any) -> dict[str, Any]:
    return {"len": [float(len(c)) for c in completions], "feat": feats.sum(dim=1) / max(len(completions), 1)}


def group_relative(completions: Any, **kwargs: Any) -> list[float]:
    out: list[float] = []
    for g in range(0, len(completions), 4):
        grp = completions[g : g + 4]
        mean = sum(map(len, grp)) / len(grp)
        out += [len(c) - mean for c in grp]
    return out


def logging(completions: Any, log_extra: Any, log_metric: Any, **kwargs: Any) -> list[float]:
    log_extra("len", [len(c) for c in completions])
    log_metric("batch", float(len(completions)))
    return [0.0] * len(completions)


def big_reply(completions: Any, **kwargs: Any) -> list[str]:
    return ["y" * (50 + 400 * (i % 3)) for i in range(len(completions))]  # varies: outgrows predictions


def raising(completions: Any, **kwargs: Any) -> list[float]:
    if os.environ["RANK"] == "1":
        raise ValueError("soak: judge failed")
    return [0.0] * len(completions)


async def async_len(completions: Any, **kwargs: Any) -> list[float]:
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


async def async_ids(completions: Any, completion_ids: Any, **kwargs: Any) -> list[float]:
    await asyncio.sleep(0)
    return [float(sum(ids)) for ids in completion_ids]


main_lengths = synced_reward(lengths)
replicate_dict = synced_reward(mode="replicate")(as_dict)
shard_groups = synced_reward(mode="shard", group_size=4)(group_relative)
main_logging = synced_reward(logging)
main_big = synced_reward(big_reply)
main_raising = synced_reward(mode="replicate")(raising)
async_a = synced_reward(async_len)
async_b = synced_reward(mode="replicate")(async_ids)


# --------------------------------------------------------------------------------------------- measuring


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def snapshot() -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    gc.collect()
    return {
        "rss_mb": _status("VmRSS") / 1024,
        "fds": len(os.listdir("/proc/self/fd")),
        "threads_os": _status("Threads"),
        "threads_py": threading.active_count(),
        # the workers that run async calls' steps: one per step running at once (steps run only in their
        # turn: at most two per backend); up to _workers.POOL.keep idle ones stay, the others end when idle
        "threads_pool": sum(t.name.startswith("syncreward") for t in threading.enumerate()),
        "process_groups": len(distributed_c10d._world.pg_map) if dist.is_initialized() else 0,
        "syncreward_links": len(sys.modules["syncreward._session"]._sessions)
        + len(sys.modules["syncreward._session"]._strong),
    }


def one_call(i: int, rank: int) -> tuple[int, int]:
    """Make the i-th call (or two); return (calls made, errors seen)."""
    n = 4 * (1 + (i + rank) % 4)  # 4..16 samples, different on each rank, a multiple of the group size
    comps = [f"r{rank}c{i}-{j}-" + "x" * ((i * 7 + j) % 200) for j in range(n)]
    ids = [list(range((i + j) % 50)) for j in range(n)]
    kind = i % 6
    if i % 97 == 96:
        try:
            main_raising(comps)
        except (ValueError, syncreward.RemoteError):
            return 1, 1
        raise AssertionError("the raising reward did not raise")
    if kind == 0:
        main_lengths(comps, ids)
    elif kind == 1:
        replicate_dict(comps, torch.ones(n, 8))
    elif kind == 2:
        shard_groups(comps)
    elif kind == 3:

        async def both() -> None:
            await asyncio.gather(async_a(comps), async_b(comps, ids))

        asyncio.run(both())
        return 2, 0
    elif kind == 4:
        main_logging(comps, log_extra=lambda *a: None, log_metric=lambda *a: None)
    else:
        main_big(comps)
    return 1, 0


def soak_body(rank: int, world_size: int, calls: int, warmup: int, sample_every: int) -> dict[str, Any]:
    for i in range(warmup):
        one_call(i, rank)
    before = snapshot()
    samples = [(0, before["rss_mb"])]
    made = errors = 0
    t0 = time.perf_counter()
    i = warmup
    while made < calls:
        m, e = one_call(i, rank)
        made, errors, i = made + m, errors + e, i + 1
        if sample_every and made // sample_every != (made - m) // sample_every:
            samples.append((made, _status("VmRSS") / 1024))
    seconds = time.perf_counter() - t0
    after = snapshot()
    return {
        "rank": rank,
        "calls": made,
        "errors_seen": errors,
        "seconds": seconds,
        "calls_per_s": made / seconds,
        "before": before,
        "after": after,
        "growth": {k: after[k] - before[k] for k in before},
        "pool_max_workers": sys.modules["syncreward._workers"].POOL.keep,  # idle workers it keeps
        "rss_samples_mb": samples,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=10_000, help="synced calls per rank after the warm-up")
    p.add_argument("--warmup", type=int, default=300, help="calls before the 'before' snapshot")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--sample-every", type=int, default=1000, help="record RSS every this many calls")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--json", help="write the per-rank report here")
    args = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    reports = run_ranks(soak_body, args.world_size, args.calls, args.warmup, args.sample_every, timeout=args.timeout)
    wall = time.perf_counter() - t0
    ok = True
    print(
        f"soak: {args.calls} synced calls per rank on {args.world_size} ranks in {wall:.1f}s "
        f"(after {args.warmup} warm-up calls)"
    )
    for r in reports:
        g, b, a = r["growth"], r["before"], r["after"]
        print(
            f"  rank {r['rank']}: {r['calls_per_s']:.0f} calls/s, {r['errors_seen']} error-path calls | "
            f"RSS {b['rss_mb']:.1f} -> {a['rss_mb']:.1f} MB ({g['rss_mb']:+.1f}) | fds {b['fds']} -> {a['fds']} | "
            f"threads {b['threads_os']} -> {a['threads_os']} (of them syncreward's async pool "
            f"{b['threads_pool']} -> {a['threads_pool']}) | "
            f"process groups {b['process_groups']} -> {a['process_groups']}"
        )
        print("    RSS by calls: " + ", ".join(f"{c}: {m:.1f}" for c, m in r["rss_samples_mb"]))
        leaks = [k for k in ("fds", "process_groups", "syncreward_links") if g[k] > 0]
        if g["threads_os"] - g["threads_pool"] > 0 or g["threads_py"] - g["threads_pool"] > 0:
            leaks.append("threads (outside the async pool)")
        if a["threads_pool"] > r["pool_max_workers"]:
            leaks.append("async pool beyond max_workers")
        if g["rss_mb"] >= GOAL_RSS_MB or leaks:
            ok = False
            print(f"    MISSED: RSS growth {g['rss_mb']:.1f} MB (goal < {GOAL_RSS_MB}), growing: {leaks or 'nothing'}")
    print("goal met: RSS growth < 20 MB, no fd/thread/process-group growth" if ok else "goal MISSED")
    print("(the async pool adds a thread per exchange in flight beyond its idle ones; it keeps at most 16 idle)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"calls": args.calls, "world_size": args.world_size, "wall_s": wall, "ranks": reports}, f, indent=1
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
