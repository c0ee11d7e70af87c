"""``mode="shard"``: whole groups spread over the ranks, each rank scores its share.

For expensive rewards that only compare samples *within* a group (a judge that ranks the K completions
of one prompt). Groups are consecutive runs of ``group_size`` global samples (TRL's ``num_generations``)
or the samples sharing a value of the ``group_by`` column, compared by content: each rank sends every
rank a 16-byte digest of each sample's value (:func:`group_keys`), so a TRL conversational prompt (a list
of message dicts) is a group key like a str. Groups go to ranks in contiguous blocks of
about equal sample counts, so a group split across ranks by the sampler is scored whole, and the
results are routed back to the ranks that own the samples. An empty global batch is rank 0's to score, on
the empty batch, so every rank gets back the container the function returns for it (as in one process).

Several ranks score, so their results must agree in shape before they are put together: every scoring
rank announces a signature of its result (dict keys, containers, dtypes) in the outbound exchange, and
if two differ every rank raises. Dict results are matched by key, never by position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._batch import Split, encode_rows, read_frame, reassemble, split_result, take
from .._call import Call, Payload
from .._errors import CodecError, InputError
from .._exchange import INBOUND, OUTBOUND, Inbound
from .._keys import KEY_BYTES, group_keys
from .._logs import Logs
from .._outcome import Error, Outcome, Value
from .._transfers import device, encode, exchange, inputs, link, merge
from ._base import Mode, ModeOption, Scoring, local

__all__ = ["KEY_BYTES", "ShardMode", "assign_by_key", "assign_by_size", "group_keys"]

EMPTY_BATCH_SCORER = 0  # the rank that scores an empty global batch (no rank has a group to score)


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
        # the rows this rank scores, as (source rank, count) in rank order; empty: this rank scores nothing
        # (``{rank: 0}``: it scores an empty global batch, :meth:`ShardMode._plan`)
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


@dataclass(eq=False)
class ShardScoring(Scoring):
    """Shard mode's scoring: the call's routing, which its outbound exchange follows back."""

    inbound: Inbound
    plan: _Shard


def _positive_int(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"group_size must be a positive int, not {value!r}"
    return None


def _column_name(value: Any) -> str | None:
    return None if isinstance(value, str) else f"group_by must name a per-sample column (a str), not {value!r}"


class ShardMode(Mode[ShardScoring]):
    name = "shard"
    options = (
        ModeOption("group_size", "int | None", None, _positive_int),
        ModeOption("group_by", "str | None", None, _column_name, column=True),
    )

    def check(self, values: Mapping[str, Any]) -> None:
        if (values["group_size"] is None) == (values["group_by"] is None):
            raise ValueError("mode='shard' needs exactly one of group_size=K or group_by='<column>'")

    def prepare(self, call: Call) -> Payload:
        assert call.bound is not None
        by = self.option(call.spec.options, "group_by")
        if by is not None and by not in call.names:
            raise InputError(f"group_by={by!r} is not a per-sample argument of this call (columns: {call.names})")
        # Drop decisions and encodability are checked on the full local frame; the frames actually sent are
        # cut per destination once the assignment is known.
        dropped = encode(call).dropped
        if by is None:
            return Payload(b"", dropped)
        col = next(c for c in call.bound.columns if c.name == by)
        return Payload(group_keys(col.values, col.container, by), dropped)  # only the keys travel before the plan

    # ------------------------------------------------------------------------------------------ inbound

    def route_inputs(self, call: Call, payload: Outcome[Payload]) -> Value[ShardScoring] | Error:
        w, me = call.world_size, call.rank
        key_frame = bytes(payload.value.frame) if isinstance(payload, Value) else b""
        got = exchange(call, payload, None, mode_word=len(key_frame))  # the mode word: the key frame's size
        if isinstance(got, Error):
            return got
        inbound = got.value
        planned = local(self._plan, call, inbound, key_frame)
        plan = planned.value if isinstance(planned, Value) else _Shard([], {}, w)
        frames = self._frames(call, inbound, plan) if isinstance(planned, Value) else [b""] * w
        sent = link(call, INBOUND).sized_exchange(planned.error if isinstance(planned, Error) else None, frames)
        if isinstance(sent, Error):
            return sent
        logs = Logs(call.bound, call.spec.name)
        if not plan.share:
            return Value(ShardScoring(None, logs, inbound, plan))
        parts = dict(enumerate(sent.value.parts))
        values = local(merge, call, inbound, parts, plan.share, lambda v, c: take(v, c, plan.sent[me]))
        if isinstance(values, Error):  # this rank's inputs failed: its scoring's outcome, sent in its results turn
            return Value(ShardScoring(values, logs, inbound, plan))
        return Value(ShardScoring(inputs(call, inbound, values.value, logs.recording), logs, inbound, plan))

    def _plan(self, call: Call, inbound: Inbound, key_frame: bytes) -> _Shard:
        """Which rank scores each sample (from the group size, or every rank's group keys).

        An empty global batch is scored by :data:`EMPTY_BATCH_SCORER` alone, on the empty batch.
        """
        w, me = call.world_size, call.rank
        group_size = self.option(call.spec.options, "group_size")
        if group_size is not None:
            if call.bound is not None and inbound.counts[me] != call.bound.n:  # (group_by: the key frames check)
                raise CodecError(f"this rank's header announced {inbound.counts[me]} samples for its {call.bound.n}")
            plan = _Shard.of_size(group_size, inbound.offsets, me, w)
        else:
            assert inbound.headers is not None  # (shard's inbound is an all_to_all: every rank has every header)
            dest = self._assign_by_key(call, key_frame, inbound.headers.mode_words, inbound.counts)
            plan = _Shard.of_dest(dest, inbound.offsets, me, w)
        if not inbound.total and me == EMPTY_BATCH_SCORER:
            # An empty global batch has no group to give anyone: rank 0 scores it, as one process would, so the
            # function sees the empty batch once and every rank gets back the container it returns ({"acc": []},
            # a (0, k) tensor), not a bare list. Every rank knows the batch is empty from the headers.
            plan.share = {me: 0}
        return plan

    def _assign_by_key(self, call: Call, key_frame: bytes, sizes: list[int], counts: list[int]) -> list[int]:
        keys: list[bytes] = []
        for s, blob in enumerate(link(call, INBOUND).broadcast_blobs(key_frame, sizes)):
            if len(blob) != KEY_BYTES * counts[s]:
                raise CodecError(f"rank {s} sent {len(blob)} bytes of group keys for {counts[s]} samples")
            keys.extend(blob[i : i + KEY_BYTES] for i in range(0, len(blob), KEY_BYTES))
        return assign_by_key(keys, call.world_size, str(self.option(call.spec.options, "group_by")))

    def _frames(self, call: Call, inbound: Inbound, plan: _Shard) -> list[bytes | bytearray]:
        assert call.bound is not None
        cols = [c for c in call.bound.columns if c.name not in inbound.dropped]
        allow_pickle = call.spec.options.allow_pickle
        return [
            encode_rows(cols, idx, len(idx), allow_pickle) if d != call.rank and idx else b""
            for d, idx in enumerate(plan.sent)
        ]

    # ------------------------------------------------------------------------------------------ outbound

    def route_results(self, call: Call, scoring: ShardScoring, result: Outcome[Any]) -> Outcome[Any]:
        w, me = call.world_size, call.rank
        plan, logs = scoring.plan, scoring.logs
        assert logs is not None
        n = sum(plan.share.values())
        split: Value[Split] | Error | None = None  # None: this rank scored nothing
        if isinstance(result, Error):
            split = result
        elif scoring.scores:
            bounds = [0]
            for s in range(w):  # every rank gets a frame, empty or not: it rebuilds its result's shape from it
                bounds.append(bounds[-1] + plan.share.get(s, 0))
            split = split_result(
                result.value,
                bounds,
                call.spec.name,
                logs=logs,
                metrics=True,
                here=me,
                send=[s for s in range(w) if s != me],
                allow_pickle=call.spec.options.allow_pickle,
                scored=n,
            )
        cut = split.value if isinstance(split, Value) else None  # this rank's results, cut per owner
        frames = [cut.frames.get(s, b"") if cut is not None else b"" for s in range(w)]
        sent = link(call, OUTBOUND).sized_exchange(
            split.error if isinstance(split, Error) else None,
            frames,
            extra=[cut.signature if cut is not None else 0],
        )
        if isinstance(sent, Error):
            return sent
        signatures = sent.value.extra[:, 0].tolist()
        if len({int(x) for x in signatures if int(x)}) > 1:
            scorers = [r for r in range(w) if int(signatures[r])]
            return Error(
                InputError(
                    f"synced function {call.spec.name!r} returned results of different shapes on the scoring ranks "
                    f"{scorers} (dict keys, containers or dtypes differ), so they cannot be put together. HINT: return "
                    "the same container with the same keys and dtype for every group, e.g. always a list of floats."
                )
            )
        return local(self._collect, call, plan, logs, cut, n, sent.value.parts)  # after the last transfer

    def _collect(self, call: Call, plan: _Shard, logs: Logs, cut: Split | None, n: int, frames: Sequence[Any]) -> Any:
        """This rank's results: its own cut and every other scoring rank's frame, put back in its sample order."""
        me = call.rank
        parts: dict[int, tuple[list[Any], dict[str, Any]]] = {}
        for s, frame in enumerate(frames):
            if s == me:
                if cut is not None and cut.here is not None:
                    parts[s] = (cut.here, {"keys": cut.keys, "logs": cut.logs[me], "scored": n})
            elif len(frame):
                nrows, cols, meta = read_frame(frame.data, call.spec.options.allow_pickle)
                if nrows != len(plan.sent[s]):
                    raise CodecError(f"rank {s} returned {nrows} results for {len(plan.sent[s])} samples")
                parts[s] = (cols, meta)
        return self._assemble(call, plan, logs, parts)

    def _assemble(
        self, call: Call, plan: _Shard, logs: Logs, parts: dict[int, tuple[list[Any], dict[str, Any]]]
    ) -> Any:
        """Put the results from every scoring rank back into this rank's local sample order, matching dict keys."""
        n = sum(len(rows) for rows in plan.sent)
        logs.replay_scattered(
            n, [(plan.sent[d], parts[d][1].get("logs", ()), int(parts[d][1].get("scored", 0))) for d in sorted(parts)]
        )
        scorers = sorted(parts)
        order = np.argsort(
            np.asarray([i for d in scorers for i in plan.sent[d]], dtype=np.int64), kind="stable"
        ).tolist()
        return reassemble([(parts[d][0], parts[d][1].get("keys")) for d in scorers], order, device(call))
