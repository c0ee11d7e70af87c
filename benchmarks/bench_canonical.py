"""What the canonical encoder costs per call: this checkout against another revision, interleaved in one process.

Three per-call costs that issue 31 moved into ``_canonical`` and ``_description``:

* ``group keys``: ``_keys.group_keys`` of one rank's ``group_by`` column (int prompt ids, plain-string
  prompts, TRL conversational prompts; 64 rows);
* ``shared digest``: ``_shared.SharedValues(...)`` of a call's shared arguments (a threshold and a name; a
  list of weights and a config dict; numpy scalars in a dict);
* ``description``: what ``_call._build`` computes to describe and fingerprint a call (the old text and
  its encoded size; the new record and its fingerprint).

``_keys.py`` and ``_wire.py`` of ``--against`` (default ``46a2144``, before issue 31) are loaded from git
into this process as "old"; every variant runs in a rotating order over many rounds. Prints the minimum
per call (the steadier figure on a loaded machine) and new / old.

    python benchmarks/bench_canonical.py [--against REV] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import os
import subprocess
import sys
import time
import types
from collections.abc import Callable
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from syncreward import _keys, _shared, _wire  # noqa: E402
from syncreward._codec import C_LIST  # noqa: E402
from syncreward._description import Description  # noqa: E402

COLUMNS = (("completion_ids", "list"), ("completions", "list"), ("prompts", "list"), ("solution", "list"))
REWARD = "__main__.accuracy_reward(mode='main')"
SITE_KEY, SITE_SHOWN = "__main__:main+12@84", "/home/user/train.py:123:9 in main"


def load(rev: str, name: str) -> Any:
    """``syncreward/<name>.py`` as it is at ``rev``, as a module of this package."""
    src = subprocess.run(
        ["git", "-C", ROOT, "show", f"{rev}:syncreward/{name}.py"], check=True, capture_output=True, text=True
    ).stdout
    module = types.ModuleType(f"syncreward.{name}_at_{rev}")
    module.__package__ = "syncreward"
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(src, f"{rev}:syncreward/{name}.py", "exec"), module.__dict__)
    return module


def key_columns(rows: int = 64, k: int = 4) -> dict[str, list[Any]]:
    text = [f"question {g}: " + "solve for x in the equation " * 15 for g in range(rows // k + 1)]
    system = {"role": "system", "content": "Answer briefly."}
    return {
        "int ids": [i // k for i in range(rows)],
        "plain prompts": [text[i // k] for i in range(rows)],
        "conversational prompts": [[dict(system), {"role": "user", "content": text[i // k]}] for i in range(rows)],
    }


SHARED = {
    "a threshold and a name": {"threshold": 0.5, "name": "judge"},
    "weights and a config": {"weights": [0.2, 0.3, 0.5], "config": {"k": 3, "mode": "strict", "tags": ["a", "b"]}},
    "numpy scalars in a dict": {"scale": {"a": np.float32(0.5), "b": np.int64(3)}},
}


def old_description(fingerprint: Callable[[str], int]) -> Callable[[], Any]:
    def describe() -> Any:
        cols = ", ".join(f"{n}:{c}" for n, c in COLUMNS)
        schema = f"{REWARD} per-sample columns [{cols}] called from "
        text = f"call #7 at step 3: {schema}{SITE_SHOWN}"
        return fingerprint(schema + SITE_KEY), text, len(text.encode("utf-8", "backslashreplace"))

    return describe


def new_description(fingerprint: Callable[[str], int]) -> Callable[[], Any]:
    def describe() -> Any:
        columns = tuple([(n, c) for n, c in COLUMNS])
        schema = "\1".join(map("\0".join, columns))
        fp = fingerprint(f"{REWARD}\0{''}\0{schema}\0{SITE_KEY}")
        return fp, Description(7, 3, REWARD, "", columns, SITE_SHOWN)

    return describe


def measure(variants: dict[str, Callable[[], Any]], rounds: int, number: int) -> dict[str, float]:
    best = {v: float("inf") for v in variants}
    names = list(variants)
    for r in range(rounds):
        gc.collect()
        for v in names[r % len(names) :] + names[: r % len(names)]:
            fn = variants[v]
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            best[v] = min(best[v], (time.perf_counter() - t0) / number)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--against", default="46a2144", help="the revision timed as 'old'")
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    old_keys, old_wire = load(args.against, "_keys"), load(args.against, "_wire")
    cases: dict[str, tuple[Callable[[], Any], Callable[[], Any], int]] = {}
    for name, values in key_columns().items():
        cases[f"group keys: {name} (64 rows)"] = (
            lambda v=values: old_keys.group_keys(v, C_LIST, "k"),
            lambda v=values: _keys.group_keys(v, C_LIST, "k"),
            20,
        )
    for name, shared in SHARED.items():
        cases[f"shared digest: {name}"] = (
            lambda s=shared: old_wire.SharedValues(s).digest,
            lambda s=shared: _shared.SharedValues(s).digest,
            2000,
        )
    cases["description and fingerprint"] = (
        old_description(old_wire.fingerprint),
        new_description(_wire.fingerprint),
        2000,
    )
    print(f"old = {args.against}, min of {args.rounds} rounds, interleaved")
    print("| per call | old us | new us | new / old |")
    print("|---|---:|---:|---:|")
    for name, (old, new, number) in cases.items():
        best = measure({"old": old, "new": new}, args.rounds, number)
        o, n = best["old"] * 1e6, best["new"] * 1e6
        print(f"| {name} | {o:.2f} | {n:.2f} | {n / o:.2f} |")


if __name__ == "__main__":
    main()
