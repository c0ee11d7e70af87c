"""``mode="shard"``: whole groups spread over the ranks, each rank scores its share.

For expensive rewards that only compare samples *within* a group (a judge that ranks the K completions
of one prompt). Groups are consecutive runs of ``group_size`` global samples (TRL's ``num_generations``)
or the samples sharing a value of the ``group_by`` column, compared by content: each rank sends every
rank a 16-byte digest of each sample's value (:func:`group_keys`), so a TRL conversational prompt (a list
of message dicts) is a group key like a str. Groups go to ranks in contiguous blocks of
about equal sample counts, so a group split across ranks by the sampler is scored whole, and the
results are routed back to the ranks that own the samples.

Several ranks score, so their results must agree in shape before they are put together: every scoring
rank announces a signature of its result (dict keys, containers, dtypes) in the outbound exchange, and
if two differ every rank raises. Dict results are matched by key, never by position.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._batch import concat, rebuild_result, result_columns, result_signature, take, take_columns
from .._codec import C_LIST, C_NDARRAY, C_TENSOR, C_TUPLE, MAX_DEPTH, Column, decode_frame, encode_frame
from .._errors import CodecError, InputError
from .._exchange import Inbound, all_to_all, broadcast_blobs, status_round
from .._logs import Logs
from .._options import Options
from .._outcome import Error, Outcome, Value
from .._wire import INBOUND, OUTBOUND, split
from ._base import Call, Mode, Payload, Scoring

__all__ = ["KEY_BYTES", "ShardMode", "assign_by_key", "assign_by_size", "group_keys"]

KEY_BYTES = 16  # a group key on the wire: the blake2b digest of a sample's group_by value


def assign_by_size(total: int, group_size: int, world_size: int) -> list[int]:
    """The scoring rank of every global sample when groups are ``group_size`` consecutive samples."""
    if total % group_size:
        raise InputError(
            f"mode='shard' with group_size={group_size}: the global batch has {total} samples, which is not a "
            f"whole number of groups. HINT: group_size must divide the global batch (TRL: num_generations)."
        )
    groups = total // group_size
    return [(i // group_size) * world_size // max(groups, 1) for i in range(total)]


def size_bounds(total: int, group_size: int, world_size: int) -> list[int]:
    """Where each rank's block of :func:`assign_by_size` starts in the global batch (``world_size + 1`` bounds).

    Rank ``r`` scores the groups ``j`` with ``j * world_size // groups == r``, i.e. from group
    ``ceil(r * groups / world_size)`` on: O(world_size) work, whatever the announced sample counts are.
    """
    if total % group_size:
        assign_by_size(total, group_size, world_size)  # raises its InputError, before building anything
    groups = max(total // group_size, 1)
    return [min(total, -(-r * groups // world_size) * group_size) for r in range(world_size + 1)]


def _canonical(value: Any, out: bytearray, depth: int) -> None:
    """Append the canonical bytes of a plain value: equal values (``==``) write the same bytes in every process.

    Numbers that compare equal write alike (``1``, ``1.0``, ``True``, ``np.int64(1)``); dicts are written in
    the order of their keys (str keys: as str, else by their bytes); a list and a tuple differ
    (``[1] != (1,)``); arrays and tensors are their ``tolist()``. Nothing depends on ``hash()``, which differs
    between processes for str and bytes. Exact built-in types are dispatched first (the common case: TRL's
    prompts are str or lists of str-keyed dicts of str), then subclasses and numpy types.
    """
    if depth > MAX_DEPTH:
        raise TypeError(f"it is nested more than {MAX_DEPTH} levels deep")
    t = type(value)
    if t is str:
        b = value.encode("utf-8", "surrogatepass")
        out += b"s%d:" % len(b)
        out += b
    elif t is list or t is tuple:
        out += b"%s%d:" % (b"l" if t is list else b"t", len(value))
        for v in value:
            _canonical(v, out, depth + 1)
    elif t is dict:
        _canonical_dict(value, out, depth)
    elif t is int or t is bool:
        out += b"i%d;" % value
    elif value is None:
        out += b"N"
    else:
        _canonical_other(value, out, depth)


def _canonical_dict(value: dict[Any, Any], out: bytearray, depth: int) -> None:
    out += b"d%d:" % len(value)
    if all(isinstance(k, str) for k in value):  # chat messages: in the order of their str keys
        for k in sorted(value):
            _canonical(k, out, depth + 1)
            _canonical(value[k], out, depth + 1)
        return
    items: list[tuple[bytes, bytes]] = []
    for k, v in value.items():
        key, item = bytearray(), bytearray()
        _canonical(k, key, depth + 1)
        _canonical(v, item, depth + 1)
        items.append((bytes(key), bytes(item)))
    for key_bytes, item_bytes in sorted(items):  # keys are unique: the values never decide the order
        out += key_bytes
        out += item_bytes


def _canonical_other(value: Any, out: bytearray, depth: int) -> None:
    """:func:`_canonical` of anything but an exact str, list, tuple, dict, int, bool or ``None``."""
    if isinstance(value, str):  # a str subclass (numpy's str_): its characters
        b = str.encode(value, "utf-8", "surrogatepass")
        out += b"s%d:" % len(b)
        out += b
    elif isinstance(value, (bool, int, np.integer)):
        out += b"i%d;" % int(value)
    elif isinstance(value, (float, np.floating)):
        f = float(value)
        if math.isfinite(f) and f.is_integer():
            out += b"i%d;" % int(f)
        else:
            out += b"f" + repr(f).encode() + b";"
    elif isinstance(value, (complex, np.complexfloating)):
        c = complex(value)
        if c.imag:
            out += b"c" + repr(c).encode() + b";"
        else:
            _canonical_other(c.real, out, depth)
    elif isinstance(value, (list, tuple)):
        _canonical(list(value) if isinstance(value, list) else tuple(value), out, depth)
    elif isinstance(value, dict):
        _canonical_dict(value, out, depth)
    elif isinstance(value, bytes):
        out += b"b%d:" % len(value)
        out += value
    elif isinstance(value, (np.ndarray, torch.Tensor)):
        _canonical((value.detach().cpu() if isinstance(value, torch.Tensor) else value).tolist(), out, depth + 1)
    elif isinstance(value, np.generic):
        _canonical(value.item(), out, depth)
    else:
        raise TypeError(f"it holds a {type(value).__module__}.{type(value).__qualname__}")


def group_keys(values: Any, container: int, column: str) -> bytes:
    """The group key of every sample: ``KEY_BYTES`` per sample, the blake2b digest of its value's content.

    Every rank computes the same key for equal values (see :func:`_canonical`), so samples group by the
    content of their ``group_by`` value -- a str, an int, a TRL conversational prompt (a list of message
    dicts), a row of an array -- and only these digests travel, not the values.

    Raises:
        InputError: a value is not plain data.
    """
    if container in (C_NDARRAY, C_TENSOR):
        values = (values.detach().cpu() if isinstance(values, torch.Tensor) else values).tolist()
    keys = bytearray()
    out = bytearray()
    blake2b = hashlib.blake2b
    for i, v in enumerate(values):
        t = type(v)
        try:
            if t is str:  # the common keys inline, the same bytes as _canonical writes
                b = v.encode("utf-8", "surrogatepass")
                keys += blake2b(b"s%d:%s" % (len(b), b), digest_size=KEY_BYTES).digest()
                continue
            if t is int:
                keys += blake2b(b"i%d;" % v, digest_size=KEY_BYTES).digest()
                continue
            out.clear()
            _canonical(v, out, 0)
        except (TypeError, ValueError) as e:  # ValueError: an int of more digits than str() writes
            raise InputError(
                f"mode='shard' with group_by={column!r}: the value of this rank's sample {i} cannot be a group key "
                f"({e}). HINT: group by a column of plain data (str, int, float, bytes, None, and lists, tuples and "
                "dicts of them, such as TRL's prompts), e.g. a per-prompt id."
            ) from None
        keys += blake2b(out, digest_size=KEY_BYTES).digest()
    return bytes(keys)


def assign_by_key(keys: Sequence[Any], world_size: int, column: str) -> list[int]:
    """The scoring rank of every global sample when a group is the samples sharing a key (hashable values)."""
    first: dict[Any, int] = {}
    size: dict[Any, int] = {}
    for k in keys:
        first.setdefault(k, len(first))
        size[k] = size.get(k, 0) + 1
    total = len(keys)
    dest: dict[Any, int] = {}
    start = 0
    for k in first:  # groups in order of first appearance, contiguous blocks of ~total/world_size samples
        dest[k] = min(world_size - 1, int((start + size[k] / 2) * world_size / max(total, 1)))
        start += size[k]
    return [dest[k] for k in keys]


class _Shard:
    """One call's routing: which rank scores each sample, what goes where."""

    def __init__(self, local: list[int], share: dict[int, int], world_size: int) -> None:
        self.sent = [[i for i, d in enumerate(local) if d == dst] for dst in range(world_size)]  # my rows, per scorer
        # the rows this rank scores, as (source rank, count) in rank order
        self.share = {s: n for s, n in share.items() if n}
        self.key_frame: bytes | bytearray = b""

    @classmethod
    def of_dest(cls, dest: list[int], offsets: list[int], rank: int, world_size: int) -> _Shard:
        """The plan from the scoring rank of every global sample."""
        share = {s: dest[offsets[s] : offsets[s + 1]].count(rank) for s in range(world_size)}
        return cls(dest[offsets[rank] : offsets[rank + 1]], share, world_size)

    @classmethod
    def of_size(cls, group_size: int, offsets: list[int], rank: int, world_size: int) -> _Shard:
        """The plan of :func:`assign_by_size`, from block bounds: work in this rank's samples, not the batch's."""
        total = offsets[-1]
        bounds = size_bounds(total, group_size, world_size)
        groups = max(total // group_size, 1)
        local = [i // group_size * world_size // groups for i in range(offsets[rank], offsets[rank + 1])]
        lo, hi = bounds[rank], bounds[rank + 1]
        share = {s: max(0, min(offsets[s + 1], hi) - max(offsets[s], lo)) for s in range(world_size)}
        return cls(local, share, world_size)


@dataclass(frozen=True)
class ShardScoring(Scoring):
    """Shard mode's scoring: the call's routing, which its outbound exchange follows back."""

    inbound: Inbound
    plan: _Shard


class ShardMode(Mode[ShardScoring]):
    name = "shard"
    own_options = frozenset({"group_size", "group_by"})

    def check(self, options: Options) -> None:
        group_size, group_by = options.group_size, options.group_by
        if (group_size is None) == (group_by is None):
            raise ValueError("mode='shard' needs exactly one of group_size=K or group_by='<column>'")
        if group_size is not None and (
            isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1
        ):
            raise ValueError(f"group_size must be a positive int, not {group_size!r}")

    def prepare(self, call: Call) -> Payload:
        assert call.bound is not None
        by = call.spec.options.group_by
        if by is not None and by not in call.names:
            raise InputError(f"group_by={by!r} is not a per-sample argument of this call (columns: {call.names})")
        # Drop decisions and encodability are checked on the full local frame; the frames actually sent are
        # cut per destination once the assignment is known.
        dropped = call.encode().dropped
        if by is None:
            return Payload(b"", dropped)
        col = next(c for c in call.bound.columns if c.name == by)
        return Payload(group_keys(col.values, col.container, by), dropped)  # only the keys travel before the plan

    # ------------------------------------------------------------------------------------------ inbound

    def inbound(self, call: Call, own: Outcome[Payload]) -> Value[ShardScoring] | Error:
        session, w, me = call.session, call.world_size, call.rank
        key_frame = bytes(own.value.frame) if isinstance(own, Value) else b""
        got = call.exchange(own, None, aux=len(key_frame))
        if isinstance(got, Error):
            return got
        inbound = got.value
        error: BaseException | None = None
        frames = [b""] * w
        try:
            group_size = call.spec.options.group_size
            if group_size is not None:
                if call.bound is not None and inbound.counts[me] != call.bound.n:  # (group_by: the key frames check)
                    raise CodecError(
                        f"this rank's header announced {inbound.counts[me]} samples for its {call.bound.n}"
                    )
                plan = _Shard.of_size(group_size, inbound.offsets, me, w)
            else:
                dest = self._assign_by_key(call, key_frame, inbound.headers.aux, inbound.counts)
                plan = _Shard.of_dest(dest, inbound.offsets, me, w)
            frames = self._frames(call, inbound, plan)
        except BaseException as e:
            error = e
        sizes = status_round(session, error, INBOUND, call.timeout, call.spec.name, extra=[len(f) for f in frames])
        if isinstance(sizes, Error):
            return sizes
        send_counts = [0 if d == me else len(frames[d]) for d in range(w)]
        recv_counts = [0 if s == me else int(sizes.value[s, me]) for s in range(w)]
        buf = all_to_all(
            session, b"".join(frames[d] for d in range(w) if d != me), send_counts, recv_counts, INBOUND, call.timeout
        )
        if not plan.share:
            return Value(ShardScoring(None, Logs(call.bound, call.spec.name), inbound, plan))
        logs = Logs(call.bound, call.spec.name)
        try:
            parts = dict(enumerate(split(buf, recv_counts)))
            values = call.merge(inbound, parts, plan.share, lambda v, c: take(v, c, plan.sent[me]))
        except BaseException as e:
            return Value(ShardScoring(Error(e), logs, inbound, plan))
        return Value(ShardScoring(call.inputs(inbound, values, logs.recording), logs, inbound, plan))

    def _assign_by_key(self, call: Call, key_frame: bytes, sizes: list[int], counts: list[int]) -> list[int]:
        keys: list[bytes] = []
        for s, blob in enumerate(broadcast_blobs(call.session, key_frame, sizes, INBOUND, call.timeout)):
            if len(blob) != KEY_BYTES * counts[s]:
                raise CodecError(f"rank {s} sent {len(blob)} bytes of group keys for {counts[s]} samples")
            keys.extend(blob[i : i + KEY_BYTES] for i in range(0, len(blob), KEY_BYTES))
        return assign_by_key(keys, call.world_size, str(call.spec.options.group_by))

    def _frames(self, call: Call, inbound: Inbound, plan: _Shard) -> list[bytes]:
        assert call.bound is not None
        cols = [c for c in call.bound.columns if c.name not in inbound.dropped]
        frames = []
        for d, idx in enumerate(plan.sent):
            if d == call.rank or not idx:
                frames.append(b"")
                continue
            part = take_columns(cols, idx)
            frames.append(bytes(encode_frame(part, len(idx), allow_pickle=call.spec.options.allow_pickle)))
        return frames

    # ------------------------------------------------------------------------------------------ outbound

    def outbound(self, call: Call, scoring: ShardScoring, result: Outcome[Any]) -> Outcome[Any]:
        session, w, me = call.session, call.world_size, call.rank
        plan, logs = scoring.plan, scoring.logs
        assert logs is not None
        frames: list[bytes] = [b""] * w
        own: tuple[list[Column], dict[str, Any]] | None = None
        signature = 0
        error = result.error if isinstance(result, Error) else None
        if isinstance(result, Value) and scoring.scores:
            try:
                n = sum(plan.share.values())
                keys, cols = result_columns(result.value, n, call.spec.name)
                signature = result_signature(keys, cols)
                logs.check(n)
                logs.check_metrics()
                pos = 0
                for s in range(w):  # every rank gets a frame, empty or not: it rebuilds its result's shape from it
                    count = plan.share.get(s, 0)
                    rows = slice(pos, pos + count)
                    part = take_columns(cols, rows)
                    meta = {"keys": keys, "logs": logs.rows(rows), "scored": n}
                    if s == me:
                        own = (part, meta)
                    else:
                        allow_pickle = call.spec.options.allow_pickle
                        frames[s] = bytes(encode_frame(part, count, allow_pickle=allow_pickle, meta=meta))
                    pos += count
            except BaseException as e:
                error = e
        done = status_round(
            session, error, OUTBOUND, call.timeout, call.spec.name, extra=[signature, *(len(f) for f in frames)]
        )
        if isinstance(done, Error):
            return done
        sizes = done.value
        signatures = {int(x) for x in sizes[:, 0] if int(x)}
        if len(signatures) > 1:
            scorers = [r for r in range(w) if int(sizes[r, 0])]
            return Error(
                InputError(
                    f"synced function {call.spec.name!r} returned results of different shapes on the scoring ranks "
                    f"{scorers} (dict keys, containers or dtypes differ), so they cannot be put together. HINT: return "
                    "the same container with the same keys and dtype for every group, e.g. always a list of floats."
                )
            )
        send_counts = [0 if d == me else len(frames[d]) for d in range(w)]
        recv_counts = [0 if s == me else int(sizes[s, 1 + me]) for s in range(w)]
        buf = all_to_all(session, b"".join(frames), send_counts, recv_counts, OUTBOUND, call.timeout)
        try:
            parts: dict[int, tuple[list[Column], dict[str, Any]]] = {}
            for s, frame in enumerate(split(buf, recv_counts)):
                if s == me:
                    if own is not None:
                        parts[s] = own
                elif len(frame):
                    nrows, cols, meta = decode_frame(frame.data, allow_pickle=call.spec.options.allow_pickle)
                    if nrows != len(plan.sent[s]):
                        raise CodecError(f"rank {s} returned {nrows} results for {len(plan.sent[s])} samples")
                    parts[s] = (cols, meta or {})
            return Value(self._assemble(call, plan, logs, parts))
        except BaseException as e:  # everything was exchanged: a local failure, the session stays usable
            return Error(e)

    def _assemble(
        self, call: Call, plan: _Shard, logs: Logs, parts: dict[int, tuple[list[Column], dict[str, Any]]]
    ) -> Any:
        """Put the results from every scoring rank back into this rank's local sample order, matching dict keys."""
        n = sum(len(rows) for rows in plan.sent)
        logs.replay_scattered(
            n, [(plan.sent[d], parts[d][1].get("logs", ()), int(parts[d][1].get("scored", 0))) for d in sorted(parts)]
        )
        scorers = sorted(parts)
        if not scorers:
            return []
        order = np.argsort(
            np.asarray([i for d in scorers for i in plan.sent[d]], dtype=np.int64), kind="stable"
        ).tolist()
        keys = parts[scorers[0]][1].get("keys")
        by_key = [dict(zip(_keys(parts[d][1].get("keys")), parts[d][0], strict=True)) for d in scorers]
        columns = []
        for j, key in enumerate(_keys(keys)):
            first = by_key[0][key]
            pieces = [p[key].values for p in by_key]
            container = first.container
            if container in (C_LIST, C_TUPLE):
                pieces = [list(p) for p in pieces]
            merged = concat(first.name, pieces, container, None)
            columns.append(Column(str(j), container, take(merged, container, order)))
        return rebuild_result(keys, columns, call.device())


def _keys(keys: list[Any] | None) -> list[Any]:
    return [None] if keys is None else list(keys)
