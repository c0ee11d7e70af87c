"""Execution modes: who scores which samples, and how inputs and results move.

A call runs in three steps, the same for every mode::

    pre()    inbound exchange (channel 0): header all_gather + payload all_to_all
    score    the function, on the rank(s) that score
    post()   outbound exchange (channel 1): results (or the error) back to their ranks

``pre()`` always consumes the call's channel-0 turn; if it raises (collectively, on every rank) it
also consumes the channel-1 turn. If it returns, ``post()`` must be called exactly once. Errors in
binding, encoding, decoding, the function or its result are *statuses* that travel through these
exchanges, so every rank raises together.

Collectives per call (success path): ``main`` 2 (headers with the payload in per-pair eager chunks,
results with a predicted size); ``replicate`` 2 (the same inbound exchange, then a status exchange);
plus one when a payload outgrows the chunk predicted from the previous call (always on a function's
first call) or a result slice outgrows its predicted size; ``shard`` 5 (header, key/size exchange,
payload, result header, results).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ._batch import concat, rebuild_result, result_columns, take
from ._binding import Binder, Bound
from ._codec import C_TENSOR, CONTAINERS, Column, decode_frame, decode_value, encode_frame, is_plain
from ._errors import CodecError, InputError, RemoteError
from ._exchange import (
    FAILED,
    H_N,
    H_SIZE,
    HEADER_LEN,
    MAX_DROPPABLE,
    OK,
    VERSION,
    Link,
    drop_mask,
    dropped_names,
    error_blob,
    fingerprint,
)

__all__ = ["MODES", "Call", "Spec"]

MODES = ("main", "replicate", "shard")
ROOT = 0
_CHUNK = struct.Struct("<BBxxIQ")  # status, overflow round follows, next per-sample capacity, body bytes
_BASE_CAPACITY = 240
_DEFAULT_PER_SAMPLE = 16
_MAX_PER_SAMPLE = 1 << 20
_MAX_EAGER = 4 << 20  # payloads up to 4 MiB per rank and destination ride in the header collective
_EAGER_MARGIN = 1.2  # eager chunk = 1.2 x the previous call's payload: a bit of growth still fits


@dataclass(frozen=True)
class Spec:
    """Everything about a decorated function that does not change between calls."""

    fn: Callable[..., Any]
    name: str
    mode: str
    timeout: float
    group_size: int | None
    group_by: str | None
    allow_pickle: bool
    binder: Binder

    @property
    def key(self) -> str:
        group = f", group_size={self.group_size}" if self.group_size else ""
        group += f", group_by={self.group_by!r}" if self.group_by else ""
        pickle = ", allow_pickle=True" if self.allow_pickle else ""
        return f"{self.name}(mode={self.mode!r}{group}{pickle})"


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


class Call:
    """One synced call on one rank. Subclasses implement the modes."""

    scores: bool = False
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}  # noqa: RUF012 - replaced per instance

    def __init__(self, spec: Spec, link: Link, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.spec = spec
        self.link = link
        self.rank = link.rank
        self.world_size = link.world_size
        self.seq = link.next_seq()
        self.error: BaseException | None = None  # this rank's own failure before the exchange
        self.score_error: BaseException | None = None  # failure preparing the scoring inputs
        self.bound: Bound | None = None
        self.names: list[str] = []
        self.frame: bytes | bytearray = b""
        self.dropped_local: list[str] = []
        self.logs: list[tuple[str, Any, Any]] = []
        try:
            self.bound = spec.binder.bind(args, kwargs)
            self.names = [c.name for c in self.bound.columns]
            self.prepare()
        except Exception as e:
            self.error = e
        columns = ", ".join(f"{c.name}:{CONTAINERS[c.container]}" for c in self.bound.columns) if self.bound else "?"
        self.schema = f"{spec.key} per-sample columns [{columns}]"
        self.fp = fingerprint(self.schema)
        self.description = f"call #{self.seq}: {self.schema}"
        self.blob = error_blob(self.error) if self.error is not None else b""

    # ------------------------------------------------------------------------------------------ hooks

    def prepare(self) -> None:
        """Encode this rank's columns (runs before the exchange, outside the turn)."""
        assert self.bound is not None
        droppable = frozenset(n for i, n in enumerate(self.names) if i < MAX_DROPPABLE) & self.bound.droppable
        self.frame = encode_frame(
            self.bound.columns,
            self.bound.n,
            allow_pickle=self.spec.allow_pickle,
            droppable=droppable,
            dropped=self.dropped_local,
        )

    def pre(self) -> None:
        raise NotImplementedError

    def post(self, result: Any, error: BaseException | None) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------ helpers

    @property
    def timeout(self) -> float:
        return self.spec.timeout

    def header(self, payload_bytes: int, aux: int = 0) -> list[int]:
        n = self.bound.n if self.bound is not None else 0
        status = OK if self.error is None else FAILED
        size = payload_bytes if self.error is None else len(self.blob)
        mask = drop_mask(self.names, self.dropped_local)
        return [VERSION, self.seq, status, self.fp, n, size, len(self.description.encode()), aux, *mask]

    def exchange_header(self, payload: bytes | bytearray = b"", aux: int = 0, dests: Sequence[int] = ()) -> np.ndarray:
        """Send every rank this rank's header, plus the start of its payload to ``dests``; check the headers.

        One ``all_to_all``: the block to rank ``d`` is the header row followed by an *eager* chunk of
        ``Link.eager[me, d]`` bytes -- a per-pair size predicted from the previous call, identical on every
        rank (it must be: gloo aborts the process on mismatched collective sizes). In the steady state the
        whole payload rides in it, so the payload needs no collective of its own. Raises collectively on
        failure or mismatch.
        """
        w, me = self.world_size, self.rank
        eager = self.link.eager
        row = np.asarray(self.header(len(payload), aux), dtype=np.int64).tobytes()
        send = bytearray()
        send_counts = []
        for d in range(w):
            cap = int(eager[me, d])
            chunk = payload[:cap] if d in dests else b""
            send += row
            send += chunk
            send += bytes(cap - len(chunk))
            send_counts.append(len(row) + cap)
        recv_counts = [len(row) + int(eager[s, me]) for s in range(w)]
        buf = self.link.all_to_all(send, send_counts, recv_counts, 0, self.timeout)
        # Only a successful call sizes the eager chunks of the next one (receive_payloads); every other
        # outcome (a failure, a mismatch) empties them, identically on every rank.
        self.link.eager = np.zeros((w, w), dtype=np.int64)
        h = np.empty((w, HEADER_LEN), dtype=np.int64)
        self.eager_in: dict[int, np.ndarray] = {}
        self.eager_used = eager
        pos = 0
        for src in range(w):
            h[src] = buf[pos : pos + len(row)].view(np.int64)
            self.eager_in[src] = buf[pos + len(row) : pos + recv_counts[src]]
            pos += recv_counts[src]
        self.link.check_header(h, self.error, self.blob, self.description, 0, self.timeout, self.spec.name)
        self.counts = [int(x) for x in h[:, H_N]]
        self.offsets = [0, *np.cumsum(self.counts).tolist()]
        self.total = self.offsets[-1]
        self.dropped = dropped_names(self.names, h)
        self.sizes = [int(x) for x in h[:, H_SIZE]]
        return h

    def receive_payloads(self, payload: bytes | bytearray, dests: Callable[[int], Sequence[int]]) -> dict[int, Any]:
        """Complete every payload bound for this rank, after :meth:`exchange_header`.

        One more ``all_to_all`` only if some payload outgrew its eager chunk. Also predicts the next call's
        chunks from this call's sizes (identical on every rank: they all see the same headers).
        """
        w, me, eager, sizes = self.world_size, self.rank, self.eager_used, self.sizes
        rest = [[max(0, sizes[s] - int(eager[s, d])) if d in dests(s) else 0 for d in range(w)] for s in range(w)]
        frames: dict[int, Any] = {s: self.eager_in[s][: sizes[s]].data for s in range(w) if me in dests(s)}
        if any(any(r) for r in rest):
            mine = dests(me)
            send = b"".join(payload[int(eager[me, d]) :] if rest[me][d] else b"" for d in range(w) if d in mine)
            buf = self.link.all_to_all(send, rest[me], [rest[s][me] for s in range(w)], 0, self.timeout)
            pos = 0
            for s in range(w):
                if rest[s][me]:
                    head = self.eager_in[s][: int(eager[s, me])].tobytes()
                    frames[s] = head + buf[pos : pos + rest[s][me]].tobytes()
                    pos += rest[s][me]
        nxt = np.zeros((w, w), dtype=np.int64)
        for s in range(w):
            for d in dests(s):
                nxt[s, d] = min(_MAX_EAGER, _round8(int(sizes[s] * _EAGER_MARGIN)))
        self.link.eager = nxt
        return frames

    def skip_post(self) -> None:
        """Consume the channel-1 turn without exchanging (every rank does so when pre() failed)."""
        with self.link.turns[1].turn(self.seq, self.timeout):
            pass

    def merge(self, frames: Mapping[int, bytes | memoryview], ranks: Sequence[int]) -> dict[str, Any]:
        """Decode the given ranks' frames and concatenate every column in rank order."""
        assert self.bound is not None
        decoded: dict[int, dict[str, Any]] = {}
        for s in ranks:
            if s == self.rank:
                continue
            nrows, cols, _ = decode_frame(frames[s], allow_pickle=self.spec.allow_pickle, skip=self.dropped)
            if nrows != self.counts[s]:
                raise CodecError(f"rank {s} sent {nrows} rows but announced {self.counts[s]}")
            decoded[s] = {c.name: c.values for c in cols}
        values: dict[str, Any] = {}
        for col in self.bound.columns:
            if col.name in self.dropped:
                continue
            parts = []
            for s in ranks:
                if s == self.rank:
                    parts.append(col.values)
                elif col.name in decoded[s]:
                    parts.append(decoded[s][col.name])
                else:
                    raise CodecError(f"rank {s} did not send column {col.name!r}")
            device = col.values.device if col.container == C_TENSOR else None
            values[col.name] = concat(col.name, parts, col.container, device)
        return values

    def set_inputs(self, values: dict[str, Any], proxies: dict[str, Any]) -> None:
        assert self.bound is not None
        self.args, self.kwargs = self.bound.call_args({**values, **proxies}, self.dropped)

    def shared_callable(self, name: str) -> Callable[..., Any] | None:
        """The caller's own ``log_extra`` / ``log_metric`` (TRL's), if the call passed one."""
        assert self.bound is not None
        args = self.bound.arguments.arguments
        value = args.get(name)
        if value is None:
            for pname, v in args.items():
                if self.bound.arguments.signature.parameters[pname].kind.name == "VAR_KEYWORD":
                    value = v.get(name)
        return value if callable(value) else None

    def recording_proxies(self) -> dict[str, Any]:
        """``log_extra``/``log_metric`` stand-ins that record calls, for replay on every rank."""
        proxies: dict[str, Any] = {}
        if self.shared_callable("log_extra") is not None:

            def log_extra(column: str, values: Sequence[Any]) -> None:
                self.logs.append(("extra", column, list(values)))

            proxies["log_extra"] = log_extra
        if self.shared_callable("log_metric") is not None:

            def log_metric(name: str, value: float) -> None:
                self.logs.append(("metric", name, value))

            proxies["log_metric"] = log_metric
        return proxies

    def logs_for(self, lo: int, hi: int) -> list[tuple[str, Any, Any]]:
        """The recorded log calls as the ranks owning samples ``lo:hi`` must replay them."""
        out = []
        for kind, key, value in self.logs:
            if kind == "extra":
                if len(value) != self.total:
                    raise InputError(
                        f"log_extra({key!r}, values) was called with {len(value)} values inside synced function "
                        f"{self.spec.name!r}, which sees {self.total} samples; pass one value per sample."
                    )
                value = value[lo:hi]
            out.append((kind, key, value))
        return out

    def replay(self, logs: Sequence[Sequence[Any]]) -> None:
        for kind, key, value in logs:
            fn = self.shared_callable("log_extra" if kind == "extra" else "log_metric")
            if fn is not None:
                fn(key, value)

    def own_slice(self, keys: list[Any] | None, cols: Sequence[Column], lo: int, hi: int) -> Any:
        sl = [Column(c.name, c.container, take(c.values, c.container, slice(lo, hi))) for c in cols]
        return rebuild_result(keys, sl, None)

    def device(self) -> torch.device | None:
        """Where tensors returned to this rank go: the device of its tensor inputs, else the current GPU."""
        if self.bound is not None:
            for c in self.bound.columns:
                if c.container == C_TENSOR:
                    return c.values.device  # type: ignore[no-any-return]
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return torch.device("cuda", torch.cuda.current_device())
        return None


class MainCall(Call):
    """``mode="main"``: the whole batch goes to rank 0, which scores it once and sends back the slices."""

    def prepare(self) -> None:
        if self.rank != ROOT:
            super().prepare()
            return
        # Rank 0 scores its own columns as passed and sends nothing: skip encoding, only decide which
        # **kwargs columns hold non-plain data (the others drop those too).
        assert self.bound is not None
        for i, col in enumerate(self.bound.columns):
            if i < MAX_DROPPABLE and col.name in self.bound.droppable and not is_plain(col.values, col.container):
                self.dropped_local.append(col.name)

    def pre(self) -> None:
        def to_root(src: int) -> Sequence[int]:
            return () if src == ROOT else (ROOT,)

        try:
            with self.link.turns[0].turn(self.seq, self.timeout):
                payload: bytes | bytearray = b"" if self.error is not None else self.frame
                self.exchange_header(payload, dests=to_root(self.rank))
                frames = self.receive_payloads(payload, to_root)
        except BaseException:
            self.skip_post()
            raise
        if self.rank != ROOT:
            return
        self.scores = True
        try:
            self.set_inputs(self.merge(frames, range(self.world_size)), self.recording_proxies())
        except Exception as e:
            self.score_error = e

    def post(self, result: Any, error: BaseException | None) -> Any:
        if self.rank == ROOT:
            return self._send_results(result, error)
        return self._receive_results()

    def _capacity(self, per_sample: int, r: int) -> int:
        return _round8(_CHUNK.size + _BASE_CAPACITY + per_sample * self.counts[r])

    def _send_results(self, result: Any, error: BaseException | None) -> Any:
        w = self.world_size
        bodies: dict[int, bytes | bytearray] = {}
        own: Any = None
        own_logs: list[tuple[str, Any, Any]] = []
        if error is None:
            try:
                keys, cols = result_columns(result, self.total, self.spec.name)
                for r in range(w):
                    lo, hi = self.offsets[r], self.offsets[r + 1]
                    logs = self.logs_for(lo, hi)
                    if r == ROOT:
                        own, own_logs = self.own_slice(keys, cols, lo, hi), logs
                        continue
                    sliced = [Column(c.name, c.container, take(c.values, c.container, slice(lo, hi))) for c in cols]
                    meta = {"keys": keys, "logs": logs} if keys is not None or logs else None
                    bodies[r] = encode_frame(sliced, hi - lo, allow_pickle=self.spec.allow_pickle, meta=meta)
            except Exception as e:
                error = e
        status = OK if error is None else FAILED
        if error is not None:
            blob = error_blob(error)
            bodies = {r: blob for r in range(w) if r != ROOT}
        with self.link.turns[1].turn(self.seq, self.timeout):
            # The predicted capacity is read and updated inside the turn: concurrent calls with the same
            # fingerprint must see it in sequence order, as the receiving ranks do.
            per_sample = self.link.capacity.get(self.fp, _DEFAULT_PER_SAMPLE)
            caps = [self._capacity(per_sample, r) for r in range(w)]
            need = [
                math.ceil((len(bodies[r]) + _CHUNK.size - _BASE_CAPACITY) / self.counts[r])
                for r in bodies
                if self.counts[r]
            ]
            next_per_sample = per_sample
            if need and status == OK:
                next_per_sample = min(_MAX_PER_SAMPLE, _round8(int(max(need) * 1.25)))
            next_per_sample = max(next_per_sample, 8)
            overflow = any(len(bodies[r]) > caps[r] - _CHUNK.size for r in bodies)
            send = bytearray()
            counts = [0] * w
            for r in range(w):
                if r == ROOT:
                    continue
                body = bodies[r]
                first = bytes(body[: caps[r] - _CHUNK.size])
                chunk = _CHUNK.pack(status, overflow, next_per_sample, len(body)) + first
                send += chunk + bytes(caps[r] - len(chunk))
                counts[r] = caps[r]
            self.link.all_to_all(send, counts, [0] * w, 1, self.timeout)
            if overflow:
                rest = bytearray()
                counts = [0] * w
                for r in bodies:
                    tail = bodies[r][caps[r] - _CHUNK.size :]
                    rest += tail
                    counts[r] = len(tail)
                self.link.all_to_all(rest, counts, [0] * w, 1, self.timeout)
            self.link.capacity[self.fp] = next_per_sample
        if error is not None:
            raise error
        self.replay(own_logs)
        return own

    def _receive_results(self) -> Any:
        w = self.world_size
        with self.link.turns[1].turn(self.seq, self.timeout):
            per_sample = self.link.capacity.get(self.fp, _DEFAULT_PER_SAMPLE)
            cap = self._capacity(per_sample, self.rank)
            buf = self.link.all_to_all(b"", [0] * w, [cap if s == ROOT else 0 for s in range(w)], 1, self.timeout)
            status, overflow, next_per_sample, total = _CHUNK.unpack_from(buf.data)
            body = buf[_CHUNK.size : _CHUNK.size + min(total, cap - _CHUNK.size)].tobytes()
            if overflow:
                rest = max(0, total - (cap - _CHUNK.size))
                body += self.link.all_to_all(
                    b"", [0] * w, [rest if s == ROOT else 0 for s in range(w)], 1, self.timeout
                ).tobytes()
            self.link.capacity[self.fp] = next_per_sample
        if status != OK:
            info = decode_value(body)
            raise RemoteError(ROOT, info["type"], info["message"], info["traceback"], function=self.spec.name)
        nrows, cols, meta = decode_frame(body, allow_pickle=self.spec.allow_pickle)
        if nrows != self.counts[self.rank]:
            raise CodecError(f"rank {ROOT} sent {nrows} results for {self.counts[self.rank]} samples")
        meta = meta or {}
        self.replay(meta.get("logs", ()))
        return rebuild_result(meta.get("keys"), cols, self.device())


class ReplicateCall(Call):
    """``mode="replicate"``: every rank gets the whole batch, scores it, and keeps its own slice."""

    def pre(self) -> None:
        def others(src: int) -> Sequence[int]:
            return [d for d in range(self.world_size) if d != src]

        try:
            with self.link.turns[0].turn(self.seq, self.timeout):
                payload = b"" if self.error is not None else bytes(self.frame)
                self.exchange_header(payload, dests=others(self.rank))
                frames = self.receive_payloads(payload, others)
        except BaseException:
            self.skip_post()
            raise
        self.scores = True
        try:
            self.set_inputs(self.merge(frames, range(self.world_size)), self.forwarding_proxies())
        except Exception as e:
            self.score_error = e

    def forwarding_proxies(self) -> dict[str, Any]:
        """``log_extra`` that forwards only this rank's slice; ``log_metric`` is passed through."""
        real = self.shared_callable("log_extra")
        if real is None:
            return {}
        lo, hi = self.offsets[self.rank], self.offsets[self.rank + 1]

        def log_extra(column: str, values: Sequence[Any]) -> None:
            if len(values) != self.total:
                raise InputError(
                    f"log_extra({column!r}, values) was called with {len(values)} values inside synced function "
                    f"{self.spec.name!r}, which sees {self.total} samples; pass one value per sample."
                )
            real(column, list(values)[lo:hi])

        return {"log_extra": log_extra}

    def post(self, result: Any, error: BaseException | None) -> Any:
        own: Any = None
        if error is None:
            try:
                keys, cols = result_columns(result, self.total, self.spec.name)
                own = self.own_slice(keys, cols, self.offsets[self.rank], self.offsets[self.rank + 1])
            except Exception as e:
                error = e
        blob = error_blob(error) if error is not None else b""
        with self.link.turns[1].turn(self.seq, self.timeout):
            s = self.link.all_gather([OK if error is None else FAILED, len(blob)], 1, self.timeout)
            statuses = [int(x) for x in s[:, 0]]
            if any(x != OK for x in statuses):
                self.link.raise_failures(statuses, s[:, 1].tolist(), error, blob, 1, self.timeout, self.spec.name)
        return own


def make_call(spec: Spec, link: Link, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    if spec.mode == "main":
        return MainCall(spec, link, args, kwargs)
    if spec.mode == "replicate":
        return ReplicateCall(spec, link, args, kwargs)
    from ._shard import ShardCall

    return ShardCall(spec, link, args, kwargs)
