"""Scale study on a simulated transport: what one synced call sends per rank at W = 2 .. 1024, counted exactly.

Usage (from the repository root)::

    python benchmarks/simulate.py --out-dir benchmarks/results/issue31/simulate

Every W is one :func:`syncreward.testing.run_threads` launch: W thread-ranks of one process, each with the
:class:`~syncreward.testing.ThreadBackend` of a fresh group, wrapped in :class:`Counting`. The wrapper sees
the arguments of every collective the rank takes part in and counts, per rank and per call, what a gloo
transport would do with them:

* **posted** messages: a (source, destination) pair the collective touches *as gloo runs it*. gloo's
  ``alltoallv`` (syncreward's ``all_to_all`` and, on the torch backend, its ``all_gather``) posts a send to
  and a receive from every peer, even of zero bytes; a ``scatter`` or ``gather`` involves the root and each
  other rank once;
* messages **with data**: the posted pairs with a nonzero byte count (what ``benchmarks/scale.py`` calls
  messages);
* bytes sent and received (a rank's copy to itself excluded), the largest receive buffer, and the
  **distinct peers** a call touches (posted; a lazily connected gloo group opens a connection per peer).

The payload is ``benchmarks/scale.py``'s (4 TRL-like samples per rank, 1,688 bytes encoded), so counts at
small W equal those of the real gloo ranks. Each mode -- ``main``, ``replicate``, ``shard``
(``group_size=2``) and a 3-reward group (``step3``: ``synced_rewards(accuracy, length, fmt)``, one step =
three calls) -- gets ``--warmup`` calls (the first ones size the chunks; ``main``'s inbound block comes from rank 0's
announcement ``_wire.BLOCK_LAG`` gathered calls earlier, so the default warms past it) and then ``--calls``
counted ones;
every counted call must look the same.

Then every rank's counts are checked against a closed-form model (a function of W, see :func:`model`) for
both designs of ``main``: ``mesh`` (the inbound exchange is an ``alltoallv``: O(W) per rank, O(W^2) in
all) and ``root`` (root-routed: a ``gather`` to rank 0 and a ``scatter`` back, a non-scoring rank talks to
rank 0 only). The output says which design the code measured matches, per mode and W. A collective the
wrapper does not know (a capability added since) is recorded by name and matches no model.

Time: the threads share one interpreter, so the per-call work of every rank adds up; O(W^2) arithmetic
per rank (``mesh``) makes W = 1024 the slow case. ``--max-w-others`` bounds W for the modes other than
``main`` (``replicate`` moves (W-1) payload copies per rank: 2 GiB at W = 1024). On the shared 2-core
benchmark machine the default run took 7 minutes on the ``alltoallv`` design, 3 of them for ``main`` at
W = 1024; a root-routed ``main`` does O(W) work in all, so the lead's rerun should be quicker.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

MODES = ("main", "replicate", "shard", "step3")
KNOWN = ("all_gather", "all_to_all", "scatter", "gather")
COUNTS = (
    "collectives",
    "posted_out",
    "posted_in",
    "data_out",
    "data_in",
    "peers",
    "data_peers",
    "bytes_out",
    "bytes_in",
    "recv_buffer_peak",
)
REWARDS = 3  # rewards in step3


# --------------------------------------------------------------------------------------------- counting backend


class Counting:
    """Wraps a thread-rank's backend; records every collective it takes part in (arguments only, exact).

    Per collective: its kind, the channel and the bytes sent to / received from each rank, plus the peers
    it posts to and from as gloo runs it. A method of the inner backend that is not a known collective
    (``__getattr__``) is forwarded and recorded by name, so a new capability shows up as unmodelled
    rather than as silence.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.rank: int = int(inner.rank)
        self.world_size: int = int(inner.world_size)
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # a rank's two channels may run on two threads

    def _add(self, op: str, send: Sequence[int], recv: Sequence[int], out_to: set[int], in_from: set[int]) -> None:
        with self._lock:
            self.log.append({"op": op, "send": list(send), "recv": list(recv), "out_to": out_to, "in_from": in_from})

    def _others(self) -> set[int]:
        return {r for r in range(self.world_size) if r != self.rank}

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        out: np.ndarray = self.inner.all_gather(row, channel=channel, timeout=timeout)
        n = int(np.asarray(row).nbytes)  # the torch backend: an alltoallv of the row to every rank
        w = self.world_size
        self._add("all_gather", [n] * w, [n] * w, self._others(), self._others())
        return out

    def all_to_all(
        self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], *, channel: int, timeout: float
    ) -> np.ndarray:
        out: np.ndarray = self.inner.all_to_all(send, send_counts, recv_counts, channel=channel, timeout=timeout)
        self._add(
            "all_to_all", [int(c) for c in send_counts], [int(c) for c in recv_counts], self._others(), self._others()
        )
        return out

    def scatter(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        out: np.ndarray = self.inner.scatter(send, size, root=root, channel=channel, timeout=timeout)
        w, me = self.world_size, self.rank
        if me == root:
            self._add("scatter", [size] * w, [size if s == me else 0 for s in range(w)], self._others(), set())
        else:
            self._add("scatter", [0] * w, [size if s == root else 0 for s in range(w)], set(), {root})
        return out

    def gather(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        out: np.ndarray = self.inner.gather(send, size, root=root, channel=channel, timeout=timeout)
        w, me = self.world_size, self.rank
        if me == root:
            self._add("gather", [size if d == me else 0 for d in range(w)], [size] * w, set(), self._others())
        else:
            self._add("gather", [size if d == root else 0 for d in range(w)], [0] * w, {root}, set())
        return out

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not callable(attr) or name.startswith("_") or name in ("abandon", "abort", "release"):
            return attr

        def unmodelled(*args: Any, **kwargs: Any) -> Any:
            self._add(f"unmodelled:{name}", [], [], set(), set())
            return attr(*args, **kwargs)

        return unmodelled


def summarize(log: list[dict[str, Any]], me: int) -> dict[str, Any]:
    """One call's (or step's) counts from rank ``me``'s point of view (its copy to itself excluded)."""
    out = dict.fromkeys(COUNTS, 0)
    peers: set[int] = set()
    data_peers: set[int] = set()
    for c in log:
        send, recv = c["send"], c["recv"]
        out["collectives"] += 1
        out["posted_out"] += len(c["out_to"])
        out["posted_in"] += len(c["in_from"])
        sent = {d for d, b in enumerate(send) if d != me and b > 0}
        got = {s for s, b in enumerate(recv) if s != me and b > 0}
        out["data_out"] += len(sent)
        out["data_in"] += len(got)
        out["bytes_out"] += sum(b for d, b in enumerate(send) if d != me)
        out["bytes_in"] += sum(b for s, b in enumerate(recv) if s != me)
        out["recv_buffer_peak"] = max(out["recv_buffer_peak"], sum(recv))
        peers |= c["out_to"] | c["in_from"]
        data_peers |= sent | got
    out["peers"] = len(peers)
    out["data_peers"] = len(data_peers)
    out["ops"] = [c["op"] for c in log]
    out["op_bytes_out"] = [sum(b for d, b in enumerate(c["send"]) if d != me) for c in log]
    return out


# --------------------------------------------------------------------------------------------- rank body


def rank_body(rank: int, world_size: int, mode: str, cfg: dict[str, Any]) -> dict[str, Any]:
    """One thread-rank: ``warmup`` calls of ``mode``, then ``calls`` counted ones; their counts."""
    from _scale_ranks import make_rewards, trl_batch  # the same rewards as on real ranks

    import syncreward

    rec = Counting(syncreward.resolve_backend("auto"))
    fns = make_rewards(mode, rec, float(cfg["timeout"]))
    per_call = []
    for i in range(cfg["warmup"] + cfg["calls"]):
        kw = trl_batch(rank, i + 1, cfg["samples"], cfg["ids"])  # new lists every step, as TRL
        rec.log.clear()
        for f in fns:
            f(**kw)
        if i >= cfg["warmup"]:
            per_call.append(summarize(rec.log, rank))
    steady = all(c == per_call[0] for c in per_call)
    return {"counts": per_call[0], "steady": steady}


def frame_bytes(samples: int, ids: int) -> int:
    """One rank's encoded payload (the columns scale.py's rewards read), as on the wire."""
    from _scale_ranks import trl_batch

    from syncreward._codec import Column, container_of, encode_frame

    kw = trl_batch(0, 0, samples, ids)
    cols = []
    for k in sorted(("prompts", "completions", "completion_ids", "solution")):
        code = container_of(kw[k])
        assert code is not None
        cols.append(Column(k, code, kw[k]))
    return len(encode_frame(cols, samples))


# --------------------------------------------------------------------------------------------- the model


def model(design: str, mode: str, w: int, rank: int, p: dict[str, int]) -> dict[str, int]:
    """Closed-form per-call counts of rank ``rank`` at W = ``w`` (the keys this design pins down).

    ``design`` is ``mesh`` (the inbound exchange of every mode is an ``alltoallv``) or ``root`` (``main``
    routes through rank 0: a ``gather`` in, a ``scatter`` out; a reward group's later members keep an
    ``alltoallv``; ``replicate`` and ``shard`` are the same in both designs). ``p``: ``frame`` (bytes of one
    rank's encoded payload) and ``cap`` (the result block rank 0 sends each rank, per reward).

    Messages and peers are exact in both designs. Bytes are exact for ``mesh`` (``benchmarks/scale.py``'s
    model, checked on real gloo ranks); for ``root`` they depend on the block layout the root-routed
    exchange chooses, so only the relations that make it O(W) are pinned (see :func:`check`).
    """
    import scale  # benchmarks/scale.py: the byte model of the mesh design, measured on gloo

    k = REWARDS if mode == "step3" else 1
    others = w - 1
    if mode in ("main", "step3") and design == "root":
        hits = k - 1  # a reward group's later members: an alltoallv each (results + check records)
        if rank == 0:
            posted_out, posted_in = others * k, others * k  # scatter(s) out, the gather in, the hits both ways
            data_out, data_in = others * k, others * (1 + hits)
        else:
            posted_out, posted_in = 1 + others * hits, 1 + others * hits
            data_out, data_in = 1 + others * hits, 1 + others * hits
        peers = others if rank == 0 or hits else min(1, others)
        return {
            "collectives": 1 + k,
            "posted_out": posted_out,
            "posted_in": posted_in,
            "data_out": data_out,
            "data_in": data_in,
            "peers": peers,
            "data_peers": peers,
        }
    m = scale.model(mode, w, rank, {"frame": p["frame"], "cap": p["cap"], "rewards": REWARDS})
    colls = m["collectives"]
    if mode in ("main", "step3"):
        scatters = 1  # the first reward's results; every other collective is an alltoallv
        a2a = colls - scatters
        posted_out = a2a * others + (others if rank == 0 else 0)
        posted_in = a2a * others + (0 if rank == 0 else min(1, others))
    else:
        posted_out = posted_in = colls * others  # replicate, shard: alltoallv only
    return {
        "collectives": colls,
        "posted_out": posted_out,
        "posted_in": posted_in,
        "data_out": m["msgs_out"],
        "data_in": m["msgs_in"],
        "peers": others,
        "data_peers": others,
        "bytes_out": m["bytes_out"],
        "bytes_in": m["bytes_in"],
        "recv_buffer_peak": m["recv_buffer_peak"],
    }


def designs_for(mode: str) -> tuple[str, ...]:
    return ("mesh", "root") if mode in ("main", "step3") else ("mesh",)


def check(design: str, mode: str, w: int, counts: list[dict[str, Any]], p: dict[str, int]) -> list[str]:
    """Where ``counts`` (every rank's) differ from the model of ``design``: one line each, [] if it matches."""
    bad = []
    for rank, c in enumerate(counts):
        unknown = [op for op in c["ops"] if op.startswith("unmodelled:")]
        if unknown:
            bad.append(f"rank {rank}: collectives no model knows: {sorted(set(unknown))}")
        for key, want in model(design, mode, w, rank, p).items():
            if c[key] != want:
                bad.append(f"rank {rank}: {key} {c[key]}, model {want}")
    if design == "root" and mode == "main" and w > 1 and not bad:
        # the bytes of the root-routed design: every other rank sends rank 0 the same block and gets one back
        outs = {c["bytes_out"] for c in counts[1:]}
        ins = {c["bytes_in"] for c in counts[1:]}
        if len(outs) != 1 or len(ins) != 1:
            bad.append(f"ranks 1..W-1 send {sorted(outs)} and receive {sorted(ins)} bytes: not one block each")
        elif counts[0]["bytes_in"] != (w - 1) * outs.pop() or counts[0]["bytes_out"] != (w - 1) * ins.pop():
            bad.append("rank 0's bytes are not W-1 times a non-scoring rank's")
    return bad[:20]


# --------------------------------------------------------------------------------------------- driver


def result_block(rank0: dict[str, Any], w: int) -> int:
    """The result block rank 0 sends each rank: its first ``scatter``'s bytes over W - 1 (0 if none)."""
    for op, sent in zip(rank0["ops"], rank0["op_bytes_out"], strict=True):
        if op == "scatter" and w > 1:
            return sent // (w - 1)
    return 0


def run_one(mode: str, w: int, cfg: dict[str, Any]) -> dict[str, Any]:
    from syncreward.testing import run_threads

    t0 = time.perf_counter()
    ranks = run_threads(rank_body, w, mode, cfg, timeout=float(cfg["run_timeout"]))
    took = time.perf_counter() - t0
    counts = [r["counts"] for r in ranks]
    p = {**cfg["params"], "cap": result_block(counts[0], w)}
    verdicts = {d: check(d, mode, w, counts, p) for d in designs_for(mode)}
    matches = [d for d, bad in verdicts.items() if not bad]
    r0, r1 = counts[0], counts[1] if w > 1 else counts[0]
    return {
        "world_size": w,
        "mode": mode,
        "seconds": took,
        "steady": all(r["steady"] for r in ranks),
        "rank0": {k: r0[k] for k in COUNTS},
        "other": {k: r1[k] for k in COUNTS},
        "others_alike": all({k: c[k] for k in COUNTS} == {k: r1[k] for k in COUNTS} for c in counts[1:]),
        "ops_rank0": r0["ops"],
        "ops_other": r1["ops"],
        "posted_total": sum(c["posted_out"] for c in counts),
        "data_total": sum(c["data_out"] for c in counts),
        "bytes_total": sum(c["bytes_out"] for c in counts),
        "result_block": p["cap"],
        "matches": matches,
        "mismatches": {d: bad for d, bad in verdicts.items() if bad},
    }


def git_commit() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "syncreward"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (syncreward/ modified)" if dirty else "")


def _n(x: int) -> str:
    return f"{x:,}"


def markdown(res: dict[str, Any]) -> str:
    meta = res["meta"]
    lines = [
        "# Simulated transport: counts per call at W ranks (`benchmarks/simulate.py`)",
        "",
        f"Command: `{meta['command']}`  ",
        f"syncreward {meta['commit']}, wire version {meta['wire_version']}, header {meta['header_bytes']} bytes; "
        f"Python {meta['python']}, numpy {meta['numpy']}; {meta['date']}.  ",
        f"Payload per rank and call: {meta['samples']} samples, {_n(meta['params']['frame'])} bytes encoded; "
        "result block per rank and reward read off rank 0's scatter (`result_block` in the JSON). "
        f"{meta['warmup']} warm-up calls, then {meta['calls']} counted "
        f"(a `step3` call is a step of {REWARDS} rewards).  ",
        "Posted: (source, destination) pairs a collective touches as gloo runs it (an `alltoallv` posts to "
        "every peer, even for 0 bytes); data: those with bytes. Peers: distinct ranks a call touches. "
        "Bytes exclude a rank's copy to itself. Model: the design whose closed form every rank's counts "
        "match exactly (`mesh`: inbound `alltoallv`; `root`: `main` through rank 0).",
        "",
        "| W | mode | collectives | posted out, rank 0 / other | data out, rank 0 / other | posted in all "
        "| data in all | peers, rank 0 / other | bytes out, rank 0 / other | bytes in, rank 0 / other "
        "| receive buffer, rank 0 / other | model | s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|:-:|---:|",
    ]
    for r in res["runs"]:
        a, b = r["rank0"], r["other"]
        model_word = ", ".join(r["matches"]) if r["matches"] else "**none**"
        if not (r["steady"] and r["others_alike"]):
            model_word += " (calls or ranks differ)"
        lines.append(
            f"| {r['world_size']} | `{r['mode']}` | {a['collectives']} | {_n(a['posted_out'])} / {_n(b['posted_out'])} "
            f"| {_n(a['data_out'])} / {_n(b['data_out'])} | {_n(r['posted_total'])} | {_n(r['data_total'])} "
            f"| {_n(a['peers'])} / {_n(b['peers'])} | {_n(a['bytes_out'])} / {_n(b['bytes_out'])} "
            f"| {_n(a['bytes_in'])} / {_n(b['bytes_in'])} | {_n(a['recv_buffer_peak'])} / {_n(b['recv_buffer_peak'])} "
            f"| {model_word} | {r['seconds']:.1f} |"
        )
    bad = [r for r in res["runs"] if not r["matches"]]
    lines += ["", f"Every rank matches a model: **{'yes' if res['model_ok'] else 'no'}**."]
    for r in bad:
        for d, why in r["mismatches"].items():
            lines.append(f"* W = {r['world_size']}, `{r['mode']}`, `{d}`: " + "; ".join(why[:4]))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2**i for i in range(1, 11)])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--max-w-others", type=int, default=256, help="largest W for modes other than main")
    from syncreward._wire import BLOCK_LAG

    ap.add_argument("--warmup", type=int, default=BLOCK_LAG + 2, help="untimed calls first (default: past BLOCK_LAG)")
    ap.add_argument("--calls", type=int, default=1)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--ids", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=900.0, help="each synced call's timeout, seconds")
    ap.add_argument("--run-timeout", type=float, default=3600.0, help="one W's run_threads launch, seconds")
    ap.add_argument("--out-dir", type=Path, default=None, help="writes simulate.json and simulate.md there")
    args = ap.parse_args(argv)

    from syncreward import _wire

    frame = frame_bytes(args.samples, args.ids)
    cfg: dict[str, Any] = {
        "warmup": args.warmup,
        "calls": args.calls,
        "samples": args.samples,
        "ids": args.ids,
        "timeout": args.timeout,
        "run_timeout": args.run_timeout,
        "params": {"frame": frame},
    }
    meta = {
        "command": "python " + " ".join(shlex.quote(a) for a in [f"benchmarks/{Path(__file__).name}", *sys.argv[1:]]),
        "commit": git_commit(),
        "wire_version": hex(_wire.VERSION),
        "header_bytes": _wire.HEADER_BYTES,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "samples": args.samples,
        "warmup": args.warmup,
        "calls": args.calls,
        "world_sizes": args.world_sizes,
        "modes": args.modes,
        "params": cfg["params"],
    }
    runs = []
    for w in sorted(args.world_sizes):
        for mode in args.modes:
            if mode != "main" and w > args.max_w_others:
                continue
            r = run_one(mode, w, cfg)
            runs.append(r)
            a, b = r["rank0"], r["other"]
            print(
                f"W={w:5d} {mode:9s} posted out {a['posted_out']:6d}/{b['posted_out']:5d} "
                f"data out {a['data_out']:6d}/{b['data_out']:5d} peers {a['peers']:5d}/{b['peers']:5d} "
                f"bytes out {a['bytes_out']:9d}/{b['bytes_out']:7d}  model {','.join(r['matches']) or 'NONE'}  "
                f"{r['seconds']:.1f}s",
                flush=True,
            )
    res = {"meta": meta, "runs": runs, "model_ok": all(r["matches"] and r["steady"] for r in runs)}
    md = markdown(res)
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "simulate.json").write_text(json.dumps(res, indent=1) + "\n")
        (args.out_dir / "simulate.md").write_text(md)
    print(md)
    return 0 if res["model_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
