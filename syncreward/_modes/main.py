"""``mode="main"``: the whole batch goes to rank 0, which scores it once and sends every rank its slice.

Two collectives per call in the steady state: the inbound exchange (every header, with each rank's
payload riding to rank 0 in its eager chunk) and the outbound exchange, a scatter from rank 0 of one
result block per rank (W - 1 messages). Every block has the size the previous call's blocks announced,
predicted per function from its previous call. One more exchange each way when a payload or a result
outgrows its prediction (always on a function's first call).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .._batch import rebuild_result, result_columns, take_columns
from .._codec import decode_frame, decode_value, encode_frame, is_plain
from .._errors import CodecError, MismatchError, RemoteError
from .._exchange import SAME_CALLS, Inbound, all_to_all, scatter
from .._logs import Logs
from .._outcome import Error, Outcome, Value
from .._wire import FAILED, OK, OUTBOUND, CallCheck, ResultChunk, error_blob, split
from ._base import Call, GatherMode, GatherScoring, Payload

__all__ = ["MainMode"]

ROOT = 0


@lru_cache(maxsize=8)
def _to_root(world_size: int) -> np.ndarray:
    out = np.zeros((world_size, world_size), dtype=bool)
    out[:, ROOT] = True
    out[ROOT, ROOT] = False
    out.flags.writeable = False
    return out


class MainMode(GatherMode):
    name = "main"

    def prepare(self, call: Call) -> Payload:
        if call.rank != ROOT:
            return call.encode()
        # Rank 0 scores its own columns as passed and sends nothing: it skips encoding, but refuses what the
        # other ranks refuse (a named column of non-plain data) and leaves behind what they leave behind.
        assert call.bound is not None
        dropped = []
        for col in call.bound.columns:
            if call.spec.options.allow_pickle or is_plain(col.values, col.container):
                continue
            if col.name in call.droppable:
                dropped.append(col.name)
            else:
                # raises the codec's UnsupportedTypeError for this column
                encode_frame([col], call.bound.n, function=call.spec.name)
        return Payload(b"", tuple(dropped))

    def route(self, world_size: int) -> np.ndarray:
        return _to_root(world_size)

    def scores_here(self, call: Call) -> bool:
        return call.rank == ROOT

    def proxies(self, call: Call, logs: Logs, inbound: Inbound) -> dict[str, Any]:
        return logs.recording()

    def outbound(self, call: Call, scoring: GatherScoring, result: Outcome[Any]) -> Outcome[Any]:
        if call.rank == ROOT:
            return self._send(call, scoring, result)
        return self._receive(call, scoring)

    def _send(self, call: Call, scoring: GatherScoring, result: Outcome[Any]) -> Outcome[Any]:
        session, inbound, logs = call.session, scoring.inbound, scoring.logs
        assert logs is not None
        w, counts, offsets = call.world_size, inbound.counts, inbound.offsets
        bodies: dict[int, bytes | bytearray] = {}
        own: Any = None
        error = result.error if isinstance(result, Error) else None
        if isinstance(result, Value):
            try:
                keys, cols = result_columns(result.value, inbound.total, call.spec.name)
                logs.check(inbound.total)
                for r in range(w):
                    rows = slice(offsets[r], offsets[r + 1])
                    part = take_columns(cols, rows)
                    if r == ROOT:
                        own = (rebuild_result(keys, part, None), logs.rows(rows))
                        continue
                    meta = {"keys": keys, "logs": logs.rows(rows)} if keys is not None or logs.records else None
                    allow_pickle = call.spec.options.allow_pickle
                    bodies[r] = encode_frame(part, counts[r], allow_pickle=allow_pickle, meta=meta)
            except BaseException as e:
                error = e
        if error is not None:
            blob = error_blob(error)
            bodies = {r: blob for r in range(w) if r != ROOT}
        status = OK if error is None else FAILED
        blocks = session.result_blocks
        cap = blocks.capacity  # what the previous blocks announced (one size for every rank)
        nxt = blocks.announce(call.fp, {r: len(b) for r, b in bodies.items()} if status == OK else None, counts)
        overflow = any(len(body) > cap - ResultChunk.HEADER for body in bodies.values())
        send = bytearray()
        for r in range(w):  # rank 0's own block is all zeros: a scatter sends every rank one block
            body = bodies.get(r, b"")
            send += ResultChunk(status, overflow, nxt, len(body), call.fp, call.seq).pack(body, cap)
        checks = _results_exchange(call, scoring, send, cap)[1]
        if overflow:
            tails = {r: bodies[r][cap - ResultChunk.HEADER :] for r in bodies}
            rest_counts = [len(tails.get(r, b"")) for r in range(w)]
            all_to_all(session, b"".join(tails.values()), rest_counts, [0] * w, OUTBOUND, call.timeout)
        blocks.advance(nxt)
        if checks is not None and (wrong := call.disagreement(checks, OUTBOUND)):
            return wrong
        if error is not None:
            return Error(error)
        try:
            logs.replay(own[1])
        except BaseException as e:
            return Error(e)
        return Value(own[0])

    def _receive(self, call: Call, scoring: GatherScoring) -> Outcome[Any]:
        session, inbound = call.session, scoring.inbound
        w, me = call.world_size, call.rank
        blocks = session.result_blocks
        cap = blocks.capacity
        buf, checks = _results_exchange(call, scoring, None, cap)
        chunk = ResultChunk.unpack(buf.data)
        body = buf[ResultChunk.HEADER : ResultChunk.HEADER + min(chunk.body_bytes, cap - ResultChunk.HEADER)].tobytes()
        if chunk.overflow:
            rest = max(0, chunk.body_bytes - (cap - ResultChunk.HEADER))
            recv = [rest if s == ROOT else 0 for s in range(w)]
            body += all_to_all(session, b"", [0] * w, recv, OUTBOUND, call.timeout).tobytes()
        blocks.advance(chunk.next_capacity)
        if checks is not None and (wrong := call.disagreement(checks, OUTBOUND)):
            return wrong
        try:
            if (chunk.fp, chunk.seq) != (call.fp, call.seq):
                return Error(
                    MismatchError(
                        f"rank {ROOT} sent the results of another synced call than this rank's {call.description}. "
                        f"HINT: {SAME_CALLS}."
                    )
                )
            if chunk.status != OK:
                info = decode_value(body)
                return Error(
                    RemoteError(ROOT, info["type"], info["message"], info["traceback"], function=call.spec.name)
                )
            nrows, cols, meta = decode_frame(body, allow_pickle=call.spec.options.allow_pickle)
            if nrows != inbound.counts[me]:
                raise CodecError(f"rank {ROOT} sent {nrows} results for {inbound.counts[me]} samples")
            meta = meta or {}
            Logs(call.bound, call.spec.name).replay(meta.get("logs", ()))
            return Value(rebuild_result(meta.get("keys"), cols, call.device()))
        except BaseException as e:  # everything was exchanged: a local failure, the session stays usable
            return Error(e)


def _results_exchange(
    call: Call, scoring: GatherScoring, blocks: bytearray | None, cap: int
) -> tuple[np.ndarray, list[CallCheck] | None]:
    """Send every rank its ``cap``-byte result block from rank 0; return this rank's block.

    After an inbound exchange every rank knows the ranks make the same call, and the blocks go out in
    one scatter. A reward group's hit had no inbound exchange: its blocks travel in an ``all_to_all`` in
    which every rank also sends every other rank a :class:`CallCheck`, so every rank can tell whether
    they all scored the same call (the returned checks, in rank order).
    """
    session, me, w = call.session, call.rank, call.world_size
    if not scoring.shared:
        return scatter(session, blocks or b"", cap, ROOT, OUTBOUND, call.timeout), None
    mine = call.check()
    head = mine.pack()
    extra = cap if me == ROOT else 0
    send = bytearray()
    for d in range(w):
        if d != me:
            send += head
            if blocks is not None:
                send += blocks[d * cap : (d + 1) * cap]
    send_counts = [0 if d == me else CallCheck.SIZE + extra for d in range(w)]
    recv_counts = [0 if s == me else CallCheck.SIZE + (cap if s == ROOT else 0) for s in range(w)]
    parts = split(all_to_all(session, send, send_counts, recv_counts, OUTBOUND, call.timeout), recv_counts)
    checks = [mine if s == me else CallCheck.unpack(parts[s][: CallCheck.SIZE].tobytes()) for s in range(w)]
    block = parts[ROOT][CallCheck.SIZE :] if me != ROOT else np.zeros(cap, dtype=np.uint8)
    return block, checks
