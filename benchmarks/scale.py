"""Scale model: what syncreward costs per call at W ranks, measured at small W and checked against a model.

Usage (from the repository root)::

    python benchmarks/scale.py --world-sizes 2 4 8 16 32 --out benchmarks/results/scale/scale.json \
        --markdown benchmarks/results/scale/scale.md

For each world size W this launches W local gloo ranks once (``syncreward.testing.run_ranks``) and, in
every rank, wraps a ``TorchDistributedBackend`` in a recording backend that logs the arguments of every
collective syncreward makes: from them come, per rank and per call, the collectives, the *messages*
((src, dst) pairs with a nonzero byte count), the bytes sent and received (self-copies excluded) and the
receive buffers. For each mode -- ``main``, ``replicate``, ``shard`` (``group_size=2``) and a
3-reward step (``synced_rewards(..., mode="main")``) -- it makes ``--warmup`` calls, then ``--calls``
steady-state calls with a small TRL-like payload (``--samples`` per rank: a prompt, a completion,
``--ids`` token ids and a solution string each; every rank's payload has the same size on every call).

It also records, per rank: open sockets (``/proc/self/fd`` links ``socket:[...]``, split into listening
and established TCP sockets via ``/proc/net/tcp*``) before syncreward's first call and after it (the
call that creates syncreward's two gloo groups), threads, RSS, write system calls per call (evidence of
the messages gloo really sends: it posts one send per peer even for zero bytes) and wall times.

Counts are exact and do not depend on the machine. Wall times at W >= 4 on a 2-core machine measure
oversubscription (W processes share 2 cores) and are reported as such.

Then it checks the closed-form model (:func:`model`) against every measured rank at every W, and
extrapolates it to larger W (``--extrapolate``), for this payload and for a TRL-sized one.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

MODES = ("main", "replicate", "shard", "step3")
# replicate's status row: [status, blob bytes, *CallCheck] int64 (fingerprint, seq, step, shared digest, desc bytes)
HEADER_ROW_STATUS = 7 * 8
SHARD_EMPTY_FRAME = 112  # shard: the result frame a scoring rank sends a rank it scored nothing for (keys, logs, count)
TRL_FRAME = 197_024  # one rank's frame of the benchmark `trl` payload (64 completions of ~1 KB + ~250 ids)
TRL_RESULT_CAP = 8 * 64 * 2  # order of one rank's result block for 64 floats (only its growth with W matters)


# --------------------------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    """bench_exchange's machine record, plus memory and the descriptor limit (what scale depends on)."""
    import resource

    from bench_exchange import machine as base

    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = int(line.split()[1]) // 1024
    except OSError:
        pass
    return {**base(), "mem_mib": mem, "ulimit_n": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}


def git_commit() -> str:
    import subprocess

    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=HERE.parent, capture_output=True, text=True, timeout=10
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "syncreward"], cwd=HERE.parent, capture_output=True, text=True
        ).stdout.strip()
        return out.stdout.strip() + (" (syncreward/ modified)" if dirty else "")
    except (OSError, Exception):
        return "unknown"


# --------------------------------------------------------------------------------------------- the model


def round8(n: int) -> int:
    return (n + 7) // 8 * 8


def eager(frame: int) -> int:
    """The eager chunk a rank's payload rides in, in the steady state (``_wire.eager_sizes``)."""
    from syncreward._wire import EAGER_MARGIN, MAX_EAGER

    return min(MAX_EAGER, round8(int(frame * EAGER_MARGIN)))


def model(mode: str, w: int, rank: int, p: dict[str, int]) -> dict[str, int]:
    """Per-call counts of one rank in the steady state, in closed form.

    ``p``: ``frame`` (bytes of one rank's encoded columns), ``cap`` (main: the result block rank 0
    sends each rank, one per reward), ``rewards`` (rewards per step, step3). Messages are (src, dst)
    pairs with a nonzero byte count; bytes exclude a rank's copy to itself.
    """
    from syncreward._wire import HEADER_BYTES as H
    from syncreward._wire import FailedCheck  # a hit's check record: the call's CallCheck and its error size

    e = eager(p["frame"])
    caps = p["cap"] * (p.get("rewards", 1) if mode == "step3" else 1)
    k = p.get("rewards", 1) if mode == "step3" else 1
    if mode in ("main", "step3"):
        # inbound (issue 31, part E): one gather of one B-byte block per rank to rank 0 (B: the header and the
        # payload, with the eager headroom: _wire.block_for); outbound: one block per rank from rank 0.
        # step3 (a reward group): the first reward gathers; each later one (a hit) sends its results in an
        # all_to_all in which every rank also sends every other rank its FailedCheck record
        from syncreward._wire import block_for

        b = block_for([p["frame"]])
        hits = k - 1
        c = FailedCheck.SIZE * (w - 1) * hits  # check-record bytes a rank sends (and receives) over the hits
        if rank == 0:
            return {
                "collectives": 1 + k,
                "msgs_out": k * (w - 1),
                "msgs_in": (w - 1) * (1 + hits),
                "bytes_out": (w - 1) * caps + c,
                "bytes_in": (w - 1) * b + c,
                "recv_buffer_peak": w * b,
            }
        return {
            "collectives": 1 + k,
            "msgs_out": 1 + (w - 1) * hits,
            "msgs_in": 1 + (w - 1) * hits,
            "bytes_out": b + c,
            "bytes_in": caps + c,
            "recv_buffer_peak": p["cap"] + FailedCheck.SIZE * (w - 1) if hits else p["cap"],
        }
    if mode == "replicate":
        # inbound: header + payload to every rank; a status all_gather
        return {
            "collectives": 2,
            "msgs_out": 2 * (w - 1),
            "msgs_in": 2 * (w - 1),
            "bytes_out": (w - 1) * (H + e + HEADER_ROW_STATUS),
            "bytes_in": (w - 1) * (H + e + HEADER_ROW_STATUS),
            "recv_buffer_peak": w * H + (w - 1) * e,
        }
    if mode == "shard":
        # groups whole on their rank: headers, a row of W+2 sizes to every rank, nothing, a row of W+3 sizes to
        # every rank, an (empty) result frame to every rank
        rows = 8 * (2 + w) + 8 * (3 + w)
        return {
            "collectives": 5,
            "msgs_out": 4 * (w - 1),
            "msgs_in": 4 * (w - 1),
            "bytes_out": (w - 1) * (H + rows + SHARD_EMPTY_FRAME),
            "bytes_in": (w - 1) * (H + rows + SHARD_EMPTY_FRAME),
            "recv_buffer_peak": max(w * H, 8 * w * (3 + w), (w - 1) * SHARD_EMPTY_FRAME),
        }
    raise ValueError(mode)


def wire_msgs(mode: str, w: int, collectives: int) -> int:
    """gloo messages per call in the steady state (an alltoallv W(W-1), empty ones included, a scatter W-1)."""
    if mode == "main":  # a gather and a scatter
        return 2 * (w - 1)
    if mode == "step3":  # the gather, the first reward's scatter, then one alltoallv per hit
        return 2 * (w - 1) + (collectives - 2) * w * (w - 1)
    return collectives * w * (w - 1)


def totals(mode: str, w: int, p: dict[str, int]) -> dict[str, int]:
    """Whole-job counts per call: messages, gloo wire messages, bytes."""
    r0 = model(mode, w, 0, p)
    rk = model(mode, w, 1, p) if w > 1 else r0
    coll = r0["collectives"]
    return {
        "collectives": coll,
        "msgs_total": r0["msgs_out"] + (w - 1) * rk["msgs_out"],
        # gloo's alltoallv posts a send to every peer, even of 0 bytes; main's results go in a scatter: W - 1,
        # a reward group's hits in an alltoallv
        "wire_msgs_total": wire_msgs(mode, w, coll),
        "bytes_total": r0["bytes_out"] + (w - 1) * rk["bytes_out"],
        "recv_buffer_rank0": r0["recv_buffer_peak"],
        "recv_buffer_other": rk["recv_buffer_peak"],
        "bytes_out_rank0": r0["bytes_out"],
        "bytes_out_other": rk["bytes_out"],
        "msgs_out_rank0": r0["msgs_out"],
        "msgs_out_other": rk["msgs_out"],
    }


GROUPS = 2  # syncreward's gloo groups (one per channel)


def sockets_added(w: int) -> int:
    """Sockets a rank opens for syncreward's groups: per group one listening socket and W-1 connections."""
    return GROUPS * ((w - 1) + 1)


# --------------------------------------------------------------------------------------------- aggregation


def aggregate(w: int, ranks: list[dict[str, Any]], cfg: dict[str, Any]) -> dict[str, Any]:
    r0 = ranks[0]
    frame = r0["frame_bytes"]
    cap = r0["modes"]["main"]["counts"]["detail"][1]["bytes_out"] // max(w - 1, 1) if "main" in r0["modes"] else 0
    params = {"frame": frame, "cap": cap, "rewards": 3}
    out: dict[str, Any] = {"world_size": w, "params": params, "modes": {}, "process": {}}
    keys = ("collectives", "msgs_out", "msgs_in", "bytes_out", "bytes_in", "recv_buffer_peak")
    for mode in cfg["modes"]:
        per_rank = [r["modes"][mode]["counts"] for r in ranks]
        mismatches = []
        for rank, c in enumerate(per_rank):
            want = model(mode, w, rank, params)
            for k in keys:
                if c[k] != want[k]:
                    mismatches.append({"rank": rank, "key": k, "measured": c[k], "model": want[k]})
        walls = np.max(np.array([r["modes"][mode]["wall_s"] for r in ranks]), axis=0)  # slowest rank, per call
        cpu0 = float(np.median(ranks[0]["modes"][mode]["cpu_s"]) * 1e3)
        cpu_others = (
            float(np.median([np.median(r["modes"][mode]["cpu_s"]) for r in ranks[1:]]) * 1e3) if w > 1 else cpu0
        )
        syscw = [r["modes"][mode]["syscw"] for r in ranks]
        out["modes"][mode] = {
            "rank0": {k: per_rank[0][k] for k in keys},
            "rank1": {k: per_rank[1][k] for k in keys} if w > 1 else None,
            "msgs_total": sum(c["msgs_out"] for c in per_rank),
            "bytes_total": sum(c["bytes_out"] for c in per_rank),
            "steady": all(r["modes"][mode]["steady"] for r in ranks),
            "model_mismatches": mismatches,
            "wall_median_ms": float(np.median(walls) * 1e3),
            "wall_p90_ms": float(np.percentile(walls, 90) * 1e3),
            "cpu_ms_rank0": cpu0,
            "cpu_ms_others": cpu_others,
            "syscw_per_call": sorted({int(np.median(s)) for s in syscw}),
            "detail_rank0": per_rank[0]["detail"],
            "detail_rank1": per_rank[1]["detail"] if w > 1 else None,
        }
    for label, key in (("before", "before"), ("after", "after_first_call"), ("end", "end")):
        out["process"][label] = {
            "sockets_rank0": ranks[0][key]["sockets"],
            "sockets_rank1": ranks[1][key]["sockets"] if w > 1 else None,
            "threads": sorted({r[key]["threads"] for r in ranks}),
            "rss_mib_max": max(r[key]["rss_kib"] for r in ranks) / 1024,
            "fds_max": max(r[key]["fds"] for r in ranks),
        }
    out["process"]["sockets_added"] = sorted(
        {r["after_first_call"]["sockets"]["total"] - r["before"]["sockets"]["total"] for r in ranks}
    )
    out["process"]["threads_added"] = sorted({r["after_first_call"]["threads"] - r["before"]["threads"] for r in ranks})
    out["process"]["rss_added_mib"] = [
        min(r["end"]["rss_kib"] - r["before"]["rss_kib"] for r in ranks) / 1024,
        max(r["end"]["rss_kib"] - r["before"]["rss_kib"] for r in ranks) / 1024,
    ]
    out["process"]["first_call_ms_max"] = max(r["first_call_s"] for r in ranks) * 1e3
    probe = np.max(np.array([r["probe_header_all_to_all_s"] for r in ranks]), axis=0)
    out["probe_header_all_to_all_ms"] = float(np.median(probe) * 1e3)
    out["probe_header_all_to_all_cpu_ms"] = float(
        np.median([np.median(r["probe_header_all_to_all_cpu_s"]) for r in ranks]) * 1e3
    )
    return out


# --------------------------------------------------------------------------------------------- reports


def _b(n: float) -> str:
    n = float(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} B"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _wire_messages(detail: list[dict[str, Any]], w: int) -> int:
    """Messages gloo sends for a call's collectives: an alltoallv W(W-1) (empty ones included), a scatter W-1."""
    return sum(w - 1 if c["op"] == "scatter" else w * (w - 1) for c in detail)


def measured_table(results: dict[str, Any]) -> str:
    lines = [
        "| W | mode | collectives | messages out, rank 0 / others | messages in all | gloo wire messages in all "
        "| bytes out, rank 0 / others | bytes moved in all | receive buffer, rank 0 / others | write syscalls per rank "
        "| model | CPU ms per call, rank 0 / others | wall ms, median of slowest rank |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|:-:|---:|---:|",
    ]
    for ws, res in sorted(results["world_sizes"].items(), key=lambda kv: int(kv[0])):
        w = int(ws)
        for mode, m in res["modes"].items():
            r0, r1 = m["rank0"], m["rank1"] or m["rank0"]
            ok = "exact" if not m["model_mismatches"] else f"{len(m['model_mismatches'])} off"
            lines.append(
                f"| {w} | `{mode}` | {r0['collectives']} | {r0['msgs_out']} / {r1['msgs_out']} | {m['msgs_total']:,} "
                f"| {_wire_messages(m['detail_rank0'], w):,} | {r0['bytes_out']:,} / {r1['bytes_out']:,} "
                f"| {m['bytes_total']:,} | {r0['recv_buffer_peak']:,} / {r1['recv_buffer_peak']:,} "
                f"| {', '.join(str(x) for x in m['syscw_per_call'])} | {ok} "
                f"| {m['cpu_ms_rank0']:.1f} / {m['cpu_ms_others']:.1f} | {m['wall_median_ms']:.1f} |"
            )
    return "\n".join(lines)


def process_table(results: dict[str, Any]) -> str:
    lines = [
        "| W | sockets before, rank 0 / rank 1 | sockets added by syncreward (every rank) | model 2W "
        "| threads added | RSS per rank before (max) | RSS added (min-max) | first call (group setup), ms "
        "| one header all_to_all: wall ms (slowest rank), CPU ms per rank |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for ws, res in sorted(results["world_sizes"].items(), key=lambda kv: int(kv[0])):
        w = int(ws)
        pr = res["process"]
        b0, b1 = pr["before"]["sockets_rank0"], pr["before"]["sockets_rank1"] or {}
        added = ", ".join(str(x) for x in pr["sockets_added"])
        lines.append(
            f"| {w} | {b0['total']} / {b1.get('total', '-')} | {added} | {sockets_added(w)} "
            f"| {', '.join(str(x) for x in pr['threads_added'])} | {pr['before']['rss_mib_max']:.0f} MiB "
            f"| {pr['rss_added_mib'][0]:.1f}-{pr['rss_added_mib'][1]:.1f} MiB | {pr['first_call_ms_max']:.0f} "
            f"| {res['probe_header_all_to_all_ms']:.2f}, {res['probe_header_all_to_all_cpu_ms']:.2f} |"
        )
    return "\n".join(lines)


def extrapolation_table(sizes: list[int], params: dict[str, int], label: str) -> str:
    lines = [
        f"**{label}**",
        "",
        "| W | mode | collectives | messages per call in all (nonzero) | gloo wire messages in all "
        "| bytes out, rank 0 / others | bytes moved in all | receive buffer, rank 0 / others |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for w in sizes:
        for mode in MODES:
            t = totals(mode, w, params)
            lines.append(
                f"| {w:,} | `{mode}` | {t['collectives']} | {t['msgs_total']:,} | {t['wire_msgs_total']:,} "
                f"| {_b(t['bytes_out_rank0'])} / {_b(t['bytes_out_other'])} | {_b(t['bytes_total'])} "
                f"| {_b(t['recv_buffer_rank0'])} / {_b(t['recv_buffer_other'])} |"
            )
    return "\n".join(lines)


def time_fit(results: dict[str, Any]) -> dict[str, Any]:
    """Least-squares fits of one header all_to_all.

    * wall time of the slowest rank, to a + b W (W - 1) at W >= 4: on a machine with fewer cores than ranks
      every message of the job is processed on the same cores;
    * CPU time of one rank (all its threads), to c + d (W - 1): what a rank spends per peer, which does not
      depend on oversubscription as much (it still includes scheduler and cache effects).
    """
    ws = results["world_sizes"]
    pts = [(int(w), r["probe_header_all_to_all_ms"]) for w, r in ws.items() if int(w) >= 4]
    cpts = [(int(w), r["probe_header_all_to_all_cpu_ms"]) for w, r in ws.items()]
    out: dict[str, Any] = {}
    if len(pts) >= 2:
        b, a = np.polyfit(np.array([w * (w - 1) for w, _ in pts], dtype=float), np.array([t for _, t in pts]), 1)
        out.update({"wall_a_ms": float(a), "wall_b_ms_per_message": float(b), "wall_points": pts})
    if len(cpts) >= 2:
        d, c = np.polyfit(np.array([w - 1 for w, _ in cpts], dtype=float), np.array([t for _, t in cpts]), 1)
        out.update({"cpu_c_ms": float(c), "cpu_d_ms_per_peer": float(d), "cpu_points": cpts})
    calls: dict[str, Any] = {}
    modes = next(iter(ws.values()))["modes"] if ws else {}
    for mode in modes:
        for who in ("rank0", "others"):
            pts2 = [(int(w), r["modes"][mode][f"cpu_ms_{who}"]) for w, r in ws.items() if mode in r["modes"]]
            if len(pts2) >= 2:
                d, c = np.polyfit(np.array([w - 1 for w, _ in pts2], dtype=float), np.array([t for _, t in pts2]), 1)
                calls[f"{mode}/{who}"] = {"c_ms": float(c), "d_ms_per_peer": float(d)}
    out["call_cpu"] = calls
    return out


def wire_cpu(sizes: list[int], frame: int) -> dict[str, Any]:
    """Single-process CPU time of the per-call size arithmetic every rank runs in the inbound exchange.

    ``Predictor.update`` (``eager_sizes``) and ``remainder_counts`` run on every rank for every ``main``
    and ``replicate`` call, over the mode's route matrix (``main``: every rank to rank 0; ``replicate``:
    every rank to every other rank), as numpy expressions.
    """
    from syncreward._modes import MODES
    from syncreward._wire import eager_sizes, remainder_counts

    def best(fn: Any, reps: int) -> float:
        out = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            out = min(out, time.perf_counter() - t0)
        return out * 1e3

    rows = {}
    for w in sizes:
        payload = [frame] * w
        reps = 3 if w <= 256 else 1
        row: dict[str, Any] = {"matrix_bytes": 8 * w * w}
        for mode in ("main", "replicate"):
            route = MODES[mode].route(w)  # type: ignore[attr-defined]
            e = eager_sizes(payload, route)
            row[f"{mode}_eager_sizes_ms"] = best(lambda p=payload, r=route: eager_sizes(p, r), reps)
            row[f"{mode}_remainder_counts_ms"] = best(lambda p=payload, e=e, r=route: remainder_counts(p, e, r), reps)
        rows[str(w)] = row
        print(f"wire arithmetic W={w}: {row}", file=sys.stderr, flush=True)
    return rows


def wire_cpu_table(rows: dict[str, Any]) -> str:
    lines = [
        "| W | `main`: eager_sizes + remainder_counts, ms | `replicate`: eager_sizes + remainder_counts, ms "
        "| one predicted-size matrix |",
        "|---:|---:|---:|---:|",
    ]
    for w, r in rows.items():
        lines.append(
            f"| {int(w):,} | {r['main_eager_sizes_ms']:.2f} + {r['main_remainder_counts_ms']:.2f} "
            f"| {r['replicate_eager_sizes_ms']:.1f} + {r['replicate_remainder_counts_ms']:.1f} "
            f"| {_b(r['matrix_bytes'])} |"
        )
    return "\n".join(lines)


def markdown(results: dict[str, Any], extrapolate: list[int]) -> str:
    m = results["machine"]
    first = next(iter(results["world_sizes"].values()))
    params = first["params"]
    parts = [
        f"Command: `{results['command']}`  ",
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['mem_mib']:,} MiB RAM, Python {m['python']}, torch "
        f"{m['torch']}, {m['platform']}; syncreward {results['git']}; {results['date']}.  ",
        f"Payload per rank and call: {results['config']['samples']} samples, {params['frame']:,} bytes encoded; "
        f"result block per rank {params['cap']} bytes.",
        "",
        "### Counts per call (steady state)",
        "",
        measured_table(results),
        "",
        "### Process",
        "",
        process_table(results),
        "",
    ]
    fit = results.get("time_fit") or {}
    if "wall_a_ms" in fit:
        parts += [
            f"One header all_to_all, wall time of the slowest rank fitted at W >= 4 ({m['nproc']} shared cores): "
            f"{fit['wall_a_ms']:.2f} ms + {fit['wall_b_ms_per_message'] * 1e3:.1f} us x W(W-1).  ",
        ]
    if "cpu_c_ms" in fit:
        parts += [
            f"CPU time of one rank for it: {fit['cpu_c_ms']:.3f} ms + {fit['cpu_d_ms_per_peer'] * 1e3:.1f} us x (W-1).",
            "",
        ]
    if fit.get("call_cpu"):
        parts += [
            "CPU time per call (all threads of a rank) fitted to c + d (W-1):",
            "",
            "| mode | rank 0 | other ranks |",
            "|---|---:|---:|",
        ]
        cc = fit["call_cpu"]
        for mode in MODES:
            if f"{mode}/rank0" in cc:
                a, b = cc[f"{mode}/rank0"], cc[f"{mode}/others"]
                parts.append(
                    f"| `{mode}` | {a['c_ms']:.2f} ms + {a['d_ms_per_peer'] * 1e3:.0f} us x (W-1) "
                    f"| {b['c_ms']:.2f} ms + {b['d_ms_per_peer'] * 1e3:.0f} us x (W-1) |"
                )
        parts.append("")
    if results.get("wire_cpu"):
        parts += ["### Per-call size arithmetic (single process)", "", wire_cpu_table(results["wire_cpu"]), ""]
    if results.get("fd_limit"):
        fl = results["fd_limit"]
        parts += [
            f"### Descriptor limit (W={fl['world_size']}, limit = open descriptors + {fl['headroom']} on every rank)",
            "",
            "| rank | descriptors before | limit | after | outcome | seconds |",
            "|---:|---:|---:|---:|---|---:|",
            *(
                f"| {r} | {x['fds_before']} | {x['limit']} | {x['fds_after']} | {_cell(x['outcome'])} | {x['s']:.2f} |"
                for r, x in enumerate(fl["ranks"])
            ),
            "",
        ]
    parts += [
        "### Extrapolation",
        "",
        extrapolation_table(extrapolate, params, f"This payload ({params['frame']:,} bytes per rank)"),
        "",
        extrapolation_table(
            extrapolate,
            {"frame": TRL_FRAME, "cap": TRL_RESULT_CAP, "rewards": 3},
            f"The benchmark's `trl` payload ({TRL_FRAME:,} bytes per rank: 64 completions of ~1 KB + ~250 ids)",
        ),
    ]
    return "\n".join(parts)


def text_report(results: dict[str, Any]) -> str:
    out = []
    for ws, res in sorted(results["world_sizes"].items(), key=lambda kv: int(kv[0])):
        pr = res["process"]
        out.append(
            f"W={ws}: frame {res['params']['frame']} B, sockets +{pr['sockets_added']}, "
            f"threads +{pr['threads_added']}, "
            f"RSS +{pr['rss_added_mib'][0]:.1f}..{pr['rss_added_mib'][1]:.1f} MiB, first call "
            f"{pr['first_call_ms_max']:.0f} ms, header all_to_all {res['probe_header_all_to_all_ms']:.2f} ms"
        )
        for mode, m in res["modes"].items():
            r0, r1 = m["rank0"], m["rank1"] or m["rank0"]
            out.append(
                f"  {mode:<10} coll {r0['collectives']}  msgs out r0/r1 {r0['msgs_out']}/{r1['msgs_out']}  "
                f"all {m['msgs_total']}  bytes out r0/r1 {r0['bytes_out']}/{r1['bytes_out']}  recv buf r0/r1 "
                f"{r0['recv_buffer_peak']}/{r1['recv_buffer_peak']}  syscw {m['syscw_per_call']}  "
                f"model {'exact' if not m['model_mismatches'] else m['model_mismatches'][:3]}  "
                f"{m['wall_median_ms']:.1f} ms"
            )
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed calls per mode first (at least 2: a reward group learns its result sizes)",
    )
    ap.add_argument("--calls", type=int, default=10, help="measured calls per mode")
    ap.add_argument("--samples", type=int, default=4, help="samples per rank and call")
    ap.add_argument("--ids", type=int, default=64, help="token ids per completion")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per launch (and syncreward's timeout=)")
    ap.add_argument("--extrapolate", type=int, nargs="+", default=[8, 64, 256, 1024])
    ap.add_argument("--gloo-lazy-init", action="store_true", help="set TORCH_GLOO_LAZY_INIT=1 in the ranks")
    ap.add_argument(
        "--wire-cpu", type=int, nargs="*", default=[8, 64, 256, 1024], help="W for the size-arithmetic timing"
    )
    ap.add_argument(
        "--fd-headroom",
        type=int,
        default=0,
        help="also run one launch of --fd-world-size ranks, each with its descriptor limit set to its open "
        "descriptors + this (0: skip; < 2W makes syncreward's group setup run out)",
    )
    ap.add_argument("--fd-world-size", type=int, default=8)
    ap.add_argument("--out", type=Path, help="write all results as JSON here")
    ap.add_argument("--markdown", type=Path, help="write the markdown tables here")
    ap.add_argument("--from-json", type=Path, help="only re-render the report of a previous --out (no ranks)")
    args = ap.parse_args(argv)
    if args.from_json:
        old: dict[str, Any] = json.loads(args.from_json.read_text())
        old["time_fit"] = time_fit(old)
        print(text_report(old))
        text = markdown(old, args.extrapolate)
        if args.markdown:
            args.markdown.write_text(text + "\n")
        else:
            print(text)
        return old
    if "main" not in args.modes:
        ap.error("--modes must include main (its result block sizes the model)")

    os.environ["OMP_NUM_THREADS"] = "1"
    from _scale_ranks import rank_main

    from syncreward.testing import run_ranks

    cfg = {
        "modes": list(args.modes),
        "warmup": args.warmup,
        "calls": args.calls,
        "samples": args.samples,
        "ids": args.ids,
        "timeout": args.timeout,
    }
    env = {"OMP_NUM_THREADS": "1"}
    if args.gloo_lazy_init:
        env["TORCH_GLOO_LAZY_INIT"] = "1"
    results: dict[str, Any] = {
        "command": "python benchmarks/scale.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:])),
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine(),
        "git": git_commit(),
        "config": cfg,
        "env": env,
        "world_sizes": {},
    }
    for w in args.world_sizes:
        t0 = time.monotonic()
        ranks = run_ranks(rank_main, w, cfg, timeout=args.timeout, env=env)
        res = aggregate(w, ranks, cfg)
        res["launch_s"] = time.monotonic() - t0
        results["world_sizes"][str(w)] = res
        print(f"W={w}: done in {res['launch_s']:.0f}s", file=sys.stderr, flush=True)
    results["time_fit"] = time_fit(results)
    if args.fd_headroom:
        import tempfile

        from _scale_ranks import rank_fd_limit

        from syncreward.testing import RanksFailed

        w = args.fd_world_size
        tmp = tempfile.mkdtemp(prefix="scale-fd-")
        failures: dict[int, str] = {}
        try:
            run_ranks(rank_fd_limit, w, args.fd_headroom, 30.0, tmp, timeout=args.timeout, env=env)
        except RanksFailed as e:
            failures = e.failures
        got = []
        for r in range(w):
            path = Path(tmp) / f"rank{r}.json"
            if path.exists():
                got.append(json.loads(path.read_text()))
            else:
                text = failures.get(r, "")
                why = next((ln.strip() for ln in text.splitlines() if "what():" in ln), text.splitlines()[0:1])
                got.append({"fds_before": -1, "limit": -1, "fds_after": -1, "outcome": f"process died: {why}", "s": 0})
        results["fd_limit"] = {"world_size": w, "headroom": args.fd_headroom, "ranks": got}
        print(f"fd limit W={w} headroom {args.fd_headroom}: {got}", file=sys.stderr, flush=True)
    if args.wire_cpu:
        first = next(iter(results["world_sizes"].values()))
        results["wire_cpu"] = wire_cpu(args.wire_cpu, first["params"]["frame"])
    results["model_exact"] = all(
        not m["model_mismatches"] for r in results["world_sizes"].values() for m in r["modes"].values()
    )
    print(text_report(results))
    print(f"model exact at every measured W and rank: {results['model_exact']}")
    md = markdown(results, args.extrapolate)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(md + "\n")
    return results


if __name__ == "__main__":
    main()
