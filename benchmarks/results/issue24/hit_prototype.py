"""Scratch prototype (not library code): a reward group's hit exchanging its results three ways, W ranks.

Run from the repository root: ``PYTHONPATH=$PWD python benchmarks/results/issue24/hit_prototype.py 4 60``.
Variants, interleaved in one launch (fresh order each round, barrier before each call, slowest rank):

* ``step3_group``: today, every hit's blocks ride in an ``alltoallv`` with every rank's check record;
* ``step3_group_scatter``: every hit's blocks in one ``scatter`` from rank 0 and no check records: the
  pre-check design, the floor of any design that keeps one collective a hit (it does *not* keep the
  "every rank raises" guarantee);
* ``step3_group_gather``: a ``gather`` of the 40-byte check records to rank 0, then the ``scatter``
  (rank 0 would put its verdict in every block; timed here without the comparison, which is local);
* ``handrolled``: the hand-rolled single reward of bench_exchange (the issue's baseline).
"""

import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/


def rank_main(rank, world_size, rounds):
    import torch
    import torch.distributed as dist
    from _bench_ranks import format_reward, handrolled, length_reward, reward
    from _payloads import make_batch

    import syncreward._modes.main as mm
    from syncreward import synced_rewards
    from syncreward._exchange import scatter
    from syncreward._wire import OUTBOUND, CallCheck
    from syncreward.backends.torch_distributed import TorchDistributedBackend

    torch.set_num_threads(1)
    today = mm._results_exchange
    how = ["a2a"]

    def patched(call, scoring, blocks, cap):
        if not scoring.shared or how[0] == "a2a":
            return today(call, scoring, blocks, cap)
        session = call.session
        if how[0] == "gather":
            group = session.backend._channel(OUTBOUND, call.timeout)
            opts = dist.GatherOptions()
            opts.rootRank = 0
            mine = torch.from_numpy(np.frombuffer(bytearray(call.check().pack()), dtype=np.uint8))
            outs = [[torch.empty(CallCheck.SIZE, dtype=torch.uint8) for _ in range(world_size)]] if rank == 0 else []
            session.backend._wait(group.gather(outs, [mine], opts), OUTBOUND, call.timeout)
        return scatter(session, blocks or b"", cap, 0, OUTBOUND, call.timeout), None

    mm._results_exchange = patched
    batch = make_batch("trl", rank, world_size)
    groups = {
        k: synced_rewards(reward, format_reward, length_reward, mode="main", backend=TorchDistributedBackend())
        for k in ("a2a", "scatter", "gather")
    }

    def step(k):
        def run():
            how[0] = k
            cols = {c: list(v) for c, v in batch.items()}
            out = [f(**cols) for f in groups[k]]
            how[0] = "a2a"
            return out[0]

        return run

    fns = {
        "step3_group": step("a2a"),
        "step3_group_scatter": step("scatter"),
        "step3_group_gather": step("gather"),
        "handrolled": lambda: handrolled(batch),
    }
    align = dist.new_group(backend="gloo")
    names = list(fns)
    results = {n: fns[n]() for n in names}
    assert all(results[n] == results["handrolled"] for n in names), "a variant scored wrongly"
    for _ in range(3):
        for n in names:
            dist.barrier(group=align)
            fns[n]()
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in random.Random(r).sample(names, len(names)):
            dist.barrier(group=align)
            t0 = time.perf_counter_ns()
            fns[n]()
            times[n].append(time.perf_counter_ns() - t0)
    return times


if __name__ == "__main__":
    from syncreward.testing import run_ranks

    w, rounds = int(sys.argv[1]), int(sys.argv[2])
    load = Path("/proc/loadavg").read_text().split()[:3]
    ranks = run_ranks(rank_main, w, rounds, timeout=1800, env={"OMP_NUM_THREADS": "1"})
    print(f"W={w} trl rounds={rounds} load before {load} after {Path('/proc/loadavg').read_text().split()[:3]}")
    per = {n: np.max(np.array([r[n] for r in ranks]), axis=0) / 1e6 for n in ranks[0]}
    for n, a in per.items():
        print(f"  {n:<22}{np.median(a):8.2f} ms  ({np.percentile(a, 25):.2f}-{np.percentile(a, 75):.2f})")
    for n in per:
        if n != "handrolled":
            print(
                f"  {n} / handrolled: {np.median(per[n]) / np.median(per['handrolled']):.3f}x, "
                f"paired {np.median(per[n] / per['handrolled']):.3f}x; / step3_group paired "
                f"{np.median(per[n] / per['step3_group']):.3f}x"
            )
