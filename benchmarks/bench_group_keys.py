"""The per-rank CPU cost of ``mode="shard", group_by=...``'s key exchange: old (the column) vs new (digests).

What one rank does with the group keys of one call, the collectives left out (their count is the same):

* ``old`` (wire version 3): encode its ``group_by`` column as a frame; decode every rank's frame (W of
  them) and ``tolist()`` the values; assign the groups. Conversational prompts are refused there.
* ``new``: digest each of its samples' values (:func:`syncreward._modes.shard.group_keys`, 16 bytes each);
  split every rank's digests; assign the groups.

Both run interleaved in one process (a rotating order, many rounds), on the same columns: int prompt ids,
plain-string prompts (~450 characters, K=4 completions per prompt) and TRL conversational prompts (a system
and a user message). It prints the minimum and median per call (on a loaded machine the minimum is the
steadier figure) and the bytes each rank sends to every rank.

    python benchmarks/bench_group_keys.py                 # 64 samples per rank, W = 2, 4, 8
    python benchmarks/bench_group_keys.py --rows 512 --world 4
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from syncreward._codec import C_LIST, Column, decode_frame, encode_frame  # noqa: E402
from syncreward._modes.shard import KEY_BYTES, assign_by_key, group_keys  # noqa: E402


def columns(rows: int, k: int = 4) -> dict[str, list[Any]]:
    text = [f"question {g}: " + "solve for x in the equation " * 15 for g in range(rows // k + 1)]
    system = {"role": "system", "content": "Answer briefly."}
    return {
        "int ids": [i // k for i in range(rows)],
        "plain prompts": [text[i // k] for i in range(rows)],
        "conversational prompts": [[dict(system), {"role": "user", "content": text[i // k]}] for i in range(rows)],
    }


def old(values: list[Any], world: int) -> int:
    """The wire-version-3 path: the column travels; every rank decodes all of them (here: W copies of ours)."""
    frame = bytes(encode_frame([Column("k", C_LIST, values)], len(values)))
    keys: list[Any] = []
    for _ in range(world):
        _, cols, _ = decode_frame(frame)
        keys.extend(cols[0].values)
    assign_by_key(keys, world, "k")
    return len(frame)


def new(values: list[Any], world: int) -> int:
    blob = group_keys(values, C_LIST, "k")
    keys: list[bytes] = []
    for _ in range(world):
        keys.extend(blob[i : i + KEY_BYTES] for i in range(0, len(blob), KEY_BYTES))
    assign_by_key(keys, world, "k")
    return len(blob)


def measure(variants: dict[str, Callable[[], int]], rounds: int) -> dict[str, tuple[float, float, int]]:
    times: dict[str, list[float]] = {v: [] for v in variants}
    sizes = {v: fn() for v, fn in variants.items()}
    names = list(variants)
    for r in range(rounds):
        gc.collect()
        for v in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            variants[v]()
            times[v].append(time.perf_counter() - t0)
    return {v: (min(ts) * 1e3, statistics.median(ts) * 1e3, sizes[v]) for v, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64, help="samples per rank")
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    print(
        f"| column ({args.rows} rows per rank) | W | old ms (min / median) | new ms (min / median) | new / old (min) "
        "| bytes sent, old | new |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, values in columns(args.rows).items():
        for w in args.world:
            variants: dict[str, Callable[[], int]] = {"new": lambda v=values, w=w: new(v, w)}
            try:
                old(values, w)
                variants["old"] = lambda v=values, w=w: old(v, w)
            except Exception as e:  # conversational prompts: refused before
                refused = type(e).__name__
            res = measure(variants, args.rounds)
            if "old" in res:
                o, om, ob = res["old"]
                n, nm, nb = res["new"]
                print(f"| {name} | {w} | {o:.3f} / {om:.3f} | {n:.3f} / {nm:.3f} | {n / o:.2f} | {ob:,} | {nb:,} |")
            else:
                n, nm, nb = res["new"]
                print(f"| {name} | {w} | ({refused}) | {n:.3f} / {nm:.3f} | - | - | {nb:,} |")


if __name__ == "__main__":
    main()
