"""A GPU check: CUDA tensors in every mode, on gloo ranks sharing one GPU. One PASS/FAIL line per case.

Usage (from the repository root, on a machine with torch + CUDA)::

    python benchmarks/gpu_check.py                      # --device cuda, W = 2 and 4, well under 2 minutes
    python benchmarks/gpu_check.py --device cpu         # the same cases without a GPU (default device: meta)

Each W is one launch of W local gloo ranks (``syncreward.testing.run_ranks``), all on ``cuda:0``. Every
rank calls, in ``main``, ``replicate``, ``shard`` (``group_size=2``, groups that span two ranks, one rank
without samples at W = 4) and a reward group (``synced_rewards``, ``main``):

* ``tensor-column``: a tensor column on the rank's device, a dict result (a tensor computed from it, a
  list): values equal to the plain function on the global batch, the tensor on the caller's device;
* ``no-tensor-input``: only str columns, a tensor result made on the device: on the rank's current CUDA
  device (``--device cpu``: the CPU);
* ``default-device``: both, under ``torch.set_default_device(<default>)`` (``cuda``; ``--device cpu``:
  ``meta``), then once more after it is reset.

A case passes when every rank got the right values on the right device. Exit status: 0 if every case
passed, 1 otherwise (2: a launch failed; its ranks' output is printed).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

LAYOUTS = {2: [3, 1], 4: [3, 0, 4, 1]}  # group_size=2: groups span ranks 0-1 (W=2) and 0-2, 2-3 (W=4)


def _layout(world_size: int) -> list[int]:
    return LAYOUTS.get(world_size) or [1 + (r % 2) for r in range(world_size)]


def rank_main(rank: int, world_size: int, device_name: str, default_device: str) -> list[tuple[str, str]]:
    """Every case on this rank: ``(case, problem)``, the problem empty where the case passed."""
    import torch

    from syncreward import synced_reward, synced_rewards

    if device_name == "cuda":
        torch.cuda.set_device(0)
    dev = torch.device("cuda", 0) if device_name == "cuda" else torch.device("cpu")
    sizes = _layout(world_size)

    def score(completions: Any, x: Any, **kwargs: Any) -> dict[str, Any]:
        lengths = torch.tensor([len(c) for c in completions], dtype=torch.float32, device=x.device)
        return {"tensor": x * 2 + lengths, "list": [len(c) for c in completions]}

    def score_again(completions: Any, x: Any, **kwargs: Any) -> Any:
        return x + 0.5

    def lengths_on_device(completions: Any, **kwargs: Any) -> Any:
        return torch.tensor([float(len(c)) for c in completions], device=dev)

    def inputs(r: int) -> tuple[list[str], Any]:
        start = sum(sizes[:r])
        completions = [f"r{r}-" + "x" * i for i in range(sizes[r])]
        return completions, torch.arange(start, start + sizes[r], dtype=torch.float32, device=dev)

    lo, hi = sum(sizes[:rank]), sum(sizes[: rank + 1])
    every = [inputs(r) for r in range(world_size)]
    g_completions = [c for p in every for c in p[0]]
    g_x = torch.cat([p[1].cpu() for p in every])

    def want(fn: Any, *args: Any) -> Any:
        got = fn(*args)
        return {k: v[lo:hi] for k, v in got.items()} if isinstance(got, dict) else got[lo:hi]

    modes: dict[str, dict[str, Any]] = {}
    for mode in ("main", "replicate", "shard"):
        opts: dict[str, Any] = {"mode": mode, "timeout": 60}
        if mode == "shard":
            opts["group_size"] = 2
        modes[mode] = {
            "tensor-column": (synced_reward(**opts)(score),),
            "no-tensor-input": (synced_reward(**opts)(lengths_on_device),),
        }
    modes["reward-group"] = {
        "tensor-column": synced_rewards(score, score_again, mode="main", timeout=60),
        "no-tensor-input": synced_rewards(lengths_on_device, mode="main", timeout=60),
    }
    plain = {"tensor-column": {"score": score, "score_again": score_again}, "no-tensor-input": {}}
    cpu = torch.device("cpu")
    expected_device = {"tensor-column": dev, "no-tensor-input": dev}

    def check(case: str, fns: tuple[Any, ...], args: tuple[Any, ...]) -> str:
        problems = []
        for fn in fns:
            try:
                got = fn(*args)
            except Exception as e:
                problems.append(f"{fn.__name__}: {type(e).__name__}: {str(e)[:300]}")
                continue
            if case == "tensor-column":
                ref = want(plain[case][fn.__name__], g_completions, g_x)
            else:
                ref = torch.tensor([float(len(c)) for c in g_completions], device=cpu)[lo:hi]
            for key, value in got.items() if isinstance(got, dict) else [(None, got)]:
                r = ref[key] if key is not None else ref
                if isinstance(value, torch.Tensor):
                    if value.device != expected_device[case]:
                        problems.append(f"{fn.__name__}[{key}]: on {value.device}, expected {expected_device[case]}")
                    elif not torch.equal(value.to(cpu), r.to(cpu)):
                        problems.append(f"{fn.__name__}[{key}]: {value.tolist()} != {r.tolist()}")
                elif value != r:
                    problems.append(f"{fn.__name__}[{key}]: {value!r} != {r!r}")
        return "; ".join(problems)

    @contextlib.contextmanager
    def default(on: bool) -> Iterator[None]:
        if not on:
            yield
            return
        torch.set_default_device(default_device)
        try:
            yield
        finally:
            torch.set_default_device(None)

    out: list[tuple[str, str]] = []
    for mode, cases in modes.items():
        for case, fns in cases.items():
            completions, x = inputs(rank)
            args = (completions, x) if case == "tensor-column" else (completions,)
            out.append((f"{mode} {case}", check(case, fns, args)))
    for mode, cases in modes.items():
        for when in ("under", "after"):
            problems = []
            for case, fns in cases.items():
                completions, x = inputs(rank)
                args = (completions, x) if case == "tensor-column" else (completions,)
                with default(when == "under"):
                    problem = check(case, fns, args)
                if problem:
                    problems.append(f"{case}: {problem}")
            label = f"set_default_device({default_device!r})" if when == "under" else "after reset"
            out.append((f"{mode} default-device {label}", "; ".join(problems)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where tensor columns live")
    parser.add_argument("--default-device", default=None, help="for the default-device cases (cuda; cpu: meta)")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds per launch, start-up included")
    args = parser.parse_args(argv)
    default_device = args.default_device or ("cuda" if args.device == "cuda" else "meta")

    import torch

    from syncreward.testing import RanksFailed, run_ranks

    if args.device == "cuda" and not torch.cuda.is_available():
        print("FAIL setup: --device cuda but torch.cuda.is_available() is False (use --device cpu)")
        return 1
    t0 = time.monotonic()
    failed = 0
    for w in args.world_sizes:
        try:
            ranks = run_ranks(rank_main, w, args.device, default_device, timeout=args.timeout)
        except RanksFailed as e:
            print(f"FAIL W={w}: the launch failed\n{e}")
            for r, text in sorted(e.failures.items()):
                print(f"--- rank {r}\n{text}")
            return 2
        for i, (case, _) in enumerate(ranks[0]):
            problems = [f"rank {r}: {ranks[r][i][1]}" for r in range(w) if ranks[r][i][1]]
            failed += bool(problems)
            print(f"{'FAIL' if problems else 'PASS'} W={w} {case}" + ("".join(f"\n    {p}" for p in problems)))
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    print(
        f"{failed} failed; device {args.device} ({where}), default device {default_device!r}, "
        f"torch {torch.__version__}, {time.monotonic() - t0:.0f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
