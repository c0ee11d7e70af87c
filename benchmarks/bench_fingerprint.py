"""What a call's identity costs per call: this checkout's ``_identity`` against another revision's, interleaved.

Times, in one process, what ``Call._of`` computes for the identity of each call -- the reward's identity
(``Identity.key``: a cached string; now also the synced function's ``__name__``, read and compared), the
call site (``call_site``, cached per call instruction), the hashed text and the description -- with the
``_identity`` module of this checkout ("new") and of ``--against`` (default ``541b906``, before issue 21:
"old"), loaded from git into the same process, and the bare fingerprint of the name only as a floor. For
``async`` calls it also times what the session learns of each call (the task and the event loop's turn).
Prints min-of-repeats per call.

    python benchmarks/bench_fingerprint.py [--against REV]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import subprocess
import sys
import timeit
import types
from pathlib import Path
from typing import Any

from syncreward import _identity as new
from syncreward._lifecycle import _turn
from syncreward._wire import fingerprint

COLUMNS = "completion_ids:list, completions:list, prompts:list, solution:list"  # TRL's columns
ROOT = Path(__file__).resolve().parents[1]


def accuracy_reward(completions: Any, solution: Any, target: int = 0, **kwargs: Any) -> list[float]:
    return []


def load(rev: str) -> Any:
    """``syncreward/_identity.py`` as it is at ``rev``, as a module of this package."""
    src = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:syncreward/_identity.py"], check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType("syncreward._identity_at_" + rev.replace("/", "_"))
    module.__package__ = "syncreward"
    exec(compile(src, f"{rev}:syncreward/_identity.py", "exec"), module.__dict__)
    return module


def name_only() -> int:
    return fingerprint(f"accuracy_reward(mode='main') per-sample columns [{COLUMNS}]")


def old_call(identity: Any, call_site: Any) -> Any:
    def call() -> tuple[int, str]:
        site = call_site(sys._getframe(0))
        schema = f"{identity.key()}(mode='main') per-sample columns [{COLUMNS}] called from {site}"
        return fingerprint(schema), f"call #7 at step 3: {schema}"

    return call


def new_call(identity: Any) -> Any:
    def call() -> tuple[int, str]:
        site = new.call_site(sys._getframe(0))
        schema = f"{identity.key()}(mode='main') per-sample columns [{COLUMNS}] called from "
        return fingerprint(schema + site.key), f"call #7 at step 3: {schema}{site.shown}"

    return call


def named(fn: Any) -> Any:
    def wrapper() -> None: ...

    wrapper.__name__ = "accuracy_reward"
    return wrapper


def async_bookkeeping(n: int, repeat: int) -> float:
    """us per call of what an async call adds: its site, its task, the loop's turn (``call_async``)."""
    site = new.call_site(sys._getframe(0))

    async def main() -> float:
        def once() -> Any:
            return (None, site.key, asyncio.current_task(), _turn(asyncio.get_running_loop()))

        return min(timeit.timeit(once, number=n) for _ in range(repeat)) / n * 1e6

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="541b906", help="the revision timed as 'old'")
    parser.add_argument("--number", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    old = load(args.against)
    old_plain = old.Identity(accuracy_reward, "accuracy_reward")
    old_a = old.Identity(functools.partial(accuracy_reward, target=10), "accuracy_reward")
    old_b = old.Identity(functools.partial(accuracy_reward, target=20), "accuracy_reward")
    new_plain = new.Identity(accuracy_reward, "accuracy_reward")
    new_plain.named_by(named(accuracy_reward))
    new_a = new.Identity(functools.partial(accuracy_reward, target=10), "accuracy_reward")
    new_a.named_by(named(accuracy_reward))
    cases = {
        "name only (floor)": name_only,
        "old: plain function": old_call(old_plain, old.call_site),
        "new: plain function": new_call(new_plain),
        "old: one of two partials": old_call(old_a, old.call_site),
        "new: a partial": new_call(new_a),
    }
    for fn in cases.values():
        fn()
    best = {k: float("inf") for k in cases}
    for _ in range(args.repeat):  # interleaved rounds: every variant sees the same machine state
        for name, fn in cases.items():
            best[name] = min(best[name], timeit.timeit(fn, number=args.number) / args.number * 1e6)
    del old_b
    floor = best["name only (floor)"]
    print(f"identity parts per call, old = {args.against}, min of {args.repeat} x {args.number}:")
    for name, us in best.items():
        print(f"  {name:26s} {us:6.2f} us per call   (+{us - floor:5.2f} us over the floor)")
    print(f"  async call bookkeeping (new) {async_bookkeeping(args.number, args.repeat):6.2f} us per call")


if __name__ == "__main__":
    main()
