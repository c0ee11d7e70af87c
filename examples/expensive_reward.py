"""An expensive per-sample reward with a global combine: score locally, then combine synced.

A code-execution verifier runs each completion against its tests in a sandbox (4 ms a completion here);
the reward is that score standardised over the whole generation batch. Decorating the whole reward with
``@synced_reward`` (``mode="main"``) is correct but makes rank 0 verify every rank's completions while the
others wait: ``num_processes`` times the unsynced time. The verifier's score of one completion does not
depend on the others, so each rank verifies its own completions, unsynced and in parallel, and only the
per-sample scores go through a synced combine (``normalise_synced``). The result is exactly what the
whole reward synced in ``mode="main"`` returns.

The combine is ``mode="main"`` (the default): only rank 0 receives the scores, normalises them, and sends
each rank its slice. ``mode="replicate"`` is as correct for a cheap deterministic combine, but every rank
then receives every rank's scores; measured (``benchmarks/bench_expensive.py``), it was no faster. The
synced call made from inside the plain ``verified_reward`` is an ordinary synced call: every rank makes it
once per reward call, from the same line, so the calls pair across ranks as any synced reward's do.

Run: ``python examples/expensive_reward.py`` (2 local CPU ranks) or ``--ranks 4``. It prints the rewards,
checks them, and times the three variants (unsynced, which is wrong; synced whole; composed): the median of
``--rounds`` calls on the slowest rank.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from syncreward import synced_reward

COST_S = 0.004  # the sandbox round trip per completion (I/O: the ranks wait, their CPUs do not)


def run_tests(completion: str, solution: str) -> float:
    """Stub sandbox: runs the completion against its tests. Swap in your sandbox client.

    Raises ``TimeoutError`` for a program that does not finish (the sandbox's own time limit).
    """
    time.sleep(COST_S)
    if "while True" in completion:
        raise TimeoutError("sandbox: time limit exceeded")
    numbers = re.findall(r"-?\d+", completion)
    passed = 1.0 if numbers and numbers[-1] == solution.strip() else 0.0
    return passed - 0.002 * len(completion)  # a small brevity term, so that scores differ


def verify(completion: str, solution: str) -> float | None:
    """One completion's score, or ``None`` if the sandbox could not score it (TRL turns ``None`` into NaN).

    Only the sandbox's own, per-sample failures are caught: one unscorable completion must not end a
    long run. A bug (a ``TypeError``) still raises.
    """
    try:
        return run_tests(completion, solution)
    except (TimeoutError, ConnectionError):
        return None


def normalise(scores: list[float | None]) -> list[float | None]:
    """Scores standardised with their mean and standard deviation; ``None`` stays ``None``."""
    known = [s for s in scores if s is not None]
    if not known:
        return [None] * len(scores)
    mean = sum(known) / len(known)
    std = math.sqrt(sum((s - mean) ** 2 for s in known) / len(known))
    return [None if s is None else (s - mean) / (std + 1e-6) for s in scores]


@synced_reward  # mode="main": rank 0 combines, each rank gets its slice back
def normalise_synced(scores: list[float | None], **kwargs: Any) -> list[float | None]:
    """The global combine: sees every rank's scores, in rank order; returns this rank's normalised ones."""
    return normalise(scores)


def verified_reward(completions: list[str], solution: list[str], **kwargs: Any) -> list[float | None]:
    """The TRL reward: verify this rank's completions locally, then normalise over the global batch."""
    scores = [verify(c, s) for c, s in zip(completions, solution, strict=True)]
    # trainer_state (shared, not per-sample) lets the combine check that every rank is at the same step
    return normalise_synced(scores=scores, trainer_state=kwargs.get("trainer_state"))


@synced_reward(mode="main")
def verified_reward_main(completions: list[str], solution: list[str], **kwargs: Any) -> list[float | None]:
    """The same reward synced whole: rank 0 verifies the global batch while the other ranks wait.

    Correct, and ``num_processes`` times slower than ``verified_reward``; here for comparison only. (The
    ``normalise_synced`` call inside it is a plain call: inside a synced call the data is already global.)
    """
    return normalise_synced(scores=[verify(c, s) for c, s in zip(completions, solution, strict=True)])


# --------------------------------------------------------------------------- demo on local ranks

K = 4  # GRPOConfig.num_generations (only used to build the demo batch)


def make_batch(num_prompts: int = 4) -> dict[str, list[str]]:
    """A global batch: K programs per prompt, some right, some wrong, one that never finishes."""
    completions, solution = [], []
    for p in range(num_prompts):
        a, b = 2 + p, 5 + 3 * p
        for j in range(K):
            if (p, j) == (1, 2):
                program = "while True: pass"
            else:
                answer = a + b if (p + j) % 3 else a - b
                program = "# add\n" * ((p * j) % 3) + f"print({a} + {b})  # {answer}"
            completions.append(program)
            solution.append(str(a + b))
    return {"completions": completions, "solution": solution}


def local_slice(batch: dict[str, list[str]], rank: int, world_size: int) -> dict[str, list[str]]:
    """This rank's contiguous share of the rows, as TRL lays them out."""
    n = len(batch["completions"])
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    return {key: value[lo:hi] for key, value in batch.items()}


def run(rank: int, world_size: int) -> dict[str, list[float | None]]:
    """Each rank: the composed reward, the whole reward synced in main mode, and the unsynced plain rewards."""
    mine = local_slice(make_batch(), rank, world_size)
    return {
        "composed": verified_reward(**mine),
        "main": verified_reward_main(**mine),
        "per_rank": normalise([verify(c, s) for c, s in zip(mine["completions"], mine["solution"], strict=True)]),
    }


def timings(rank: int, world_size: int, rounds: int) -> dict[str, list[float]]:
    """Each rank: seconds per call of the three variants, ``rounds`` rounds after one warm-up round.

    Every call starts together on all ranks (a barrier before it), so a call's time on the slowest rank is
    how long the step waits for the reward.
    """
    import torch.distributed as dist

    mine = local_slice(make_batch(), rank, world_size)
    variants = {
        "unsynced": lambda: normalise(
            [verify(c, s) for c, s in zip(mine["completions"], mine["solution"], strict=True)]
        ),
        "synced whole": lambda: verified_reward_main(**mine),
        "composed": lambda: verified_reward(**mine),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds + 1):
        for name, call in variants.items():
            dist.barrier()
            t0 = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - t0)
    return {name: ts[1:] for name, ts in times.items()}  # the warm-up round left out


def show(xs: list[float | None]) -> str:
    return "[" + ", ".join("None" if x is None else f"{x:+.2f}" for x in xs) + "]"


def main(world_size: int = 2, rounds: int = 5) -> list[float | None]:
    import statistics

    from syncreward.testing import run_ranks

    parts = run_ranks(run, world_size)
    composed = [r for p in parts for r in p["composed"]]
    synced_main = [r for p in parts for r in p["main"]]
    per_rank = [r for p in parts for r in p["per_rank"]]
    batch = make_batch()
    expected = normalise([verify(c, s) for c, s in zip(batch["completions"], batch["solution"], strict=True)])
    print(f"{world_size} ranks, {len(composed)} completions ({COST_S * 1e3:.0f} ms each to verify)")
    print("composed:", show(composed))
    print("per-rank:", show(per_rank), "(unsynced: normalised over each rank's rows only)")
    print("composed == main-mode reward:", composed == synced_main)
    print("composed == single-process reference:", composed == expected)
    if rounds:
        per_rank_times = run_ranks(timings, world_size, rounds)
        median = {
            name: statistics.median(max(t[name][i] for t in per_rank_times) for i in range(rounds)) * 1e3
            for name in per_rank_times[0]
        }
        print(
            f"ms per call (median of {rounds} calls, slowest rank): unsynced {median['unsynced']:.1f} (wrong), "
            f"synced whole {median['synced whole']:.1f}, composed {median['composed']:.1f}"
        )
    return composed


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="timed calls per variant (0: no timings)")
    args = parser.parse_args()
    main(args.ranks, args.rounds)
