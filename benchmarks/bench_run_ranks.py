"""Benchmark: how long ``syncreward.testing.run_ranks`` takes to run a trivial body, spawned or forked.

Usage (from the repository root)::

    python benchmarks/bench_run_ranks.py --world-sizes 2 4 --rounds 5

Each round runs, for every world size, ``run_ranks`` once with ``start_method="spawn"`` and once with
``"forkserver"``, in alternating order, on a body that joins the gloo group, makes one ``all_reduce`` and
returns. The first ``"forkserver"`` call starts the fork server (it imports torch once): that start is
printed on its own and left out of the medians. A test suite pays the first once per session.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from syncreward.testing import run_ranks


def body(rank: int, world_size: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank])
    dist.all_reduce(t)
    return int(t)


def _timed(world_size: int, method: str) -> float:
    t0 = time.perf_counter()
    got = run_ranks(body, world_size, start_method=method, timeout=300)
    took = time.perf_counter() - t0
    assert got == [sum(range(world_size))] * world_size, got
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, python {sys.version.split()[0]}, load {os.getloadavg()}")
    print(f"fork server start (first forkserver run_ranks, W={args.world_sizes[0]}): "
          f"{_timed(args.world_sizes[0], 'forkserver'):.2f} s")  # fmt: skip
    times: dict[tuple[int, str], list[float]] = {}
    for r in range(args.rounds):
        for w in args.world_sizes:
            order = ["spawn", "forkserver"] if r % 2 == 0 else ["forkserver", "spawn"]
            for method in order:
                times.setdefault((w, method), []).append(_timed(w, method))
    print(f"{'W':>3}  {'spawn s':>9}  {'forkserver s':>12}  {'ratio':>6}   (medians of {args.rounds} rounds)")
    for w in args.world_sizes:
        spawn, fork = statistics.median(times[(w, "spawn")]), statistics.median(times[(w, "forkserver")])
        print(f"{w:>3}  {spawn:>9.2f}  {fork:>12.3f}  {spawn / fork:>5.0f}x")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
