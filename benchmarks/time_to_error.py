"""Time for every rank to raise when a synced function raises on one of W ranks, and time to *exit* after a fault.

    python benchmarks/time_to_error.py --world-size 3 --repeats 10          # both sections
    python benchmarks/time_to_error.py --sections exit --exit-repeats 2 --compare /tmp/old

``raise``: for each mode the function raises on one rank (the scoring rank 0 in main mode, rank W-1 in
the others); every rank records how long its call took to raise. Prints the max over ranks per repeat.

``exit``: each fault of ``_exit_faults.py`` on fresh processes (plain ``python`` processes, as a launcher
starts them), with ``timeout=12``: a rank's main thread raises, calls ``sys.exit`` or gets Ctrl-C while
its synced call waits for a peer that never comes; a timeout (3 ranks: one hung, one 7 s late), also
followed by ``destroy_process_group()``; a peer killed inside the reward; and no fault at all, the floor
(how long a process of this job takes to end after its last call). Prints, per fault and rank, the
seconds from the fault (or the rank's own error) to the end of its process; to the end of the exit
hooks (syncreward's and torch's: what follows is the interpreter's own teardown, which takes as long
with no fault); and from the fault to the rank's error. ``--compare DIR`` runs every launch a second
time, interleaved, with the syncreward package found in ``DIR`` (e.g. ``git archive <commit>
syncreward | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from _exit_faults import launch

from syncreward import synced_reward
from syncreward.testing import run_ranks

EXIT_TIMEOUT_S = 12.0
# (label, scenario, launch options): the ranks that never end by themselves are killed once the others ended
EXIT_FAULTS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("no fault (the floor)", "clean", {}),
    ("main thread raises, async call in flight", "dying_main", {"late": 600, "hung": {1}}),
    ("sys.exit(3), async call in flight", "sys_exit", {"late": 600, "hung": {1}}),
    ("Ctrl-C to one rank, async call", "sigint_async", {"late": 600, "hung": {1}}),
    ("Ctrl-C to one rank, plain call", "sigint_sync", {"late": 600, "hung": {1}}),
    ("timeout: rank 2 hung, rank 1 7 s late", "timeout", {"late": 7}),
    ("... then destroy_process_group()", "timeout_destroy", {"late": 7}),
    ("peer killed inside the reward", "killed_peer", {}),
)


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


def time_to_raise(world_size: int, repeats: int) -> None:
    results = run_ranks(body, world_size, repeats, timeout=300)
    print(f"time for every rank to raise, W={world_size}, {repeats} repeats (ms)")
    for mode in results[0]:
        worst = [max(r[mode][i] for r in results) * 1e3 for i in range(repeats)]
        print(f"  {mode:9s} median {statistics.median(worst):7.2f}  max {max(worst):7.2f}")


def _fmt(values: list[float | None]) -> str:
    got = [v for v in values if v is not None]
    if not got:
        return "-"
    killed = len(values) - len(got)
    text = f"{statistics.median(got):6.2f} (max {max(got):6.2f})"
    return text + (f" +{killed} killed" if killed else "")


def time_to_exit(repeats: int, compare: str | None, limit: float) -> None:
    copies: list[tuple[str, str | None]] = [("new", None)] + ([("old", compare)] if compare else [])
    rows: dict[tuple[str, str, int], dict[str, list[float | None]]] = {}
    notes: list[str] = []
    for i in range(repeats):
        for label, scenario, opts in EXIT_FAULTS:
            for name, path in copies if i % 2 == 0 else copies[::-1]:  # interleaved, each first in turn
                results = launch(scenario, timeout=EXIT_TIMEOUT_S, limit=limit, pythonpath=path, **opts)
                for r in results:
                    if r["rank"] in opts.get("hung", set()) or (scenario.startswith("timeout") and r["rank"] == 2):
                        continue  # never ends by itself: killed by the launcher
                    if scenario == "killed_peer" and r["rank"] == 1:
                        continue  # os._exit: it ends at once
                    row = rows.setdefault((label, name, r["rank"]), {"exit": [], "hooks": [], "error": []})
                    row["exit"].append(None if r["killed_by_launcher"] else r["exit_s"])
                    row["hooks"].append(None if r["killed_by_launcher"] else r["hooks_s"])
                    row["error"].append(r["error_s"])
                    for text in ("terminate called", "core dumped", "Fatal Python error"):
                        if text in r["stderr"]:
                            notes.append(f"{label} ({name}, rank {r['rank']}): {text!r} in its stderr")
        print(f"  exit round {i + 1}/{repeats} done", flush=True)
    print(
        f"\ntime to exit after a fault, timeout={EXIT_TIMEOUT_S:g}s, {repeats} repeats, seconds "
        f"(median, max; 'killed': still running at the {limit:g}s limit)"
    )
    head = f"{'fault -> exit':>26s} {'fault -> exit hooks done':>26s} {'fault -> error':>26s}"
    print(f"  {'fault':42s} {'copy':4s} {'rank':4s} {head}")
    for (label, name, rank), row in rows.items():
        cells = [_fmt(row[k]) if any(v is not None for v in row[k]) else "-" for k in ("exit", "hooks", "error")]
        print(f"  {label:42s} {name:4s} {rank:4d} " + " ".join(f"{c:>26s}" for c in cells))
    for note in notes:
        print("  NOTE:", note)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", choices=("raise", "exit"), default=["raise", "exit"])
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--exit-repeats", type=int, default=2)
    parser.add_argument("--exit-limit", type=float, default=90.0, help="seconds before a launch's ranks are killed")
    parser.add_argument("--compare", help="a directory holding another syncreward package, run interleaved")
    args = parser.parse_args()
    if "raise" in args.sections:
        time_to_raise(args.world_size, args.repeats)
    if "exit" in args.sections:
        time_to_exit(args.exit_repeats, args.compare, args.exit_limit)


if __name__ == "__main__":
    main()
