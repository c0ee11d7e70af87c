"""``mode="shard"``: whole groups spread over the ranks, each rank scores its share.

For expensive rewards that only compare samples *within* a group (a judge that ranks the K
completions of one prompt). Groups are consecutive runs of ``group_size`` global samples (TRL's
``num_generations``) or the samples sharing a value of the ``group_by`` column. Groups are assigned to
ranks in contiguous blocks of about equal sample counts, so a group split across ranks by the sampler
is scored whole, and the results are routed back to the ranks that own the samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._batch import concat, rebuild_result, result_columns, take
from ._codec import C_LIST, C_TENSOR, C_TUPLE, Column, decode_frame, encode_frame
from ._errors import CodecError, InputError
from ._exchange import FAILED, H_AUX, OK, error_blob
from ._modes import Call


def _assign_by_size(total: int, group_size: int, world_size: int) -> list[int]:
    if total % group_size:
        raise InputError(
            f"mode='shard' with group_size={group_size}: the global batch has {total} samples, which is not a "
            f"whole number of groups. HINT: group_size must divide the global batch (TRL: num_generations)."
        )
    groups = total // group_size
    return [(i // group_size) * world_size // max(groups, 1) for i in range(total)]


def _assign_by_key(keys: Sequence[Any], world_size: int, column: str) -> list[int]:
    first: dict[Any, int] = {}
    size: dict[Any, int] = {}
    try:
        for k in keys:
            first.setdefault(k, len(first))
            size[k] = size.get(k, 0) + 1
    except TypeError:
        raise InputError(
            f"mode='shard' with group_by={column!r}: its values must be hashable (str, int, tuple, ...)"
        ) from None
    total = len(keys)
    dest: dict[Any, int] = {}
    start = 0
    for k in first:  # groups in order of first appearance, contiguous blocks of ~total/world_size samples
        dest[k] = min(world_size - 1, int((start + size[k] / 2) * world_size / max(total, 1)))
        start += size[k]
    return [dest[k] for k in keys]


class ShardCall(Call):
    """One call in ``mode="shard"``."""

    key_frame: bytes | bytearray = b""  # stays empty if binding or encoding failed: pre() still joins the exchange

    def prepare(self) -> None:
        assert self.bound is not None
        by = self.spec.group_by
        if by is not None and by not in self.names:
            raise InputError(f"group_by={by!r} is not a per-sample argument of this call (columns: {self.names})")
        # Drop decisions and encodability are checked with the full local frame; the frames actually sent
        # are cut per destination once the assignment is known.
        super().prepare()
        if by is not None:
            col = next(c for c in self.bound.columns if c.name == by)
            self.key_frame = encode_frame([col], self.bound.n)

    def pre(self) -> None:
        w, me = self.world_size, self.rank
        try:
            with self.link.turns[0].turn(self.seq, self.timeout):
                h = self.exchange_header(b"", len(self.key_frame))
                self.dest = self._assignment(h)
                local = self.dest[self.offsets[me] : self.offsets[me + 1]]
                self.sent = [[i for i, d in enumerate(local) if d == dst] for dst in range(w)]
                error, frames = self._frames()
                blob = error_blob(error) if error is not None else b""
                row = [OK if error is None else FAILED, len(blob), *(len(f) for f in frames)]
                sizes = self.link.all_gather(row, 0, self.timeout)
                statuses = [int(x) for x in sizes[:, 0]]
                if any(s != OK for s in statuses):
                    self.link.raise_failures(
                        statuses, sizes[:, 1].tolist(), error, blob, 0, self.timeout, self.spec.name
                    )
                send_counts = [0 if d == me else len(frames[d]) for d in range(w)]
                recv_counts = [0 if s == me else int(sizes[s, 2 + me]) for s in range(w)]
                send = b"".join(frames[d] for d in range(w) if d != me)
                buf = self.link.all_to_all(send, send_counts, recv_counts, 0, self.timeout)
        except BaseException:
            self.skip_post()
            raise
        self.share = [s for s in range(w) for _ in range(self.dest[self.offsets[s] : self.offsets[s + 1]].count(me))]
        self.scores = bool(self.share)
        if not self.scores:
            return
        try:
            mv, pos = buf.data, 0
            frames_in: dict[int, memoryview] = {}
            for s in range(w):
                frames_in[s] = mv[pos : pos + recv_counts[s]]
                pos += recv_counts[s]
            self._merge_share(frames_in)
        except Exception as e:
            self.score_error = e

    def _assignment(self, h: np.ndarray) -> list[int]:
        if self.spec.group_size is not None:
            return _assign_by_size(self.total, self.spec.group_size, self.world_size)
        sizes = [int(x) for x in h[:, H_AUX]]
        blobs = self.link.broadcast_blobs(bytes(self.key_frame), sizes, 0, self.timeout)
        keys: list[Any] = []
        for s, blob in enumerate(blobs):
            nrows, cols, _ = decode_frame(blob)
            if nrows != self.counts[s] or len(cols) != 1:
                raise CodecError(f"rank {s} sent a malformed group_by column")
            values = cols[0].values
            keys.extend(values.tolist() if hasattr(values, "tolist") else values)
        return _assign_by_key(keys, self.world_size, str(self.spec.group_by))

    def _frames(self) -> tuple[BaseException | None, list[bytes]]:
        if self.error is not None:
            return self.error, [b""] * self.world_size
        assert self.bound is not None
        try:
            cols = [c for c in self.bound.columns if c.name not in self.dropped]
            frames = []
            for d, idx in enumerate(self.sent):
                if d == self.rank or not idx:
                    frames.append(b"")
                    continue
                part = [Column(c.name, c.container, take(c.values, c.container, idx)) for c in cols]
                frames.append(bytes(encode_frame(part, len(idx), allow_pickle=self.spec.allow_pickle)))
            return None, frames
        except Exception as e:
            return e, [b""] * self.world_size

    def _merge_share(self, frames: dict[int, memoryview]) -> None:
        assert self.bound is not None
        me = self.rank
        values: dict[str, Any] = {}
        decoded: dict[int, dict[str, Any]] = {}
        for s in sorted(set(self.share)):
            if s == me:
                continue
            nrows, cols, _ = decode_frame(frames[s], allow_pickle=self.spec.allow_pickle, skip=self.dropped)
            if nrows != self.share.count(s):
                raise CodecError(f"rank {s} sent {nrows} rows, expected {self.share.count(s)}")
            decoded[s] = {c.name: c.values for c in cols}
        for col in self.bound.columns:
            if col.name in self.dropped:
                continue
            parts = [
                take(col.values, col.container, self.sent[me]) if s == me else decoded[s][col.name]
                for s in sorted(set(self.share))
            ]
            device = col.values.device if col.container == C_TENSOR else None
            values[col.name] = concat(col.name, parts, col.container, device)
        self.set_inputs(values, self.recording_proxies())

    def post(self, result: Any, error: BaseException | None) -> Any:
        w, me = self.world_size, self.rank
        frames: list[bytes] = [b""] * w
        own: list[Column] | None = None
        own_meta: dict[str, Any] = {}
        keys: list[Any] | None = None
        if error is None:
            try:
                n = len(self.share)
                if self.scores:
                    keys, cols = result_columns(result, n, self.spec.name)
                else:
                    cols = []
                pos = 0
                metrics = [e for e in self.logs if e[0] == "metric"]
                for kind, key, value in self.logs:
                    if kind == "extra" and len(value) != n:
                        raise InputError(
                            f"log_extra({key!r}, values) was called with {len(value)} values inside synced function "
                            f"{self.spec.name!r}, which scores {n} samples on this rank; pass one value per sample."
                        )
                for s in range(w):
                    count = self.share.count(s)
                    sl = slice(pos, pos + count)
                    part = [Column(c.name, c.container, take(c.values, c.container, sl)) for c in cols]
                    extras = [("extra", k, list(v)[sl]) for kind, k, v in self.logs if kind == "extra"]
                    meta = {"keys": keys, "logs": extras + metrics, "scored": self.scores}
                    if s == me:
                        own, own_meta = part, meta
                    else:
                        frames[s] = bytes(encode_frame(part, count, allow_pickle=self.spec.allow_pickle, meta=meta))
                    pos += count
            except Exception as e:
                error = e
        blob = error_blob(error) if error is not None else b""
        with self.link.turns[1].turn(self.seq, self.timeout):
            row = [OK if error is None else FAILED, len(blob), *(len(f) for f in frames)]
            sizes = self.link.all_gather(row, 1, self.timeout)
            statuses = [int(x) for x in sizes[:, 0]]
            if any(x != OK for x in statuses):
                self.link.raise_failures(statuses, sizes[:, 1].tolist(), error, blob, 1, self.timeout, self.spec.name)
            send_counts = [0 if d == me else len(frames[d]) for d in range(w)]
            recv_counts = [0 if s == me else int(sizes[s, 2 + me]) for s in range(w)]
            buf = self.link.all_to_all(b"".join(frames), send_counts, recv_counts, 1, self.timeout)
        parts: dict[int, tuple[list[Column], dict[str, Any]]] = {}
        mv, pos = buf.data, 0
        for s in range(w):
            if s == me:
                if own is not None:
                    parts[s] = (own, own_meta)
                continue
            frame = mv[pos : pos + recv_counts[s]]
            pos += recv_counts[s]
            if len(frame):
                nrows, cols, meta = decode_frame(frame, allow_pickle=self.spec.allow_pickle)
                if nrows != len(self.sent[s]):
                    raise CodecError(f"rank {s} returned {nrows} results for {len(self.sent[s])} samples")
                parts[s] = (cols, meta)
        return self._assemble(parts)

    def _assemble(self, parts: dict[int, tuple[list[Column], dict[str, Any]]]) -> Any:
        """Put the results from every scoring rank back into this rank's local sample order."""
        n = self.counts[self.rank]
        scored = [d for d in range(self.world_size) if d in parts and parts[d][1]["scored"]]
        order = [i for d in scored for i in self.sent[d]]
        extras: dict[str, list[Any]] = {}
        for d in range(self.world_size):
            if d not in parts:
                continue
            for kind, key, value in parts[d][1]["logs"]:
                if kind == "metric":
                    self.replay([(kind, key, value)])
                else:
                    col = extras.setdefault(key, [None] * n)
                    for i, v in zip(self.sent[d], value, strict=True):
                        col[i] = v
        for key, col in extras.items():
            self.replay([("extra", key, col)])
        if not scored:
            return []
        keys = parts[scored[0]][1]["keys"]
        inverse = np.argsort(np.asarray(order, dtype=np.int64), kind="stable").tolist()
        columns = []
        for j, first in enumerate(parts[scored[0]][0]):
            pieces = [parts[d][0][j].values for d in scored]
            if first.container in (C_LIST, C_TUPLE):
                pieces = [list(p) for p in pieces]
                container = C_LIST if first.container == C_LIST else C_TUPLE
            else:
                container = first.container
            merged = concat(first.name, pieces, container, None)
            columns.append(Column(first.name, first.container, take(merged, container, inverse)))
        return rebuild_result(keys, columns, self.device())
