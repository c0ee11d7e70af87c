"""The gloo primitives syncreward's torch backend could use, timed against each other in one launch.

Usage (from the repository root)::

    python benchmarks/probe_gloo.py --world-sizes 2 4 16 --rounds 200

Every rank builds a ``ProcessGroupGloo`` over a ``PrefixStore`` of the job's store, as the backend does,
and each round runs every probe once (a fresh order each round, alike on every rank; a barrier on another group
before each). A probe's time is the slowest rank's. Probes (``cap``: a result block, ``CHECK``: a
40-byte call-check record):

* ``a2a_hdr_slice`` / ``a2a_hdr_plain``: a header-sized ``alltoallv`` (every rank a 296-byte row to every
  rank), waited for in 20 ms slices (``work.wait(timeout)``, what the backend does) vs one plain
  ``work.wait()``: what the sliced wait costs;
* ``a2a_16k``: the W=2 ``trl16`` inbound exchange's size (16 KiB to every rank);
* ``scatter_cap``: rank 0 sends each rank a ``cap`` block (main mode's outbound after an inbound exchange);
* ``hit_a2a``: a reward group hit today: one ``alltoallv`` in which every rank sends every rank a CHECK,
  rank 0's with its ``cap`` block;
* ``hit_gather_scatter``: a ``gather`` of CHECKs to rank 0, then a ``scatter`` of ``cap`` blocks (rank 0
  decides from every record and says its verdict in each block);
* ``hit_allgather``: one ``allgather`` of CHECK rows, then a ``scatter`` of the blocks;
* ``hit_allgather_rows``: one ``allgather`` of rows of CHECK + W x cap (rank 0's row holds every block).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

CHECK = 40
HDR = 296


def rank_main(rank: int, w: int, cfg: dict[str, Any]) -> dict[str, list[int]]:
    import torch
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    torch.set_num_threads(1)
    store = _get_default_store()
    g = dist.ProcessGroupGloo(dist.PrefixStore("probe/", store), rank, w, datetime.timedelta(seconds=120))
    align = dist.new_group(backend="gloo")
    cap = cfg["cap"]
    slice_s = datetime.timedelta(seconds=0.02)

    def wait_sliced(work: Any) -> None:
        while True:
            try:
                work.wait(slice_s)
                return
            except RuntimeError as e:
                if "timed out" not in str(e):
                    raise

    def a2a(send_counts: list[int], recv_counts: list[int], plain: bool = False) -> torch.Tensor:
        out = torch.empty(sum(recv_counts), dtype=torch.uint8)
        send = torch.zeros(sum(send_counts), dtype=torch.uint8)
        work = g.alltoall_base(out, send, recv_counts, send_counts, dist.AllToAllOptions())
        if plain:
            work.wait()
        else:
            wait_sliced(work)
        return out

    def scatter(size: int) -> torch.Tensor:
        out = torch.empty(size, dtype=torch.uint8)
        opts = dist.ScatterOptions()
        opts.rootRank = 0
        inputs = [list(torch.zeros(size * w, dtype=torch.uint8).split(size))] if rank == 0 else []
        wait_sliced(g.scatter([out], inputs, opts))
        return out

    def gather(size: int) -> None:
        opts = dist.GatherOptions()
        opts.rootRank = 0
        outs = [[torch.empty(size, dtype=torch.uint8) for _ in range(w)]] if rank == 0 else []
        wait_sliced(g.gather(outs, [torch.zeros(size, dtype=torch.uint8)], opts))

    def allgather(size: int) -> None:
        outs = [[torch.empty(size, dtype=torch.uint8) for _ in range(w)]]
        wait_sliced(g.allgather(outs, [torch.zeros(size, dtype=torch.uint8)]))

    def hit_a2a() -> None:
        extra = cap if rank == 0 else 0
        send = [0 if d == rank else CHECK + extra for d in range(w)]
        recv = [0 if s == rank else CHECK + (cap if s == 0 else 0) for s in range(w)]
        a2a(send, recv)

    from syncreward.backends.torch_distributed import TorchDistributedBackend

    backend = TorchDistributedBackend()
    hdr_rows = np.zeros(HDR * w, dtype=np.uint8)

    def a2a_like_backend() -> np.ndarray:
        out = torch.empty(HDR * w, dtype=torch.uint8)
        opts = dist.AllToAllOptions()
        opts.timeout = datetime.timedelta(seconds=130)
        work = g.alltoall_base(out, torch.from_numpy(hdr_rows), [HDR] * w, [HDR] * w, opts)
        wait_sliced(work)
        return out.numpy()

    probes = {
        "a2a_hdr_numpy": a2a_like_backend,
        "a2a_hdr_backend": lambda: backend.all_to_all(hdr_rows, [HDR] * w, [HDR] * w, channel=0, timeout=120.0),
        "a2a_hdr_slice": lambda: a2a([HDR] * w, [HDR] * w),
        "a2a_hdr_plain": lambda: a2a([HDR] * w, [HDR] * w, plain=True),
        "a2a_16k": lambda: a2a(
            [HDR + (16 << 10) if d == 0 and rank else HDR for d in range(w)],
            [HDR + (16 << 10) if rank == 0 and s else HDR for s in range(w)],
        ),
        "scatter_cap": lambda: scatter(cap),
        "hit_a2a": hit_a2a,
        "hit_gather_scatter": lambda: (gather(CHECK), scatter(cap)),
        "hit_allgather": lambda: (allgather(CHECK), scatter(cap)),
        "hit_allgather_rows": lambda: allgather(CHECK + w * cap),
    }
    names = [n for n in probes if not cfg["probes"] or n in cfg["probes"]]
    for _ in range(cfg["warmup"]):
        for n in names:
            dist.barrier(group=align)
            probes[n]()
    times: dict[str, list[int]] = {n: [] for n in names}
    for r in range(cfg["rounds"]):
        if r % 20 == 0:
            gc.collect()
        for n in random.Random(r).sample(names, len(names)):  # a fresh order each round, alike on every rank
            dist.barrier(group=align)
            t0 = time.perf_counter_ns()
            probes[n]()
            times[n].append(time.perf_counter_ns() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--cap", type=int, default=640, help="result block bytes (64 float results + chunk header)")
    ap.add_argument("--probes", nargs="*", default=[])
    args = ap.parse_args()
    from syncreward.testing import run_ranks

    for w in args.world_sizes:
        load = Path("/proc/loadavg").read_text().split()[:3]
        ranks = run_ranks(rank_main, w, vars(args), timeout=1800, env={"OMP_NUM_THREADS": "1"})
        after = Path("/proc/loadavg").read_text().split()[:3]
        print(f"\nW={w} rounds={args.rounds} cap={args.cap} load before {load} after {after}")
        print(f"  {'probe':<22}{'median us':>10}{'p25':>8}{'p75':>8}")
        per = {n: np.max(np.array([r[n] for r in ranks]), axis=0) / 1e3 for n in ranks[0]}
        for n, a in per.items():
            print(f"  {n:<22}{np.median(a):10.0f}{np.percentile(a, 25):8.0f}{np.percentile(a, 75):8.0f}")
        if "hit_a2a" in per:
            for n in ("hit_gather_scatter", "hit_allgather", "hit_allgather_rows", "scatter_cap"):
                if n in per:
                    print(f"  paired {n} / hit_a2a: {np.median(per[n] / per['hit_a2a']):.2f}x")
        if "a2a_hdr_slice" in per and "a2a_hdr_plain" in per:
            ratio = np.median(per["a2a_hdr_slice"] / per["a2a_hdr_plain"])
            print(f"  paired a2a_hdr_slice / a2a_hdr_plain: {ratio:.2f}x")


if __name__ == "__main__":
    main()
