"""Where the time of a small ``mode="main"`` call goes, on every rank, against one dict ``all_gather_object``.

Usage (from the repository root)::

    python benchmarks/timeline_w2.py --world-size 2 --payload trl16 --rounds 200
    python benchmarks/timeline_w2.py --ab HEAD~1   # also an "old" main whose torch backend is that commit's
    python benchmarks/timeline_w2.py --variants main bare_main --stamp-library  # the library against its data path
    python benchmarks/timeline_w2.py --variants main lean_main bare_main --pin  # its layers; a core per rank

Each round calls every variant once (a fresh order each round, the ranks lined up by a barrier on
a group no variant uses before each call). Inside ``main`` calls every rank stamps, on the system-wide
monotonic clock (``time.perf_counter_ns``: CLOCK_MONOTONIC, one clock for every process of the machine),
the entry and exit of the backend's collectives, of the wait for their work, of the reward, and the
call's own start and end. The report gives, per rank, the median of each stamp's offset from the
earliest start of that call on any rank, so one table shows both ranks' timelines side by side: which
rank waits for which, and how long a collective takes from the last rank entering it to each rank
seeing it complete (the transport's own latency).

``lean_main`` is ``_bench_ranks.Lean``: ``main``'s steady-state protocol flattened (what its layers cost:
``main`` against it). ``--pin`` keeps each rank, its gloo threads included, on one core of its own
(``rank % cpus``): with fewer cores than the ranks' threads, one rank's Python after a collective
otherwise delays the other rank's wake-up inside it.

``--ab REV`` loads ``syncreward/backends/torch_distributed.py`` as of git revision ``REV`` as a second
module, and adds ``main_old``: the same reward on a backend of that class. ``main`` and ``main_old``
then alternate within every round of the same launch (paired calls).
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


def _load_old_backend(source: str) -> Any:
    """The torch backend class of an older revision, as module ``syncreward.backends._torch_old``."""
    path = Path("/tmp") / f"syncreward_torch_old_{abs(hash(source))}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("syncreward.backends._torch_old", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)

    class Old(module.TorchDistributedBackend):  # type: ignore[name-defined,misc]
        name = "torchold"  # its own store prefix: the two modules count their backends separately

    return Old


_clock, _cpu = time.perf_counter_ns, time.thread_time_ns


def _stamp(log: list[tuple[str, int, int]], label: str, fn: Any) -> Any:
    @functools.wraps(fn)  # the same signature and name: a synced reward binds and names it as ``fn``
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        log.append((label + ">", _clock(), _cpu()))
        try:
            return fn(*args, **kwargs)
        finally:
            log.append((label + "<", _clock(), _cpu()))

    return wrapper


_CURRENT: list[list[tuple[str, int, int]]] = [[]]  # the log of the call in progress (library-wide stamps)


def _stamp_library() -> None:
    """Stamp the library's steps of a call (class and module attributes: every traced variant sees them)."""
    import syncreward._batch as batch
    import syncreward._call as call
    import syncreward._decorator as dec
    import syncreward._exchange as ex
    import syncreward._lifecycle as lc
    import syncreward._modes._base as base
    import syncreward._modes.main as mm
    import syncreward._session as ses

    targets = [
        (dec, "call_site", "site"),
        (lc, "_open", "open"),
        (lc, "session_for", "session_for"),
        (ses.Session, "open", "session.open"),
        (call.Binder, "bind", "bind"),
        (call, "_build", "build"),
        (mm.MainMode, "prepare", "prepare"),
        (ses.Session, "run_turn", "turn"),
        (mm.MainMode, "route_inputs", "inbound"),
        (ex.Link, "inbound", "link.inbound"),
        (ex.Link, "gathered", "link.gathered"),
        (ex, "_gather_block", "block"),
        (ex, "exchange_results", "results"),
        (base.GatherMode, "gather", "gather"),
        (base.GatherMode, "scoring_for", "scoring_for"),
        (mm.MainMode, "route_results", "outbound"),
        (mm, "split_result", "split"),
        (base.GatherMode, "send_results", "send_results"),
        (base.GatherMode, "read_results", "read_results"),
        (batch, "decode_frame", "decode"),
    ]
    import syncreward.backends.torch_distributed as td

    class _Torch:  # the backend module's ``torch``, with its allocations stamped
        def __getattr__(self, name: str) -> Any:
            return getattr(torch, name)

    import torch

    proxy = _Torch()
    targets += [(proxy, "empty", "t.empty"), (proxy, "from_numpy", "t.from_numpy")]
    proxy.empty, proxy.from_numpy = torch.empty, torch.from_numpy  # type: ignore[attr-defined]
    td.torch = proxy  # type: ignore[assignment]
    for owner, attr, label in targets:
        if isinstance(owner, type):
            raw = next(k.__dict__[attr] for k in owner.__mro__ if attr in k.__dict__)
        else:
            raw = getattr(owner, attr)
        fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw

        def wrapper(*args: Any, _fn: Any = fn, _label: str = label, **kwargs: Any) -> Any:
            log = _CURRENT[0]
            log.append((_label + ">", _clock(), _cpu()))
            try:
                return _fn(*args, **kwargs)
            finally:
                log.append((_label + "<", _clock(), _cpu()))

        setattr(owner, attr, classmethod(wrapper) if isinstance(raw, classmethod) else wrapper)


class _Stamped:
    """A gloo group whose collectives' issue (the call that enqueues the work) is stamped."""

    def __init__(self, group: Any, log: list[tuple[str, int]]) -> None:
        self._group, self._log = group, log

    def __getattr__(self, name: str) -> Any:
        return _stamp(self._log, "issue", getattr(self._group, name))


def _pin(rank: int) -> None:
    """Keep this rank's process -- every thread it has, and every one it starts -- on core ``rank % cpus``."""
    import os

    core = {rank % (os.cpu_count() or 1)}
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), core)


def rank_main(rank: int, world_size: int, cfg: dict[str, Any]) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from _bench_ranks import (
        Bare,
        Lean,
        dict_gather,
        format_reward,
        fused_objects,
        handrolled,
        length_reward,
        reward,
    )
    from _payloads import make_batch

    from syncreward import synced_reward, synced_rewards
    from syncreward.backends.torch_distributed import TorchDistributedBackend

    torch.set_num_threads(1)
    if cfg.get("pin"):
        _pin(rank)
    batch = make_batch(cfg["payload"], rank, world_size)
    align = dist.new_group(backend="gloo")
    logs: dict[str, list[tuple[str, int, int]]] = {}
    if cfg.get("stamp_library"):
        _stamp_library()

    def traced_backend(name: str, cls: Any) -> Any:
        log: list[tuple[str, int, int]] = []
        logs[name] = log
        backend = cls()
        for attr in ("_all_to_all", "scatter", "gather", "send", "recv", "recv_many", "_wait", "_begin"):
            setattr(backend, attr, _stamp(log, attr, getattr(backend, attr)))
        channel = backend._channel

        def stamped_channel(*args: Any) -> Any:
            return _Stamped(channel(*args), log)

        backend._channel = stamped_channel
        return backend, log

    def traced(name: str, cls: Any) -> Any:
        backend, log = traced_backend(name, cls)
        return synced_reward(mode="main", backend=backend)(_stamp(log, "score", reward))

    def traced_group(name: str, cls: Any) -> Any:
        backend, log = traced_backend(name, cls)
        members = [_stamp(log, f"score.{f.__name__}", f) for f in (reward, format_reward, length_reward)]
        group = synced_rewards(*members, mode="main", backend=backend)

        def step() -> Any:
            cols = {k: list(v) for k, v in batch.items()}  # as TRL: new lists each step, the same for each reward
            results = [f(**cols) for f in group]
            return results[0]

        return step

    variants: dict[str, Any] = {"main": traced("main", TorchDistributedBackend)}
    if "bare_main" in cfg["variants"]:  # main's data path alone (_bench_ranks.Bare), its collectives stamped
        bare = Bare(batch, cfg["payload"])
        bare.backend, _ = traced_backend("bare_main", TorchDistributedBackend)
        variants["bare_main"] = bare
    if "lean_main" in cfg["variants"]:  # main's steady-state protocol flattened (_bench_ranks.Lean), stamped
        variants["lean_main"] = Lean(batch, cfg["payload"], traced_backend("lean_main", TorchDistributedBackend)[0])
    if cfg.get("old_source"):
        variants["main_old"] = traced("main_old", _load_old_backend(cfg["old_source"]))
    steps: dict[str, Any] = {}
    if "step3_group" in cfg["variants"]:
        steps["step3_group"] = traced_group("step3_group", TorchDistributedBackend)
    fns: dict[str, Any] = {
        "dict_gather": lambda: dict_gather(batch),
        "fused_objects": lambda: fused_objects(batch),
        "handrolled": lambda: handrolled(batch),
        **{k: (lambda f=f: f(**batch)) for k, f in variants.items() if k not in ("bare_main", "lean_main")},
        **{k: variants[k] for k in ("bare_main", "lean_main") if k in variants},
        **steps,
    }
    variants.update(steps)
    names = [n for n in fns if n in cfg["variants"] or n == "main_old"]
    for _ in range(cfg["warmup"]):
        for n in names:
            dist.barrier(group=align)
            fns[n]()
    times: dict[str, list[int]] = {n: [] for n in names}
    calls: dict[str, list[list[tuple[str, int, int]]]] = {n: [] for n in variants}
    cpu: dict[str, list[int]] = {n: [] for n in names}
    for r in range(cfg["rounds"]):
        gc.collect()
        for n in random.Random(r).sample(names, len(names)):  # a fresh order each round, alike on every rank
            log = logs.get(n)
            if log is not None:
                log.clear()
            _CURRENT[0] = log if log is not None else []
            dist.barrier(group=align)
            c0, p0 = _cpu(), time.process_time_ns()
            t0 = _clock()
            fns[n]()
            t1 = _clock()
            c1, p1 = _cpu(), time.process_time_ns()
            times[n].append(t1 - t0)
            cpu[n].append(p1 - p0)
            if log is not None:
                calls[n].append([("call>", t0, c0), *log, ("call<", t1, c1)])
            _CURRENT[0] = []
    return {"times": times, "calls": calls, "cpu": cpu}


def _labels(events: list[tuple[str, int, int]]) -> list[str]:
    """Stamps named by order of occurrence (``_wait>#2``: the second wait), so calls line up."""
    seen: dict[str, int] = {}
    out = []
    for label, _, _ in events:
        seen[label] = seen.get(label, 0) + 1
        out.append(f"{label}#{seen[label]}")
    return out


def report(ranks: list[dict[str, Any]]) -> str:
    lines = []
    names = list(ranks[0]["times"])
    per_call = {n: np.max(np.array([r["times"][n] for r in ranks]), axis=0) / 1e6 for n in names}
    lines.append("latency per call, slowest rank (ms): median / p25 / p75 / n")
    for n in names:
        a = per_call[n]
        lines.append(f"  {n:<16}{np.median(a):8.3f}{np.percentile(a, 25):8.3f}{np.percentile(a, 75):8.3f}{len(a):6d}")
    lines.append("process CPU time per call (all threads, ms): median per rank")
    for n in names:
        lines.append(f"  {n:<16}" + "".join(f"{np.median(r['cpu'][n]) / 1e6:8.3f}" for r in ranks))
    lines.append("paired ratios (median of per-round ratios; median over median):")
    for a in names:
        for b in names:
            if a != b and (a.startswith("main") or b == "main"):
                pr = np.median(per_call[a] / per_call[b])
                lines.append(f"  {a} / {b}: {pr:.3f}x paired, {np.median(per_call[a]) / np.median(per_call[b]):.3f}x")
    for n in ranks[0]["calls"]:
        calls = [r["calls"][n] for r in ranks]
        if not calls[0]:
            continue
        keys = [_labels(c[0]) for c in calls]  # per rank: the stamps of its usual call
        offsets: dict[int, dict[str, list[float]]] = {r: {k: [] for k in keys[r]} for r in range(len(ranks))}
        cpus: dict[int, dict[str, list[float]]] = {r: {k: [] for k in keys[r]} for r in range(len(ranks))}
        for i in range(len(calls[0])):
            start = min(c[i][0][1] for c in calls)
            for r, c in enumerate(calls):
                if _labels(c[i]) != keys[r]:
                    continue  # a call with another sequence of events (a first call's extra exchange)
                for k, (_, t, u) in zip(keys[r], c[i], strict=True):
                    offsets[r][k].append((t - start) / 1e3)
                    cpus[r][k].append((u - c[i][0][2]) / 1e3)
        lines.append(
            f"\n{n}: per stamp, median offset from the call's earliest start on any rank (wall us) and this "
            "thread's CPU time since its own start (us)"
        )
        lines.append(f"  {'stamp':<18}" + "".join(f"{'rank ' + str(r) + ' wall':>14}{'cpu':>7}" for r in offsets))
        rows = max(len(k) for k in keys)
        for j in range(rows):
            cells = ""
            for r in offsets:
                if j < len(keys[r]):
                    k = keys[r][j]
                    v, u = offsets[r][k], cpus[r][k]
                    wall, busy = (np.median(v), np.median(u)) if v else (float("nan"), float("nan"))
                    cells += f"  {k:<16}{wall:>8.0f}{busy:>7.0f}"
                else:
                    cells += " " * 33
            lines.append(cells)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--payload", default="trl16")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument(
        "--warmup", type=int, default=10
    )  # past main's first calls (_wire.BLOCK_LAG): their blocks are small
    ap.add_argument("--variants", nargs="+", default=["main", "dict_gather", "fused_objects"])
    ap.add_argument("--stamp-library", action="store_true", help="also stamp the library's steps of a call")
    ap.add_argument("--ab", metavar="REV", help="also main_old: the torch backend of git revision REV")
    ap.add_argument("--pin", action="store_true", help="each rank and its threads on a core of its own")
    args = ap.parse_args()
    from syncreward.testing import run_ranks

    cfg: dict[str, Any] = vars(args).copy()
    if args.ab:
        cfg["old_source"] = subprocess.run(
            ["git", "show", f"{args.ab}:syncreward/backends/torch_distributed.py"],
            cwd=HERE.parent,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    load = Path("/proc/loadavg").read_text().split()[:3]
    ranks = run_ranks(rank_main, args.world_size, cfg, timeout=1800, env={"OMP_NUM_THREADS": "1"})
    print(f"W={args.world_size} payload={args.payload} rounds={args.rounds} ab={args.ab}")
    print(f"load before {load}, after {Path('/proc/loadavg').read_text().split()[:3]}")
    print(report(ranks))


if __name__ == "__main__":
    main()
