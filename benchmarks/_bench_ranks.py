"""The code that runs inside each benchmark rank (spawned by ``bench_exchange.py`` via ``run_ranks``).

Kept in its own module so the spawned ranks import it by name. Everything here is deterministic except
the timings.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import gc
import pickle
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import _trl_call as trl_call
import numpy as np
import torch
import torch.distributed as dist
from _instrument import CollectiveCounter, PhaseTimer
from _payloads import local_count, make_batch

import syncreward._batch as sr_batch
import syncreward._lifecycle as sr_lifecycle
import syncreward._modes.main as sr_main
import syncreward._transfers as sr_transfers
from syncreward import synced_reward, synced_rewards
from syncreward._batch import Split, encodable, merge_frames, read_frame, rebuild_result, split_result
from syncreward._binding import Binder
from syncreward._call import _fingerprint as call_fingerprint
from syncreward._codec import CONTAINERS, Column, container_of, decode_frame, encode_frame
from syncreward._deadline import Deadline
from syncreward._identity import call_site
from syncreward._logs import Logs
from syncreward._session import Session
from syncreward._wire import (
    BLOCK_LAG,
    HEADER_BYTES,
    HEADER_LEN,
    NO_SHARED,
    OK,
    V_OK,
    Headers,
    ResultChunk,
    drop_mask,
    pack_header,
    verdict_of,
)
from syncreward.backends import resolve_backend
from syncreward.backends._waiting import CALL as WAIT_CALL
from syncreward.backends._waiting import TIMEOUT as WAIT_TIMEOUT
from syncreward.backends.torch_distributed import TorchDistributedBackend

GROUP = 8  # GRPO num_generations: samples per prompt group
JUDGE_S = 0.02  # the judge's cost per group (I/O bound)


# --------------------------------------------------------------------------------------------- rewards


def reward(completions, completion_ids, solution, dataset_name, **kwargs):
    """A cheap GRPO-style reward: correctness plus a length term normalised within each group of 8."""
    out = []
    for g in range(0, len(completions), GROUP):
        lens = [len(x) for x in completion_ids[g : g + GROUP]]
        mean = sum(lens) / len(lens)
        for c, n, s in zip(completions[g : g + GROUP], lens, solution[g : g + GROUP], strict=True):
            out.append((1.0 if c.endswith(s) else 0.0) + 0.1 * n / mean)
    return out


def judge(completions, completion_ids, solution, dataset_name, **kwargs):
    """An I/O-bound judge: 20 ms per group of 8 (one blocking request per prompt group)."""
    out = []
    for g in range(0, len(completions), GROUP):
        time.sleep(JUDGE_S)
        out.extend(float(len(c) % 7) for c in completions[g : g + GROUP])
    return out


async def ajudge(completions, completion_ids, solution, dataset_name, **kwargs):
    """The same judge as an ``async def`` (one awaited request per group, one after the other)."""
    out = []
    for g in range(0, len(completions), GROUP):
        await asyncio.sleep(JUDGE_S)
        out.extend(float(len(c) % 7) for c in completions[g : g + GROUP])
    return out


def format_reward(completions, completion_ids, solution, dataset_name, **kwargs):
    """TRL's second reward of a step: a format check (one bool-like float per sample)."""
    return [float("answer:" in c) for c in completions]


def length_reward(completions, completion_ids, solution, dataset_name, **kwargs):
    """TRL's third reward of a step: a length term over the batch, with a per-sample dict of components."""
    lengths = [len(ids) for ids in completion_ids]
    mean = sum(lengths) / max(len(lengths), 1)
    return {"length": [float(x - mean) for x in lengths], "too_long": [x > 1.5 * mean for x in lengths]}


class CollectivesOnly:
    """A backend without the optional ``point_to_point``: every exchange is a gloo ``alltoallv``, as before
    main mode's sparse exchanges went point to point (the A/B of that change, in one launch)."""

    def __init__(self, inner: TorchDistributedBackend) -> None:
        self._inner = inner
        self.rank, self.world_size = inner.rank, inner.world_size
        self.all_gather = inner.all_gather
        self.all_to_all = inner.all_to_all


class Synced:
    """The synced variants. Each gets its own backend, hence its own gloo groups and its own session
    (sequence numbers, learned sizes), as if it were the only synced function of the job; ``mixed_*`` and
    ``step_rewards`` share one backend on purpose, to measure how calls of different functions affect
    each other (``step_rewards``: TRL's accuracy + format + length rewards of one step).
    """

    def __init__(self, old_package: str | None = None) -> None:
        def fresh() -> TorchDistributedBackend:
            return TorchDistributedBackend()

        self.main = synced_reward(mode="main", backend=fresh())(reward)
        if old_package:  # --ab: the same reward through the whole package of another revision
            old, Old = load_old_package(old_package)
            self.main_old = old.synced_reward(mode="main", backend=Old())(reward)
            self.step_group_old = old.synced_rewards(reward, format_reward, length_reward, mode="main", backend=Old())
        self.main_collectives = synced_reward(mode="main", backend=CollectivesOnly(fresh()))(reward)
        self.replicate = synced_reward(mode="replicate", backend=fresh())(reward)
        self.shard = synced_reward(mode="shard", group_size=GROUP, backend=fresh())(reward)
        shared = fresh()
        self.mixed_replicate = synced_reward(mode="replicate", backend=shared)(reward)
        self.mixed_main = synced_reward(mode="main", backend=shared)(reward)
        self.judge_main = synced_reward(mode="main", backend=fresh())(judge)
        self.judge_shard = synced_reward(mode="shard", group_size=GROUP, backend=fresh())(judge)
        self.ajudge_main = synced_reward(mode="main", backend=fresh())(ajudge)
        self.ajudge_shard = synced_reward(mode="shard", group_size=GROUP, backend=fresh())(ajudge)
        # TRL's usual step: three rewards, one after the other, each getting every column, on one backend
        step = fresh()
        self.step_rewards = [
            synced_reward(mode="main", backend=step)(f) for f in (reward, format_reward, length_reward)
        ]
        # the same three rewards as a reward group: the columns travel once per step
        self.step_group = synced_rewards(reward, format_reward, length_reward, mode="main", backend=fresh())

    def step3(self, batch: dict[str, list[Any]], group: bool = False, old: bool = False) -> Any:
        """One TRL step's reward calls; returns the first reward's results (the one checked for correctness).

        Every step TRL builds new column lists and passes the same ones to each reward: so does this.
        """
        step = {k: list(v) for k, v in batch.items()}
        fns = self.step_group_old if old else self.step_group if group else self.step_rewards
        results = [f(**step) for f in fns]  # every reward of the step is called
        return results[0]


@functools.cache  # one Old class per launch, however many variants use it
def load_old_package(root: str) -> tuple[Any, Any]:
    """``syncreward_old`` (another revision's package, extracted under ``root``) and its torch backend class."""
    import importlib

    if root not in sys.path:
        sys.path.insert(0, root)
    old = importlib.import_module("syncreward_old")
    torch_old = importlib.import_module("syncreward_old.backends.torch_distributed")

    class Old(torch_old.TorchDistributedBackend):  # type: ignore[name-defined,misc]
        name = "torchold"  # the two packages count their groups apart: their store keys must differ

    return old, Old


# --------------------------------------------------------------------------------------------- variants

_ALIGN: list[Any] = []  # a gloo group used only to line the ranks up before each call


def _barrier() -> None:
    """Line the ranks up on a group no variant uses, so no variant's group is left warm by the barrier."""
    if not _ALIGN:
        _ALIGN.append(dist.new_group(backend="gloo"))
    dist.barrier(group=_ALIGN[0])


def _counts(parts: list[list[Any]]) -> list[int]:
    return [len(p) for p in parts]


def handrolled(batch: dict[str, list[Any]]) -> list[float]:
    """What users write today: one all_gather_object per column, score on rank 0, broadcast, slice."""
    w, me = dist.get_world_size(), dist.get_rank()
    gathered: dict[str, list[Any]] = {}
    for key, value in batch.items():
        parts: list[Any] = [None] * w
        dist.all_gather_object(parts, value)
        gathered[key] = parts
    counts = _counts(gathered["completions"])
    box: list[Any] = [None]
    if me == 0:
        flat = {k: [x for p in parts for x in p] for k, parts in gathered.items()}
        box[0] = reward(**flat)
    dist.broadcast_object_list(box, src=0)
    lo = sum(counts[:me])
    return box[0][lo : lo + counts[me]]  # type: ignore[no-any-return]


def fused_objects(batch: dict[str, list[Any]]) -> list[float]:
    """One all_gather_object of all columns, score on rank 0, broadcast_object_list, slice."""
    w, me = dist.get_world_size(), dist.get_rank()
    parts: list[Any] = [None] * w
    dist.all_gather_object(parts, batch)
    counts = [len(p["completions"]) for p in parts]
    box: list[Any] = [None]
    if me == 0:
        flat = {k: [x for p in parts for x in p[k]] for k in batch}
        box[0] = reward(**flat)
    dist.broadcast_object_list(box, src=0)
    lo = sum(counts[:me])
    return box[0][lo : lo + counts[me]]  # type: ignore[no-any-return]


def dict_gather(batch: dict[str, list[Any]]) -> list[float]:
    """What a user writes in three lines: one all_gather_object of the call's columns, every rank
    concatenates them in rank order, scores the whole batch and keeps its own slice (no second exchange)."""
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, batch)
    me = dist.get_rank()
    lo = sum(len(p["completions"]) for p in parts[:me])
    return reward(**{k: [x for p in parts for x in p[k]] for k in batch})[lo : lo + len(batch["completions"])]


def _u8(buf: bytearray) -> torch.Tensor:
    return torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)


class Raw:
    """The wire limit: the same bytes syncreward sends (one frame per rank), already serialised."""

    def __init__(self, batch: dict[str, list[Any]]) -> None:
        w, self.me = dist.get_world_size(), dist.get_rank()
        n = len(batch["completions"])
        frame = bytes(encode_frame([Column(k, container_of(v), v) for k, v in batch.items()], n))  # type: ignore[arg-type]
        self.frame_bytes = len(frame)
        sizes: list[Any] = [None] * w
        dist.all_gather_object(sizes, len(frame))
        self.sizes = [int(s) for s in sizes]
        counts: list[Any] = [None] * w
        dist.all_gather_object(counts, n)
        self.counts = [int(c) for c in counts]
        self.max = max(self.sizes)
        self.padded = _u8(bytearray(frame) + bytes(self.max - len(frame)))
        self.exact = _u8(bytearray(frame))
        self.w = w

    def all_gather(self) -> None:
        """One all_gather of every rank's frame, padded to the largest (what all_gather needs)."""
        out = torch.empty(self.max * self.w, dtype=torch.uint8)
        dist.all_gather(list(out.split(self.max)) if self.max else [out] * self.w, self.padded)

    def to_root(self) -> None:
        """One exact-size all_to_all of every rank's frame to rank 0 (a gather, no padding)."""
        w = self.w
        if self.me == 0:
            recv = [0, *self.sizes[1:]]
            out = torch.empty(sum(recv), dtype=torch.uint8)
            dist.all_to_all_single(out, torch.empty(0, dtype=torch.uint8), recv, [0] * w)
        else:
            send = [self.sizes[self.me] if d == 0 else 0 for d in range(w)]
            dist.all_to_all_single(torch.empty(0, dtype=torch.uint8), self.exact, [0] * w, send)

    def round_trip(self) -> None:
        """The floor of any main-mode protocol: frames to rank 0, then 8 bytes per sample back."""
        self.to_root()
        w = self.w
        if self.me == 0:
            send = [0, *(8 * n for n in self.counts[1:])]
            dist.all_to_all_single(
                torch.empty(0, dtype=torch.uint8), torch.empty(sum(send), dtype=torch.uint8), [0] * w, send
            )
        else:
            recv = [8 * self.counts[self.me] if s == 0 else 0 for s in range(w)]
            dist.all_to_all_single(
                torch.empty(sum(recv), dtype=torch.uint8), torch.empty(0, dtype=torch.uint8), recv, [0] * w
            )


class Bare:
    """``mode="main"``'s data path with none of the library around it: the floor of its per-call Python.

    Rank ``r > 0`` encodes its columns with syncreward's codec and sends them to rank 0 in one ``gather``
    of equal blocks (a header, then the frame, zero padded to the largest rank's: what ``main`` sends over a
    backend with a gather); rank 0 decodes them,
    scores the whole batch, encodes each rank's slice and scatters one fixed-size block per rank (what
    ``main`` sends back). Nothing else: no binding, fingerprint, sequence, turn, header check, learned
    size, failure path or log records -- every frame size is known in advance (the payloads are
    deterministic). ``main`` / ``bare_main`` is what the library adds to a call.
    """

    def __init__(self, batch: dict[str, list[Any]], payload: str) -> None:
        self.w, self.me = dist.get_world_size(), dist.get_rank()
        self.backend = TorchDistributedBackend()
        self.sizes = [
            len(self._frame(make_batch(payload, r, self.w))) if r != 0 else 0 for r in range(self.w)
        ]
        self.counts = [local_count(payload, r, self.w) for r in range(self.w)]
        self.block = 512 + 8 * max(self.counts)  # the result block: 8 bytes of length, then the slice's frame
        self.batch = batch

    @staticmethod
    def _frame(cols: dict[str, list[Any]]) -> bytearray:
        n = len(cols["completions"])
        return encode_frame([Column(k, container_of(v), v) for k, v in cols.items()], n)  # type: ignore[arg-type]

    def __call__(self) -> list[float]:
        w, me, h, cols = self.w, self.me, HEADER_LEN * 8, self.batch
        n = len(cols["completions"])
        size = h + max(self.sizes)  # one block size for every rank (a gather moves equal blocks)
        if me != 0:
            frame = self._frame(cols)
            send = np.zeros(size, dtype=np.uint8)
            send[h : h + len(frame)] = np.frombuffer(frame, dtype=np.uint8)
            self.backend.gather(send, size, root=0, channel=0, timeout=60.0)
            got = self.backend.scatter(np.empty(0, dtype=np.uint8), self.block, root=0, channel=1, timeout=60.0)
            k = int.from_bytes(got[:8].tobytes(), "little")
            _, result, _ = decode_frame(got[8 : 8 + k])
            return result[0].values  # type: ignore[no-any-return]
        buf = self.backend.gather(np.zeros(size, dtype=np.uint8), size, root=0, channel=0, timeout=60.0)
        merged = {k: list(v) for k, v in cols.items()}
        for s in range(1, w):
            at = s * size + h
            _, part, _ = decode_frame(buf[at : at + self.sizes[s]])
            for c in part:
                merged[c.name] += c.values
        scores = reward(**merged)
        blocks = np.zeros(w * self.block, dtype=np.uint8)
        lo = n
        for s in range(1, w):
            m = self.counts[s]
            frame = encode_frame([Column("", container_of(scores), scores[lo : lo + m])], m)  # type: ignore[arg-type]
            at = s * self.block
            blocks[at : at + 8] = np.frombuffer(len(frame).to_bytes(8, "little"), dtype=np.uint8)
            blocks[at + 8 : at + 8 + len(frame)] = np.frombuffer(frame, dtype=np.uint8)
            lo += m
        self.backend.scatter(blocks, self.block, root=0, channel=1, timeout=60.0)
        return scores[:n]


class Lean:
    """``mode="main"``'s steady-state call flattened: its protocol and checks, with none of the layers between.

    A measuring instrument, not a code path of the library: what a call costs when it runs only the steps a
    steady-state ``main`` call cannot skip, each through the library's own component, in one function per
    rank. Rank ``r > 0``: the session's sequence number and turns, the call's deadline, the binding, the
    fingerprint, the encoding, the header and block, the gather; the result chunk and its checks, the
    decoding. Rank 0: the headers and their verdict, the next block's size, the merge, the log stand-ins,
    the function's arguments, the scoring, the result's check and split, the next result block's size, the
    chunks, the scatter; the blocks are sized as ``main`` sizes them (``InboundBlocks``: a payload that
    outgrew its block goes point to point, as in ``main``'s first calls), and rank 0 checks that its own
    columns are plain, as ``main``'s rank 0 does while it waits. Happy path only: no failure, mismatch,
    result tail or log record is handled (an ``AssertionError`` says so). Left out as well: the call's
    description (``Description``: ``main`` makes it for a mismatch's message).
    ``lean_main`` / ``bare_main`` is what the protocol itself costs; ``main`` / ``lean_main`` what the
    library's layers around it cost.
    """

    def __init__(
        self, batch: dict[str, list[Any]], payload: str, backend: TorchDistributedBackend | None = None
    ) -> None:
        fn = synced_reward(mode="main")(reward)
        self.spec = fn.__syncreward_spec__  # type: ignore[attr-defined]
        self.w, self.me = dist.get_world_size(), dist.get_rank()
        self.backend = backend if backend is not None else TorchDistributedBackend()
        self.session = Session(self.backend)  # its own: the synced functions' sessions never see these calls
        self.batch = batch
        self.next_block = 0  # on rank 0: the inbound block size this call announces
        # the first result blocks: large enough that no body overflows (main sends the rest point to point)
        self.session.result_blocks.advance(512 + 8 * max(local_count(payload, r, self.w) for r in range(self.w)))

    def __call__(self) -> Any:
        return self._call(**self.batch)

    def _call(self, **kwargs: Any) -> Any:
        spec, session, w, me, backend = self.spec, self.session, self.w, self.me, self.backend
        if sr_lifecycle.nested():
            return spec.fn(**kwargs)
        site = call_site(sys._getframe(1))
        seq, problem = session.open(False)
        assert problem is None
        assert session.take_lost() is None
        deadline = Deadline(spec.options.timeout)
        bound = spec.binder.bind((), kwargs)
        columns = tuple([(c.name, CONTAINERS[c.container]) for c in bound.columns])
        fp = call_fingerprint(spec.key, spec.identity.digest, columns, site.key)
        names = [c.name for c in bound.columns]
        frame: bytes | bytearray = b""
        if me != 0:
            frame = encode_frame(bound.columns, bound.n, droppable=bound.droppable, dropped=[])
        else:  # rank 0 scores its columns as passed, after checking they are plain as the others' are
            encodable(bound.columns, bound.n, bound.droppable, False, spec.name)

        def in_turn(channel: int, work: Callable[[], Any]) -> Any:
            """``work``'s value, run in the call's turn on ``channel``, its waits named as a session's are."""

            def named() -> Any:
                called, timed = WAIT_CALL.set("lean"), WAIT_TIMEOUT.set(deadline.timeout)
                try:
                    return work()
                finally:
                    WAIT_TIMEOUT.reset(timed)
                    WAIT_CALL.reset(called)

            return session.turns[channel].run(seq, named, deadline, "lean")

        def inbound() -> Any:
            blocks = session.inbound_blocks
            size = blocks.size(blocks.gathered(seq))
            assert size is not None
            header = pack_header(
                seq=seq, status=OK, fp=fp, step=bound.step, n=bound.n, size=len(frame), mode_word=0,
                mask=drop_mask(names, ()), shared=NO_SHARED,
            )  # fmt: skip
            block = np.zeros(size, dtype=np.uint8)
            block[:HEADER_BYTES] = np.frombuffer(header, dtype=np.uint8)
            body = np.frombuffer(frame, dtype=np.uint8)
            room = size - HEADER_BYTES
            if body.size <= room:
                block[HEADER_BYTES : HEADER_BYTES + body.size] = body
            got = backend.gather(block, size, root=0, channel=0, timeout=deadline.left())
            if me != 0:
                if body.size > room:  # all of it, point to point, as main sends it
                    backend.send(body, 0, channel=0, timeout=deadline.left())
                return None
            headers = Headers.blocks(got, w, size)
            assert verdict_of(headers)[0] == V_OK, "lean_main: the ranks' headers disagree"
            sizes = headers.sizes
            whole = {s: sizes[s] for s in range(1, w) if sizes[s] > room}
            received = backend.recv_many(whole, channel=0, timeout=deadline.left()) if whole else {}
            self.next_block = blocks.announce(seq, sizes)
            at = [s * size + HEADER_BYTES for s in range(w)]
            frames = {s: received[s] if s in whole else got[at[s] : at[s] + sizes[s]] for s in range(1, w)}
            return headers.counts, frames

        got = in_turn(0, inbound)
        split: Split | None = None
        if me == 0:
            counts, frames = got
            values = merge_frames(bound.columns, frames, dict(enumerate(counts)), 0, lambda v, c: v, frozenset(), False)
            logs = Logs(bound, spec.name)
            args, kw = bound.call_args({**values, **logs.recording()}, ())
            with sr_lifecycle._scoring():
                result = spec.fn(*args, **kw)
            bounds = [0]
            for c in counts:
                bounds.append(bounds[-1] + c)
            split = split_result(result, bounds, spec.name, logs=logs, here=0, send=range(1, w)).unwrap()

        def results() -> Any:
            blocks = session.result_blocks
            cap = blocks.capacity
            if me == 0:
                assert split is not None
                bodies = split.frames
                nxt = blocks.announce(fp, {r: len(b) for r, b in bodies.items()}, counts)
                send = bytearray(w * cap)
                for r in range(1, w):
                    body = bodies[r]
                    assert len(body) <= cap - ResultChunk.HEADER, "lean_main: a result outgrew its block"
                    chunk = ResultChunk(OK, False, nxt, len(body), fp, seq, V_OK, self.next_block)
                    chunk.pack_into(send, r * cap, body, cap)
                out = np.frombuffer(send, dtype=np.uint8)
                backend.scatter(out, cap, root=0, channel=1, timeout=deadline.left())
                blocks.advance(nxt)
                return split.result
            buf = backend.scatter(np.empty(0, dtype=np.uint8), cap, root=0, channel=1, timeout=deadline.left())
            chunk = ResultChunk.unpack(buf.data)
            assert (chunk.fp, chunk.seq, chunk.status, chunk.verdict, chunk.overflow) == (fp, seq, OK, V_OK, False)
            blocks.advance(chunk.next_capacity)
            session.inbound_blocks.learn(seq, chunk.next_block)
            nrows, cols, meta = read_frame(buf[ResultChunk.HEADER : ResultChunk.HEADER + chunk.body_bytes], False)
            assert nrows == bound.n
            return rebuild_result(meta.get("keys"), cols, None)

        out = in_turn(1, results)
        session.close(seq)
        return out


class Probe:
    """One tiny collective (the size of syncreward's header row): the per-collective latency floor."""

    def __init__(self) -> None:
        self.row = np.arange(HEADER_LEN, dtype=np.int64)
        self.backend = resolve_backend("auto")

    def torch_all_to_all(self) -> None:
        """The same all-gather semantics (every rank gets every row) as one all_to_all."""
        w = dist.get_world_size()
        send = torch.from_numpy(self.row).view(torch.uint8).repeat(w)
        dist.all_to_all_single(torch.empty_like(send), send)

    def torch_all_gather(self) -> None:
        w = dist.get_world_size()
        out = torch.empty((w, HEADER_LEN), dtype=torch.int64)
        dist.all_gather(list(out.unbind(0)), torch.from_numpy(self.row))

    def backend_all_gather(self) -> None:
        """The same row through syncreward's backend (its own gloo group, sliced waiting)."""
        self.backend.all_gather(self.row, channel=0, timeout=60.0)


Variant = Callable[[], Any] | tuple[Callable[[], Any], Callable[[], Any]]  # fn, or (untimed setup, fn)


def variants_for(
    batch: dict[str, list[Any]],
    raw: Raw,
    probe: Probe,
    fns: Synced,
    bare: Callable[[], Any],
    lean: Callable[[], Any] | None = None,
) -> dict[str, Variant]:
    return {
        "bare_main": bare,
        **({"lean_main": lean} if lean is not None else {}),
        "direct": lambda: reward(**batch),
        "handrolled": lambda: handrolled(batch),
        "fused_objects": lambda: fused_objects(batch),
        "dict_gather": lambda: dict_gather(batch),
        "main": lambda: fns.main(**batch),
        "main_old": lambda: fns.main_old(**batch),
        "step3_group_old": lambda: fns.step3(batch, old=True),
        "main_collectives": lambda: fns.main_collectives(**batch),
        "replicate": lambda: fns.replicate(**batch),
        "shard": lambda: fns.shard(**batch),
        "main_after_replicate": (lambda: fns.mixed_replicate(**batch), lambda: fns.mixed_main(**batch)),
        "step3_main": lambda: fns.step3(batch),
        "step3_group": lambda: fns.step3(batch, group=True),
        "raw_all_gather": raw.all_gather,
        "raw_to_root": raw.to_root,
        "raw_round_trip": raw.round_trip,
        "probe_all_gather": probe.torch_all_gather,
        "probe_all_to_all": probe.torch_all_to_all,
        "probe_backend_all_gather": probe.backend_all_gather,
    }


def _split(variant: Variant) -> tuple[Callable[[], Any] | None, Callable[[], Any]]:
    return variant if isinstance(variant, tuple) else (None, variant)


def _timed_rounds(variants: dict[str, Variant], rounds: int, warmup: int) -> dict[str, list[int]]:
    """Every round runs each variant once, in a fresh order each round; barrier before each.

    The order is a permutation drawn from the round's number (the same on every rank). Rotating one fixed
    order would keep each variant's predecessor fixed (only the starting point moves), and what runs just
    before a call changes it: identical variants measured 1.05-1.21x apart that way (issue 24).
    """
    names = list(variants)
    calls = {n: _split(v) for n, v in variants.items()}
    for _ in range(warmup):
        for name in names:
            setup, fn = calls[name]
            if setup is not None:
                setup()
            _barrier()
            fn()
    times: dict[str, list[int]] = {n: [] for n in names}
    for r in range(rounds):
        gc.collect()
        for name in random.Random(r).sample(names, len(names)):
            setup, fn = calls[name]
            if setup is not None:
                setup()  # untimed
            _barrier()
            t0 = time.perf_counter_ns()
            fn()
            times[name].append(time.perf_counter_ns() - t0)
    return times


# --------------------------------------------------------------------------------------------- passes


def _expected(payload: str, rank: int, world_size: int) -> list[float]:
    """The oracle: the reward of the concatenated global batch, this rank's slice."""
    batches = [make_batch(payload, r, world_size) for r in range(world_size)]
    flat = {k: [x for b in batches for x in b[k]] for k in batches[0]}
    lo = sum(local_count(payload, r, world_size) for r in range(rank))
    return reward(**flat)[lo : lo + local_count(payload, rank, world_size)]


def _account(variants: dict[str, Variant], counter: CollectiveCounter) -> dict[str, Any]:
    """Collectives and bytes of each variant's first call (cold) and of a steady-state call.

    The steady state comes after ``_wire.BLOCK_LAG`` calls: ``main`` sizes a call's inbound block from
    what rank 0 announced that many gathered calls earlier, so the calls before send point-to-point tails.
    The first and the last call's results are kept for the correctness check.
    """
    out: dict[str, Any] = {}
    for name, variant in variants.items():
        setup, fn = _split(variant)
        snaps, values = [], []
        for i in range(BLOCK_LAG + 2):
            if setup is not None:
                setup()
            _barrier()
            with counter.armed_for():
                value = fn()
            if i in (0, BLOCK_LAG + 1):
                values.append(value)
                snaps.append(counter.snapshot())
        out[name] = {**snaps[-1], "cold": snaps[0], "results": values}
    return out


def _profile_main(batch: dict[str, list[Any]], calls: int) -> list[dict[str, int]]:
    """Exclusive phase times of ``mode="main"`` calls on this rank (ns)."""
    timer = PhaseTimer()
    backend = TorchDistributedBackend()
    timer.patch(sr_lifecycle, "_open", "setup")
    timer.patch(sr_main.MainMode, "route_inputs", "pre")
    timer.patch(sr_main.MainMode, "route_results", "post")
    for module in (sr_transfers, sr_batch, sr_main):  # where each leaf is looked up
        for leaf in ("encode_frame", "decode_frame", "concat", "rebuild_result", "result_columns"):
            if hasattr(module, leaf):
                timer.patch(module, leaf, timer.staged(leaf))
    timer.patch(Binder, "bind", timer.staged("bind"))
    timer.patch(backend, "all_gather", timer.staged("all_gather"))
    timer.patch(backend, "all_to_all", timer.staged("all_to_all"))
    for name in ("gather", "scatter", "send", "recv"):  # main's gathered inbound and its results
        timer.patch(backend, name, timer.staged(name))
    scored = timer.wrap(reward, "score")
    fn = synced_reward(mode="main", backend=backend)(scored)
    results = []
    try:
        fn(**batch)  # warm-up: creates the gloo groups, learns the result capacity
        for _ in range(calls):
            _barrier()
            timer.start("other")
            fn(**batch)
            phases = timer.stop()
            phases["total"] = sum(phases.values())
            results.append(phases)
    finally:
        timer.unpatch()
    return results


def _cprofile_main(fn: Callable[..., Any], batch: dict[str, list[Any]], calls: int, path: str) -> None:
    """cProfile ``calls`` main-mode calls on this rank; stats written to ``path``."""
    import cProfile

    prof = cProfile.Profile()
    for _ in range(calls):
        _barrier()
        prof.enable()
        fn(**batch)
        prof.disable()
    prof.dump_stats(path)


def _shard_throughput(fns: Synced, rank: int, world_size: int, rounds: int) -> dict[str, Any]:
    batch = make_batch("judge", rank, world_size)
    loop = asyncio.new_event_loop()
    variants: dict[str, Variant] = {
        "direct": lambda: judge(**batch),
        "main": lambda: fns.judge_main(**batch),
        "shard": lambda: fns.judge_shard(**batch),
        "async_main": lambda: loop.run_until_complete(fns.ajudge_main(**batch)),
        "async_shard": lambda: loop.run_until_complete(fns.ajudge_shard(**batch)),
    }
    try:
        times = _timed_rounds(variants, rounds, warmup=1)
    finally:
        loop.close()
    return {"samples_global": sum(local_count("judge", r, world_size) for r in range(world_size)), "times": times}


def tune_malloc() -> bool:
    """Keep freed memory in glibc's heap, so large per-call buffers stop costing fresh page faults."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    # M_MMAP_THRESHOLD = -3, M_TRIM_THRESHOLD = -1 (malloc.h)
    return bool(libc.mallopt(-3, 256 << 20)) and bool(libc.mallopt(-1, 1 << 30))


def _trl_call_payload(
    payload: str, rank: int, world_size: int, cfg: dict[str, Any], counter: CollectiveCounter
) -> dict[str, Any]:
    """The ``trlcall`` payload (``_trl_call``): its variants checked, counted and timed like the others."""
    call = trl_call.call_for(payload, rank, world_size)
    variants: dict[str, Any] = trl_call.variants(call, cfg.get("old_package"), Raw, load_old_package)
    raw = variants.pop("_raw")
    if cfg.get("variants"):
        variants = {k: v for k, v in variants.items() if k in cfg["variants"]}
    columns = trl_call.columns(call)
    info: dict[str, Any] = {
        "n_local": len(call["completions"]),
        "frame_bytes": raw.frame_bytes,  # the columns the reward reads
        "pickle_bytes": len(pickle.dumps(columns)),  # every per-sample column TRL passes
        "pickle_field_bytes": {k: len(pickle.dumps(v)) for k, v in columns.items()},
    }
    counter.install()
    try:
        acc = _account(variants, counter)
    finally:
        counter.uninstall()
    expected = trl_call.expected(payload, rank, world_size)
    for name, a in acc.items():
        results = a.pop("results")
        want = expected["ids"] if name.startswith("main_ids") else expected["accuracy"]
        a["correct"] = None if name.startswith("raw_") else all(list(r) == want for r in results)
    info["account"] = acc
    info["times"] = _timed_rounds(variants, cfg["rounds"], cfg["warmup"])
    return info


def rank_main(rank: int, world_size: int, cfg: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(1)
    if cfg.get("tune_malloc"):
        tune_malloc()
    out: dict[str, Any] = {"rank": rank, "payloads": {}}
    counter = CollectiveCounter()
    fns = Synced(cfg.get("old_package"))
    for payload in cfg["payloads"]:
        if payload in trl_call.PAYLOADS:  # TRL's real call: every column, the reward reading two
            out["payloads"][payload] = _trl_call_payload(payload, rank, world_size, cfg, counter)
            continue
        batch = make_batch(payload, rank, world_size)
        raw = Raw(batch)
        asked = cfg.get("variants") or ()
        lean = Lean(batch, payload) if "lean_main" in asked else None  # it makes gloo groups: only where asked for
        variants = variants_for(batch, raw, Probe(), fns, Bare(batch, payload), lean)
        if cfg.get("variants"):
            variants = {k: v for k, v in variants.items() if k in cfg["variants"]}
        if not cfg.get("old_package"):
            variants = {k: v for k, v in variants.items() if not k.endswith("_old")}
        info: dict[str, Any] = {
            "n_local": len(batch["completions"]),
            "frame_bytes": raw.frame_bytes,
            "pickle_bytes": len(pickle.dumps(batch)),
            "pickle_field_bytes": {k: len(pickle.dumps(v)) for k, v in batch.items()},
        }
        counter.install()
        try:
            acc = _account(variants, counter)
        finally:
            counter.uninstall()
        expected = _expected(payload, rank, world_size)
        for name, a in acc.items():
            results = a.pop("results")
            a["correct"] = None if name.startswith(("raw_", "probe_")) else all(list(r) == expected for r in results)
        info["account"] = acc
        info["times"] = _timed_rounds(variants, cfg["rounds"], cfg["warmup"])
        if cfg["profile_calls"] and payload in cfg["profile_payloads"]:
            info["profile"] = _profile_main(batch, cfg["profile_calls"])
            if cfg.get("cprofile_dir"):
                path = f"{cfg['cprofile_dir']}/main-{payload}-w{world_size}-rank{rank}.prof"
                _cprofile_main(fns.main, batch, cfg["profile_calls"], path)
        out["payloads"][payload] = info
        del batch, raw, variants
        gc.collect()
    if cfg["shard_rounds"]:
        out["judge"] = _shard_throughput(fns, rank, world_size, cfg["shard_rounds"])
    return out
