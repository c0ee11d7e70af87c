"""Time for every rank to raise when a synced function raises on one of W ranks.

    python benchmarks/time_to_error.py --world-size 3 --repeats 10

For each mode the function raises on one rank (the scoring rank 0 in main mode, rank W-1 in the
others); every rank records how long its call took to raise. Prints the max over ranks per repeat.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from syncreward import synced_reward
from syncreward.testing import run_ranks


def boom(completions, **kwargs):
    if os.environ["RANK"] == os.environ["FAIL_RANK"]:
        raise ValueError("judge failed")
    return [0.0] * len(completions)


def body(rank: int, world_size: int, repeats: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    completions = ["x" * 100] * 16
    for mode in ("main", "replicate", "shard"):
        opts = {"group_size": 4} if mode == "shard" else {}
        f = synced_reward(mode=mode, **opts)(boom)  # type: ignore[call-overload]
        os.environ["FAIL_RANK"] = "0" if mode == "main" else str(world_size - 1)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            try:
                f(completions)
            except Exception:
                times.append(time.perf_counter() - t0)
            else:
                raise AssertionError("did not raise")
        out[mode] = times
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    results = run_ranks(body, args.world_size, args.repeats, timeout=300)
    print(f"time for every rank to raise, W={args.world_size}, {args.repeats} repeats (ms)")
    for mode in results[0]:
        worst = [max(r[mode][i] for r in results) * 1e3 for i in range(args.repeats)]
        print(f"  {mode:9s} median {statistics.median(worst):7.2f}  max {max(worst):7.2f}")


if __name__ == "__main__":
    main()
