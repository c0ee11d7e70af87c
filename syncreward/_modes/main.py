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

from .._batch import rebuild_result, result_columns, take
from .._codec import Column, decode_frame, decode_value, encode_frame, is_plain
from .._errors import CodecError, MismatchError, RemoteError
from .._exchange import Inbound, all_to_all, mismatch, scatter
from .._logs import Logs
from .._session import Raise
from .._wire import FAILED, OK, CallCheck, ResultChunk, error_blob, split
from ._base import Call, GatherMode, Scoring

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

    def prepare(self, call: Call) -> None:
        if call.rank != ROOT:
            call.encode()
            return
        # Rank 0 scores its own columns as passed and sends nothing: it skips encoding, but refuses what the
        # other ranks refuse (a named column of non-plain data) and leaves behind what they leave behind.
        assert call.bound is not None
        for col in call.bound.columns:
            if call.spec.allow_pickle or is_plain(col.values, col.container):
                continue
            if col.name in call.droppable:
                call.dropped_local.append(col.name)
            else:
                encode_frame([col], call.bound.n)  # raises the codec's UnsupportedTypeError for this column

    def route(self, world_size: int) -> np.ndarray:
        return _to_root(world_size)

    def scores_here(self, call: Call) -> bool:
        return call.rank == ROOT

    def proxies(self, call: Call, logs: Logs, inbound: Inbound) -> dict[str, Any]:
        return logs.recording()

    def outbound(self, call: Call, scoring: Scoring, result: Any, error: BaseException | None) -> Any:
        if call.rank == ROOT:
            return self._send(call, scoring, result, error)
        return self._receive(call, scoring)

    def _send(self, call: Call, scoring: Scoring, result: Any, error: BaseException | None) -> Any:
        session, inbound, logs = call.session, scoring.state, scoring.logs
        assert logs is not None
        w, counts, offsets = call.world_size, inbound.counts, inbound.offsets
        bodies: dict[int, bytes | bytearray] = {}
        own: Any = None
        if error is None:
            try:
                keys, cols = result_columns(result, inbound.total, call.spec.name)
                logs.check(inbound.total)
                for r in range(w):
                    rows = slice(offsets[r], offsets[r + 1])
                    part = [Column(c.name, c.container, take(c.values, c.container, rows)) for c in cols]
                    if r == ROOT:
                        own = (rebuild_result(keys, part, None), logs.rows(rows))
                        continue
                    meta = {"keys": keys, "logs": logs.rows(rows)} if keys is not None or logs.records else None
                    bodies[r] = encode_frame(part, counts[r], allow_pickle=call.spec.allow_pickle, meta=meta)
            except Exception as e:
                error = e
        if error is not None:
            blob = error_blob(error)
            bodies = {r: blob for r in range(w) if r != ROOT}
        status = OK if error is None else FAILED
        cap = session.result_cap  # what the previous blocks announced (one size for every rank)
        if status == OK:
            session.result_predictor.update(call.fp, {r: len(b) for r, b in bodies.items()}, counts)
        nxt = session.result_predictor.next_capacity(counts)
        overflow = any(len(body) > cap - ResultChunk.HEADER for body in bodies.values())
        send = bytearray()
        for r in range(w):  # rank 0's own block is all zeros: a scatter sends every rank one block
            body = bodies.get(r, b"")
            send += ResultChunk(status, overflow, nxt, len(body), call.fp, call.seq).pack(body, cap)
        checks = _results_exchange(call, scoring, send, cap)[1]
        if overflow:
            tails = {r: bodies[r][cap - ResultChunk.HEADER :] for r in bodies}
            rest_counts = [len(tails.get(r, b"")) for r in range(w)]
            all_to_all(session, b"".join(tails.values()), rest_counts, [0] * w, 1, call.timeout)
        session.result_cap = nxt
        if checks is not None and _disagree(checks):
            return _mismatch(call, checks)
        if error is not None:
            return Raise(error)
        try:
            logs.replay(own[1])
        except Exception as e:
            return Raise(e)
        return own[0]

    def _receive(self, call: Call, scoring: Scoring) -> Any:
        session, inbound = call.session, scoring.state
        w, me = call.world_size, call.rank
        cap = session.result_cap
        buf, checks = _results_exchange(call, scoring, None, cap)
        chunk = ResultChunk.unpack(buf.data)
        body = buf[ResultChunk.HEADER : ResultChunk.HEADER + min(chunk.body_bytes, cap - ResultChunk.HEADER)].tobytes()
        if chunk.overflow:
            rest = max(0, chunk.body_bytes - (cap - ResultChunk.HEADER))
            recv = [rest if s == ROOT else 0 for s in range(w)]
            body += all_to_all(session, b"", [0] * w, recv, 1, call.timeout).tobytes()
        session.result_cap = chunk.next_capacity
        if checks is not None and _disagree(checks):
            return _mismatch(call, checks)
        try:
            if (chunk.fp, chunk.seq) != (call.fp, call.seq):
                return Raise(
                    MismatchError(
                        f"rank {ROOT} sent the results of another synced call than this rank's {call.description}. "
                        "HINT: every rank must call the same synced functions in the same order."
                    )
                )
            if chunk.status != OK:
                info = decode_value(body)
                return Raise(
                    RemoteError(ROOT, info["type"], info["message"], info["traceback"], function=call.spec.name)
                )
            nrows, cols, meta = decode_frame(body, allow_pickle=call.spec.allow_pickle)
            if nrows != inbound.counts[me]:
                raise CodecError(f"rank {ROOT} sent {nrows} results for {inbound.counts[me]} samples")
            meta = meta or {}
            Logs(call.bound, call.spec.name).replay(meta.get("logs", ()))
            return rebuild_result(meta.get("keys"), cols, call.device())
        except Exception as e:  # everything was exchanged: a local failure, the session stays usable
            return Raise(e)


def _results_exchange(
    call: Call, scoring: Scoring, blocks: bytearray | None, cap: int
) -> tuple[np.ndarray, list[CallCheck] | None]:
    """Send every rank its ``cap``-byte result block from rank 0; return this rank's block.

    After an inbound exchange every rank knows the ranks make the same call, and the blocks go out in
    one scatter. A reward group's hit had no inbound exchange: its blocks travel in an ``all_to_all`` in
    which every rank also sends every other rank a :class:`CallCheck`, so every rank can tell whether
    they all scored the same call (the returned checks, in rank order).
    """
    session, me, w = call.session, call.rank, call.world_size
    if not scoring.shared:
        return scatter(session, blocks or b"", cap, ROOT, 1, call.timeout), None
    mine = CallCheck(call.fp, call.seq, call.step, len(call.description.encode("utf-8", "backslashreplace")))
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
    parts = split(all_to_all(session, send, send_counts, recv_counts, 1, call.timeout), recv_counts)
    checks = [mine if s == me else CallCheck.unpack(parts[s][: CallCheck.SIZE].tobytes()) for s in range(w)]
    block = parts[ROOT][CallCheck.SIZE :] if me != ROOT else np.zeros(cap, dtype=np.uint8)
    return block, checks


def _disagree(checks: list[CallCheck]) -> bool:
    """Whether the ranks scored different calls (the same answer on every rank: all hold all checks)."""
    return any(not c.same_call(checks[0]) for c in checks[1:])


def _mismatch(call: Call, checks: list[CallCheck]) -> Raise:
    return mismatch(call.session, [c.desc_bytes for c in checks], call.description, 1, call.timeout)
