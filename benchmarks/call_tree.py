"""How many Python and C calls one synced ``mode="main"`` call makes on each rank, as a tree.

Usage (from the repository root)::

    python benchmarks/call_tree.py                       # W=2, 16 per rank, the top 2 levels
    python benchmarks/call_tree.py --depth 8 --min 3     # deeper, calls made at least 3 times

Every rank makes a few warm-up calls, then one call from a new call site under ``sys.setprofile``
(Python calls and C calls alike, the reward's own included), and prints the calls under each function
with how many calls each subtree made. Unlike cProfile's totals (``bench_exchange.py --row calls``) it
counts C calls (``len``, ``struct.pack``, numpy) too, and shows where in the call they happen. Between
two synced calls other code runs, so each call's Python runs with cold caches: the number of calls is a
steadier guide to its cost than a tight-loop timing (docs/internals.md, "Where a W=2 call's time goes").
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def rank_main(rank: int, world_size: int, payload: str) -> tuple[int, dict[tuple[str, ...], int]]:
    import torch
    from _bench_ranks import reward
    from _payloads import make_batch

    from syncreward import synced_reward
    from syncreward.backends.torch_distributed import TorchDistributedBackend

    torch.set_num_threads(1)
    batch = make_batch(payload, rank, world_size)
    fn = synced_reward(mode="main", backend=TorchDistributedBackend())(reward)
    for _ in range(5):
        fn(**batch)
    stack: list[str] = []
    counts: collections.Counter[tuple[str, ...]] = collections.Counter()
    total = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal total
        if event in ("call", "c_call"):
            code = frame.f_code
            name = (
                f"{code.co_name} ({Path(code.co_filename).name})"
                if event == "call"
                else f"<{getattr(arg, '__qualname__', getattr(arg, '__name__', '?'))}>"
            )
            stack.append(name)
            total += 1
            for depth in range(1, len(stack) + 1):
                counts[tuple(stack[:depth])] += 1
        elif event in ("return", "c_return", "c_exception") and stack:
            stack.pop()

    sys.setprofile(profile)
    fn(**batch)  # (a new call site: its first call also reads the site)
    sys.setprofile(None)
    return total, dict(counts)


def show(counts: dict[tuple[str, ...], int], depth: int, least: int) -> list[str]:
    lines: list[str] = []

    def walk(prefix: tuple[str, ...], indent: int) -> None:
        kids = sorted(
            ((k, v) for k, v in counts.items() if len(k) == len(prefix) + 1 and k[: len(prefix)] == prefix),
            key=lambda kv: -kv[1],
        )
        for key, n in kids:
            if n >= least:
                lines.append(f"{'  ' * indent}{n:5d} {key[-1]}")
                if len(key) < depth:
                    walk(key, indent + 1)

    walk((), 0)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--payload", default="trl16")
    ap.add_argument("--depth", type=int, default=3, help="levels of the tree shown (the wrapper is level 1)")
    ap.add_argument("--min", type=int, default=3, help="hide subtrees that made fewer calls")
    args = ap.parse_args()
    from syncreward.testing import run_ranks

    ranks = run_ranks(rank_main, args.world_size, args.payload, timeout=300)
    for rank, (total, counts) in enumerate(ranks):
        print(f"== rank {rank}: {total} calls (Python and C) in one synced call, W={args.world_size} {args.payload}")
        print("\n".join(show(counts, args.depth, args.min)))


if __name__ == "__main__":
    main()
