"""Benchmark: an expensive per-sample reward, unsynced vs synced whole (``main``) vs composed.

Usage (from the repository root)::

    python benchmarks/bench_expensive.py --world-sizes 2 4 8 --rounds 20

The reward is ``examples/expensive_reward.py``'s: a verifier that costs ``COST_S`` (4 ms, ``time.sleep``:
I/O-bound, like a sandbox or judge round trip, so the machine's core count does not limit it) per
completion, then a normalisation over the global batch. For each world size W this launches W local gloo
ranks *once* (``syncreward.testing.run_ranks``), each holding ``--per-rank`` completions, and runs
``--rounds`` rounds in which every variant is called once, in an order rotated by one each round, with a
barrier before each call. A call's latency is the slowest rank's time inside it. Variants:

=================  ======================================================================================
``unsynced``       verify and normalise this rank's completions only: the floor, and the wrong result
``main``           the whole reward under ``@synced_reward(mode="main")``: rank 0 verifies the global batch
``composed``       verify locally, then ``normalise_synced`` (``mode="main"``): the guide's pattern
``composed_repl``  verify locally, then the same combine in ``mode="replicate"`` (every rank combines)
=================  ======================================================================================

Before timing, every rank checks that ``composed`` and ``composed_repl`` return exactly (``==``) what
``main`` returns, and that ``unsynced`` does not. Prints per-call medians and the ratios
composed/unsynced and composed/main; ``--out`` writes the raw times as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))  # the example is a plain script; spawned ranks inherit sys.path

import expensive_reward as ex  # noqa: E402

from syncreward import synced_reward  # noqa: E402
from syncreward.testing import run_ranks  # noqa: E402

normalise_replicate = synced_reward(mode="replicate")(ex.normalise)

VARIANTS = ("unsynced", "main", "composed", "composed_repl")


def _composed_replicate(completions: list[str], solution: list[str], **kwargs: Any) -> list[float | None]:
    scores = [ex.verify(c, s) for c, s in zip(completions, solution, strict=True)]
    return normalise_replicate(scores=scores)


def _variants(mine: dict[str, list[str]]) -> dict[str, Callable[[], Any]]:
    return {
        "unsynced": lambda: ex.normalise(
            [ex.verify(c, s) for c, s in zip(mine["completions"], mine["solution"], strict=True)]
        ),
        "main": lambda: ex.verified_reward_main(**mine),
        "composed": lambda: ex.verified_reward(**mine),
        "composed_repl": lambda: _composed_replicate(**mine),
    }


def rank_main(rank: int, world_size: int, per_rank: int, rounds: int, warmup: int) -> dict[str, Any]:
    import torch.distributed as dist

    assert per_rank % ex.K == 0
    batch = ex.make_batch(num_prompts=per_rank * world_size // ex.K)
    mine = ex.local_slice(batch, rank, world_size)
    variants = _variants(mine)
    names = list(variants)
    out = {name: variants[name]() for name in names}  # the correctness pass (also the first warm-up)
    checks = {
        "composed == main": out["composed"] == out["main"],
        "composed_repl == main": out["composed_repl"] == out["main"],
        "unsynced != main": out["unsynced"] != out["main"],
    }
    for _ in range(warmup):
        for name in names:
            dist.barrier()
            variants[name]()
    times: dict[str, list[int]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        gc.collect()
        for name in names[k:] + names[:k]:
            dist.barrier()  # the default group: syncreward exchanges over its own groups
            t0 = time.perf_counter_ns()
            variants[name]()
            times[name].append(time.perf_counter_ns() - t0)
    return {"checks": checks, "times": times, "n_local": len(mine["completions"])}


def summarise(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Per call, the slowest rank's time; per variant, the median (and p10/p90) of those, in ms."""
    rounds = len(parts[0]["times"]["main"])
    slowest = {v: [max(p["times"][v][i] for p in parts) / 1e6 for i in range(rounds)] for v in VARIANTS}
    stats = {}
    for v, xs in slowest.items():
        q = statistics.quantiles(xs, n=10) if len(xs) >= 2 else [xs[0]] * 9
        stats[v] = {"median": statistics.median(xs), "p10": q[0], "p90": q[-1]}
    med = {v: s["median"] for v, s in stats.items()}
    return {
        "stats": stats,
        "ratios": {
            "composed/unsynced": med["composed"] / med["unsynced"],
            "composed/main": med["composed"] / med["main"],
            "composed_repl/unsynced": med["composed_repl"] / med["unsynced"],
            "main/unsynced": med["main"] / med["unsynced"],
        },
        "checks": {k: all(p["checks"][k] for p in parts) for k in parts[0]["checks"]},
        "slowest_ms": slowest,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[4])
    parser.add_argument("--per-rank", type=int, default=16, help="completions per rank (a multiple of 4)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600, help="seconds for one launch, start-up included")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    print(
        f"{platform.node()}: {os.cpu_count()} cores, python {platform.python_version()}; "
        f"{args.per_rank} completions per rank, {ex.COST_S * 1e3:g} ms each (time.sleep), "
        f"{args.rounds} rounds after {args.warmup} warm-up; ms per call, slowest rank"
    )
    results: dict[str, Any] = {"per_rank": args.per_rank, "cost_s": ex.COST_S, "rounds": args.rounds, "world_sizes": {}}
    ok = True
    for w in args.world_sizes:
        parts = run_ranks(rank_main, w, args.per_rank, args.rounds, args.warmup, timeout=args.timeout)
        res = summarise(parts)
        results["world_sizes"][str(w)] = res
        print(f"\nW={w} ({w * args.per_rank} completions in the global batch)")
        print(f"  {'variant':<14} {'median':>8} {'p10':>8} {'p90':>8}")
        for v in VARIANTS:
            s = res["stats"][v]
            print(f"  {v:<14} {s['median']:8.1f} {s['p10']:8.1f} {s['p90']:8.1f}")
        print("  " + ", ".join(f"{k} {x:.2f}" for k, x in res["ratios"].items()))
        print("  checks: " + ", ".join(f"{k}: {x}" for k, x in res["checks"].items()))
        ok = ok and all(res["checks"].values())
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
