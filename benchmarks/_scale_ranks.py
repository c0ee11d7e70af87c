"""The code that runs inside each rank of ``scale.py`` (spawned by ``syncreward.testing.run_ranks``).

Kept in its own module so the spawned ranks import it by name. Everything recorded here is exact except
the wall times: counts of collectives, of messages and of bytes (from the arguments of every collective,
seen by a wrapper around the backend), receive buffer sizes, open sockets, threads and memory.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.distributed as dist

from syncreward import synced_reward, synced_rewards
from syncreward._wire import HEADER_BYTES
from syncreward.backends.torch_distributed import TorchDistributedBackend

__all__ = ["MODES", "Recording", "TrainerState", "rank_main", "trl_batch"]

MODES = ("main", "replicate", "shard", "step3")


@dataclass
class TrainerState:
    """Stand-in for ``transformers.TrainerState``, which TRL passes as ``trainer_state``."""

    global_step: int = 0


# --------------------------------------------------------------------------------------------- payload


def trl_batch(rank: int, step: int, n: int, ids: int) -> dict[str, Any]:
    """A small TRL-like reward call: ``n`` samples, short texts, ``ids`` token ids per completion.

    Sizes do not depend on the rank or the step (only the digits do, padded to a fixed width), so every
    rank's payload has the same size on every call and the counts are exact.
    """
    return {
        "prompts": [f"Question {rank:05d}-{i:03d}: what is {i} + {i}? Reason step by step." for i in range(n)],
        "completions": [f"Step {step:06d}: {i} + {i} = {2 * i:03d}. The answer is {2 * i:03d}." for i in range(n)],
        # ids in [70,000, 151,936): the codec's narrowest dtype (uint32) is the same for every rank and step
        "completion_ids": [
            [70_000 + (rank * 7919 + step * 31 + i * 17 + k) % 81_936 for k in range(ids)] for i in range(n)
        ],
        "solution": [f"{2 * i:03d}" for i in range(n)],
        "trainer_state": TrainerState(global_step=step),
        "log_extra": lambda column, values: None,
        "log_metric": lambda name, value: None,
    }


def accuracy(prompts: Any, completions: Any, completion_ids: Any, solution: Any, **kwargs: Any) -> list[float]:
    return [float(c.endswith(f"{s}.")) for c, s in zip(completions, solution, strict=True)]


def length(completions: Any, completion_ids: Any, **kwargs: Any) -> list[float]:
    mean = sum(len(x) for x in completion_ids) / max(len(completion_ids), 1)
    return [len(x) / mean for x in completion_ids]


def fmt(completions: Any, **kwargs: Any) -> list[float]:
    return [float("answer is" in c) for c in completions]


# --------------------------------------------------------------------------------------------- process state


def sockets() -> dict[str, int]:
    """Open sockets of this process, by kind and TCP state (``/proc/self/fd`` + ``/proc/net/*``)."""
    inodes = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.append(link[8:-1])
    kind: dict[str, str] = {}
    for table, name in (("tcp", "tcp"), ("tcp6", "tcp")):
        try:
            with open(f"/proc/self/net/{table}") as f:
                next(f)
                for line in f:
                    parts = line.split()
                    state = {"0A": "listen", "01": "established"}.get(parts[3], "other")
                    kind[parts[9]] = f"{name}_{state}"
        except OSError:
            pass
    try:
        with open("/proc/self/net/unix") as f:
            next(f)
            for line in f:
                parts = line.split()
                if len(parts) >= 7:
                    kind.setdefault(parts[6], "unix")
    except OSError:
        pass
    out: dict[str, int] = {"total": len(inodes)}
    for i in inodes:
        k = kind.get(i, "unknown")
        out[k] = out.get(k, 0) + 1
    return out


def proc_state() -> dict[str, Any]:
    status = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "Threads"):
                status[key] = int(value.split()[0])
    return {
        "sockets": sockets(),
        "threads": status.get("Threads", 0),
        "rss_kib": status.get("VmRSS", 0),
        "hwm_kib": status.get("VmHWM", 0),
        "fds": len(os.listdir("/proc/self/fd")),
    }


def io_counters() -> dict[str, int]:
    """``/proc/self/io``: write/read system calls and bytes of the whole process (every thread)."""
    out = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                out[key] = int(value)
    except OSError:
        pass
    return out


# --------------------------------------------------------------------------------------------- recording backend


class Recording:
    """Wraps a backend; records every collective this rank takes part in (arguments only, exact).

    Per collective: the channel, the kind, and the send/receive byte counts per peer. ``all_gather`` is
    recorded as what it is on the wire of the torch backend: the row sent to every rank.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.log: list[dict[str, Any]] = []

    @property
    def rank(self) -> int:
        return int(self.inner.rank)

    @property
    def world_size(self) -> int:
        return int(self.inner.world_size)

    def _record(self, op: str, channel: int, send: Sequence[int], recv: Sequence[int], t: float) -> None:
        self.log.append({"op": op, "channel": channel, "send": list(send), "recv": list(recv), "s": t})

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        t0 = time.perf_counter()
        out: np.ndarray = self.inner.all_gather(row, channel=channel, timeout=timeout)
        n = int(np.asarray(row).nbytes)
        self._record("all_gather", channel, [n] * self.world_size, [n] * self.world_size, time.perf_counter() - t0)
        return out

    def all_to_all(
        self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], *, channel: int, timeout: float
    ) -> np.ndarray:
        t0 = time.perf_counter()
        out: np.ndarray = self.inner.all_to_all(send, send_counts, recv_counts, channel=channel, timeout=timeout)
        self._record(
            "all_to_all",
            channel,
            [int(c) for c in send_counts],
            [int(c) for c in recv_counts],
            time.perf_counter() - t0,
        )
        return out

    def scatter(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        t0 = time.perf_counter()
        out: np.ndarray = self.inner.scatter(send, size, root=root, channel=channel, timeout=timeout)
        w, me = self.world_size, self.rank
        sent = [size] * w if me == root else [0] * w
        recv = [size if s == root else 0 for s in range(w)]
        self._record("scatter", channel, sent, recv, time.perf_counter() - t0)
        return out

    def gather(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        t0 = time.perf_counter()
        out: np.ndarray = self.inner.gather(send, size, root=root, channel=channel, timeout=timeout)
        w, me = self.world_size, self.rank
        sent = [size if d == root else 0 for d in range(w)]
        recv = [size] * w if me == root else [0] * w
        self._record("gather", channel, sent, recv, time.perf_counter() - t0)
        return out

    def send(self, data: np.ndarray, dst: int, *, channel: int, timeout: float) -> None:
        t0 = time.perf_counter()
        self.inner.send(data, dst, channel=channel, timeout=timeout)
        sent = [int(data.nbytes) if d == dst else 0 for d in range(self.world_size)]
        self._record("send", channel, sent, [0] * self.world_size, time.perf_counter() - t0)

    def recv(self, size: int, src: int, *, channel: int, timeout: float) -> np.ndarray:
        t0 = time.perf_counter()
        out: np.ndarray = self.inner.recv(size, src, channel=channel, timeout=timeout)
        got = [size if s == src else 0 for s in range(self.world_size)]
        self._record("recv", channel, [0] * self.world_size, got, time.perf_counter() - t0)
        return out


def summarize(log: list[dict[str, Any]], me: int) -> dict[str, Any]:
    """One call's (or step's) collectives, from this rank's point of view (self-copies excluded)."""
    colls = []
    for c in log:
        send, recv = c["send"], c["recv"]
        colls.append(
            {
                "op": c["op"],
                "channel": c["channel"],
                "msgs_out": sum(1 for d, b in enumerate(send) if d != me and b > 0),
                "msgs_in": sum(1 for s, b in enumerate(recv) if s != me and b > 0),
                "bytes_out": sum(b for d, b in enumerate(send) if d != me),
                "bytes_in": sum(b for s, b in enumerate(recv) if s != me),
                "recv_buffer": sum(recv),
                "send_buffer": sum(send),
            }
        )
    return {
        "collectives": len(colls),
        "msgs_out": sum(c["msgs_out"] for c in colls),
        "msgs_in": sum(c["msgs_in"] for c in colls),
        "bytes_out": sum(c["bytes_out"] for c in colls),
        "bytes_in": sum(c["bytes_in"] for c in colls),
        "recv_buffer_peak": max((c["recv_buffer"] for c in colls), default=0),
        "recv_buffer_total": sum(c["recv_buffer"] for c in colls),
        "detail": colls,
    }


# --------------------------------------------------------------------------------------------- rank body


def make_rewards(mode: str, backend: Any, timeout: float) -> list[Any]:
    if mode == "main":
        return [synced_reward(mode="main", backend=backend, timeout=timeout)(accuracy)]
    if mode == "replicate":
        return [synced_reward(mode="replicate", backend=backend, timeout=timeout)(accuracy)]
    if mode == "shard":
        return [synced_reward(mode="shard", group_size=2, backend=backend, timeout=timeout)(accuracy)]
    if mode == "step3":
        return list(synced_rewards(accuracy, length, fmt, mode="main", backend=backend, timeout=timeout))
    raise ValueError(mode)


def rank_main(rank: int, world_size: int, cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    out: dict[str, Any] = {"rank": rank, "modes": {}}
    gc.collect()
    out["before"] = proc_state()  # the job's own: default gloo group, rendezvous store (rank 0 hosts it)
    rec = Recording(TorchDistributedBackend())
    timeout = float(cfg["timeout"])
    barrier = dist.barrier  # the default group: never counted (not through the recording backend)
    step = 0
    first = True
    for mode in cfg["modes"]:
        fns = make_rewards(mode, rec, timeout)
        per_call: list[dict[str, Any]] = []
        for i in range(cfg["warmup"] + cfg["calls"]):
            step += 1
            kw = trl_batch(rank, step, cfg["samples"], cfg["ids"])  # new lists every step, as TRL
            barrier()
            rec.log.clear()
            io0 = io_counters()
            c0 = time.process_time()  # CPU of every thread of this process (gloo's included)
            t0 = time.perf_counter()
            for f in fns:
                f(**kw)
            dt = time.perf_counter() - t0
            cpu = time.process_time() - c0
            io1 = io_counters()
            if first:
                out["first_call_s"] = dt  # includes creating syncreward's two gloo groups
                out["after_first_call"] = proc_state()
                first = False
            if i >= cfg["warmup"]:
                s = summarize(rec.log, rank)
                s["wall_s"] = dt
                s["cpu_s"] = cpu
                s["coll_s"] = [c["s"] for c in rec.log]
                s["syscw"] = io1.get("syscw", 0) - io0.get("syscw", 0)
                s["syscr"] = io1.get("syscr", 0) - io0.get("syscr", 0)
                per_call.append(s)
        # every steady-state call must look the same (the payload's size is fixed): keep the first, check the rest
        keys = ("collectives", "msgs_out", "msgs_in", "bytes_out", "bytes_in", "recv_buffer_peak")
        same = all(all(c[k] == per_call[0][k] for k in keys) for c in per_call)
        out["modes"][mode] = {
            "counts": {k: per_call[0][k] for k in (*keys, "recv_buffer_total", "detail")},
            "steady": same,
            "wall_s": [c["wall_s"] for c in per_call],
            "cpu_s": [c["cpu_s"] for c in per_call],
            "coll_s": [c["coll_s"] for c in per_call],
            "syscw": [c["syscw"] for c in per_call],
            "syscr": [c["syscr"] for c in per_call],
        }
    # the floor of any inbound exchange: one header-sized all_to_all on syncreward's own group
    hb = HEADER_BYTES
    w = world_size
    probe, probe_cpu = [], []
    for _ in range(max(20, cfg["calls"])):
        barrier()
        c0 = time.process_time()
        t0 = time.perf_counter()
        rec.inner.all_to_all(np.zeros(w * hb, dtype=np.uint8), [hb] * w, [hb] * w, channel=0, timeout=timeout)
        probe.append(time.perf_counter() - t0)
        probe_cpu.append(time.process_time() - c0)
    out["probe_header_all_to_all_s"] = probe
    out["probe_header_all_to_all_cpu_s"] = probe_cpu
    gc.collect()
    out["end"] = proc_state()
    from syncreward._codec import Column, encode_frame

    kw = trl_batch(rank, 0, cfg["samples"], cfg["ids"])
    cols = [
        Column(k, _container(kw[k]), kw[k]) for k in sorted(("prompts", "completions", "completion_ids", "solution"))
    ]
    out["frame_bytes"] = len(encode_frame(cols, cfg["samples"]))  # what one rank's payload weighs on the wire
    barrier()
    return out


def _container(values: Any) -> int:
    from syncreward._codec import container_of

    code = container_of(values)
    assert code is not None
    return code


def rank_fd_limit(rank: int, world_size: int, headroom: int, timeout: float, out_dir: str) -> dict[str, Any]:
    """Lower this rank's soft ``RLIMIT_NOFILE`` to its open descriptors + ``headroom``, then make a synced call.

    syncreward's first call opens its two gloo groups (2 W sockets per rank): with ``headroom < 2 W`` the
    setup runs out of descriptors. Returns what the call raised (or returned) and how long it took.
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fds = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (fds + headroom, hard))
    f = synced_reward(mode="main", backend="torch", timeout=timeout)(accuracy)
    t0 = time.perf_counter()
    try:
        f(**trl_batch(rank, 1, 4, 8))
        outcome = "returned"
    except BaseException as e:
        outcome = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
    took = time.perf_counter() - t0
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # first: listing /proc/self/fd needs a descriptor
    after = len(os.listdir("/proc/self/fd"))
    got = {"fds_before": fds, "limit": fds + headroom, "fds_after": after, "outcome": outcome, "s": took}
    import json

    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:  # a rank that gloo aborts writes nothing
        json.dump(got, fh)
    return got
