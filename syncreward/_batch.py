"""Column plumbing: merge per-rank frames, cut and encode slices, and check, split and rebuild results.

Every mode goes through here for the data itself -- the frames that carry columns and results, and
the rows each rank owns -- so no mode file knows the codec: :func:`merge_frames` decodes the frames of
several ranks and concatenates every column in rank order, :func:`split_result` checks a function's
result and cuts it into the slices of the ranks that own the rows (:class:`Split`), and
:func:`read_frame` reads one back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from ._codec import (
    C_LIST,
    C_NDARRAY,
    C_TENSOR,
    C_TUPLE,
    CPU,
    Column,
    container_of,
    decode_frame,
    encode_frame,
    is_plain,
)
from ._errors import CodecError, InputError, ResultLengthError
from ._outcome import Error, Value

__all__ = [
    "CPU",  # where decoded tensors are made (``_codec``), and the caller's device where nothing names another
    "Split",
    "concat",
    "encodable",
    "encode_rows",
    "merge_frames",
    "place",
    "read_frame",
    "rebuild_result",
    "reassemble",
    "result_columns",
    "result_signature",
    "split_result",
    "take",
    "take_columns",
]


def _as_container(values: Any, container: int) -> Any:
    """Decoded values arrive as lists for list-like columns; give them back their container."""
    if container == C_TUPLE and not isinstance(values, tuple):
        return tuple(values)
    if container == C_NDARRAY and not isinstance(values, np.ndarray):  # an object array sent per element
        # fromiter stores each value as it is; arr[:] = values would unpack values that are sequences
        return np.fromiter(values, dtype=object, count=len(values))
    return values


def place(values: Any, container: int, device: torch.device) -> Any:
    """The one rule for where a tensor syncreward hands a rank lives: on ``device``, the caller's.

    Every part that is put together (:func:`concat`: inputs gathered from several ranks, result slices
    from several scoring ranks) and every result decoded for a rank (:func:`rebuild_result`) goes
    through here, so a part decoded on the CPU never meets a part left on a GPU. Other containers
    (lists, tuples, numpy arrays) have no device and are returned as they are; so are tensors nested
    inside list elements.
    """
    if container == C_TENSOR and values.device != device:
        return values.to(device)
    return values


def concat(name: str, parts: Sequence[Any], container: int, device: torch.device) -> Any:
    """Concatenate the per-rank parts of one column, in rank order; tensor parts on ``device`` (:func:`place`).

    Raises:
        InputError: parts whose dtypes or trailing shapes disagree between ranks.
    """
    if container in (C_LIST, C_TUPLE):
        out: list[Any] = []
        for p in parts:
            out.extend(p)
        return tuple(out) if container == C_TUPLE else out
    nonempty = [p for p in parts if len(p)] or list(parts[:1])
    if container == C_NDARRAY:
        arrays = [_as_container(p, C_NDARRAY) for p in nonempty]
        # a str/bytes array is as wide as its longest entry, which differs between ranks: only the kind must agree.
        # Byte order does not matter either: np.concatenate returns native order whenever it joins two parts.
        _check_same(
            name,
            [(a.dtype.kind if a.dtype.kind in "US" else str(a.dtype.newbyteorder("=")), a.shape[1:]) for a in arrays],
        )
        return np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
    tensors = [place(p, C_TENSOR, device) for p in nonempty]
    _check_same(name, [(str(t.dtype), tuple(t.shape[1:])) for t in tensors])
    return torch.cat(tensors) if len(tensors) > 1 else tensors[0]


def _check_same(name: str, specs: list[tuple[str, tuple[int, ...]]]) -> None:
    if len(set(specs)) > 1:
        listing = ", ".join(f"dtype {d} shape (n, {', '.join(map(str, s))})" for d, s in specs)
        raise InputError(
            f"column {name!r} has different dtypes or per-sample shapes on different ranks ({listing}); "
            "they cannot be concatenated into one batch. HINT: pad to a common shape or pass a list of "
            "per-sample arrays instead."
        )


def take(values: Any, container: int, idx: slice | Sequence[int]) -> Any:
    """Select rows of a column by a slice or a list of row indices, keeping its container.

    A list column passed as another sequence (a ``deque``, ``range``, ``array.array``, ...) gives a list.
    """
    if container in (C_LIST, C_TUPLE) and not isinstance(values, (list, tuple)):
        values = list(values)
    if isinstance(idx, slice):
        return values[idx]
    if container in (C_NDARRAY, C_TENSOR):
        if container == C_NDARRAY:
            return values[list(idx)]
        return values[torch.as_tensor(list(idx), dtype=torch.long, device=values.device)]
    picked = [values[i] for i in idx]
    return tuple(picked) if container == C_TUPLE else picked


def take_columns(columns: Sequence[Column], idx: slice | Sequence[int]) -> list[Column]:
    """The same rows (:func:`take`) of every column."""
    return [Column(c.name, c.container, take(c.values, c.container, idx)) for c in columns]


def result_columns(result: Any, n: int, function: str) -> tuple[list[Any] | None, list[Column]]:
    """Check a function's result and split it into columns.

    Returns ``(keys, columns)``: ``keys`` is ``None`` for a single column (list, tuple, array or tensor)
    and the dict's keys for a dict of per-sample columns.

    Raises:
        ResultLengthError: the result does not have exactly ``n`` entries (or a dict value does not).
        InputError: the result is not a supported container.
    """
    if isinstance(result, dict):
        keys = list(result)
        cols = [_result_column(str(i), result[k], n, function, f"[{k!r}]") for i, k in enumerate(keys)]
        return keys, cols
    return None, [_result_column("", result, n, function, "")]


def check_result(result: Any, n: int | None, function: str) -> Any:
    """A single process's result, checked as :func:`result_columns` checks one on several ranks.

    ``n``: the call's batch size (``None``: the call had no per-sample argument, so only the type is checked).

    Raises:
        ResultLengthError: as :func:`result_columns`.
        InputError: as :func:`result_columns`.
    """
    kind = type(result)
    if kind is list and len(result) == n:  # the common cases, at the cost of a comparison per column
        return result
    if kind is dict:
        for value in result.values():
            if type(value) is not list or len(value) != n:
                break
        else:
            return result
    if n is None:
        for value in result.values() if isinstance(result, dict) else (result,):
            if container_of(value) is None:
                _result_column("", value, 0, function, "")  # raises the InputError
        return result
    result_columns(result, n, function)
    return result


def _result_column(name: str, value: Any, n: int, function: str, where: str) -> Column:
    container = container_of(value)
    if container is None:
        raise InputError(
            f"synced function {function!r} returned {type(value).__name__}{where}; expected one result per sample "
            "as a list, tuple, numpy array, tensor, or a dict of those. HINT: return a list with one reward per "
            "sample (None where a reward does not apply)."
        )
    if len(value) != n:
        raise ResultLengthError(
            f"synced function {function!r} returned {len(value)} results{where} for {n} samples; it must return "
            "exactly one result per sample of the batch it was given. HINT: score every sample it is passed (on "
            "several ranks that is the global batch), with None where a reward does not apply."
        )
    return Column(name, container, value)


def result_signature(keys: list[Any] | None, columns: Sequence[Column]) -> int:
    """A nonzero 63-bit hash of a result's shape: dict keys (in any order), containers, dtypes, trailing shapes.

    Ranks that score parts of one batch must return results of the same signature to be put together.
    """
    described = []
    for key, c in zip([None] if keys is None else keys, columns, strict=True):
        if c.container == C_NDARRAY:
            dt = c.values.dtype
            kind = dt.kind if dt.kind in "US" else dt.newbyteorder("=").str
            what = f"ndarray:{kind}:{tuple(c.values.shape[1:])}"
        elif c.container == C_TENSOR:
            what = f"tensor:{c.values.dtype}:{tuple(c.values.shape[1:])}"
        else:
            what = "list" if c.container == C_LIST else "tuple"
        described.append((repr(key), what))
    text = repr(sorted(described)) if keys is not None else repr(described)
    digest = hashlib.blake2b(text.encode("utf-8", "backslashreplace"), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1 | 1


def rebuild_result(keys: list[Any] | None, columns: Sequence[Column], device: torch.device | None) -> Any:
    """Turn result columns back into what the function returned: tensors on ``device`` (:func:`place`).

    ``device`` is ``None`` only for the slice a rank scored for itself alone, which it keeps as the
    function returned it (``main``'s rank 0, ``replicate``).
    """
    values = []
    for c in columns:
        v = _as_container(c.values, c.container)
        values.append(v if device is None else place(v, c.container, device))
    if keys is None:
        return values[0]
    return dict(zip(keys, values, strict=True))


# ------------------------------------------------------------------------------------------------ frames


def encode_rows(
    columns: Sequence[Column],
    rows: slice | Sequence[int],
    n: int,
    allow_pickle: bool,
    meta: Any = None,
    *,
    function: str | None = None,
    results: Sequence[Any] | None = None,
) -> bytes | bytearray:
    """The frame of the given ``rows`` (``n`` of them) of every column, with ``meta`` beside them.

    ``results``: the columns are ``function``'s result (its dict's keys; empty: a single result), see
    :func:`~syncreward._codec.encode_frame`.
    """
    return encode_frame(
        take_columns(columns, rows), n, allow_pickle=allow_pickle, meta=meta, function=function, results=results
    )


def read_frame(frame: Any, allow_pickle: bool) -> tuple[int, list[Column], dict[str, Any]]:
    """A received frame: its row count, its columns and its ``meta`` (``{}`` when it has none)."""
    nrows, cols, meta = decode_frame(frame, allow_pickle=allow_pickle)
    return nrows, cols, meta or {}


def encodable(
    columns: Sequence[Column], n: int, droppable: frozenset[str], allow_pickle: bool, function: str
) -> tuple[str, ...]:
    """What encoding ``columns`` would leave behind, without encoding them (they stay on this rank).

    Raises what encoding raises for a column it refuses (the codec's ``UnsupportedTypeError``): a
    column this rank scores as passed refuses the data the other ranks' columns refuse.
    """
    dropped = []
    for col in columns:
        if allow_pickle or is_plain(col.values, col.container):
            continue
        if col.name in droppable:
            dropped.append(col.name)
        else:
            encode_frame([col], n, function=function)  # raises the codec's UnsupportedTypeError for this column
    return tuple(dropped)


def merge_frames(
    columns: Sequence[Column],
    frames: Mapping[int, Any],
    rows: Mapping[int, int],
    me: int,
    local: Callable[[Any, int], Any],
    skip: frozenset[str],
    allow_pickle: bool,
) -> dict[str, Any]:
    """Decode the given ranks' ``frames`` and concatenate every one of ``columns`` in rank order.

    ``rows[s]`` is the number of samples expected from rank ``s`` (in rank order); this rank's (``me``)
    own part of a column is ``local(values, container)`` (its column as passed, or the rows of it that
    stay here). Columns in ``skip`` (some rank left them behind) are skipped. A tensor column is put
    together on the device of this rank's own column (:func:`place`): where the caller keeps it.

    Raises:
        CodecError: a frame that does not hold what its rank announced.
        InputError: parts that cannot be concatenated (:func:`concat`).
    """
    decoded: dict[int, dict[str, Any]] = {}
    for s in rows:
        if s == me:
            continue
        nrows, cols, _ = decode_frame(frames[s], allow_pickle=allow_pickle, skip=skip)
        if nrows != rows[s]:
            raise CodecError(f"rank {s} sent {nrows} rows but announced {rows[s]}")
        decoded[s] = {c.name: c.values for c in cols}
    values: dict[str, Any] = {}
    for col in columns:
        if col.name in skip:
            continue
        parts = []
        for s in rows:
            if s == me:
                parts.append(local(col.values, col.container))
            elif col.name in decoded[s]:
                parts.append(decoded[s][col.name])
            else:
                raise CodecError(f"rank {s} did not send column {col.name!r}")
        device = col.values.device if col.container == C_TENSOR else CPU
        values[col.name] = concat(col.name, parts, col.container, device)
    return values


# ----------------------------------------------------------------------------------------------- results


class RowLogs(Protocol):
    """The log calls of a scored call, as :func:`split_result` cuts them (``_logs.Logs``)."""

    def check(self, n: int) -> None: ...

    def check_metrics(self) -> None: ...

    def rows(self, rows: slice) -> list[Any]: ...


@dataclass(eq=False)  # never changed after it is made (not frozen: made on every call)
class Split:
    """A function's result, checked and cut into the slices of the ranks that own its rows (:func:`split_result`)."""

    keys: list[Any] | None  # the dict's keys (``None``: a single column)
    columns: list[Column]
    logs: list[list[Any]]  # per rank, the log records of its rows (none without logs)
    frames: dict[int, bytes | bytearray]  # the slices encoded for other ranks, by rank
    here: list[Column] | None  # this rank's own slice, as columns (where it was asked for)
    result: Any  # this rank's own slice as the function would have returned it
    signature: int  # the result's shape (:func:`result_signature`), where ``scored`` was given; else 0


def split_result(
    result: Any,
    bounds: Sequence[int],
    function: str,
    *,
    logs: RowLogs | None = None,
    metrics: bool = False,
    here: int | None = None,
    send: Sequence[int] = (),
    allow_pickle: bool = False,
    scored: int | None = None,
) -> Value[Split] | Error:
    """Check ``result`` (one entry per row of ``bounds``) and its log records, and cut both per owning rank.

    ``bounds[r]:bounds[r + 1]`` are the rows rank ``r`` owns. With ``metrics``, every ``log_metric``
    value must be a number too (``Logs.check_metrics``). Rank ``here``'s slice stays as columns and as a
    result; the slices of the ranks in ``send`` are encoded, each with the result's keys and its log
    records (and ``scored``, where given; without it, a single column without log records travels
    bare; with it, several ranks score parts of one batch, and the result's signature is computed too).
    Anything this raises -- a ``KeyboardInterrupt`` included -- is returned as the ``Error``: it
    is this rank's failure, which travels.
    """
    try:
        ranks = range(len(bounds) - 1)
        n = bounds[-1]
        keys, cols = result_columns(result, n, function)
        per_rank: list[list[Any]] = [[] for _ in ranks]
        if logs is not None:
            logs.check(n)
            if metrics:
                logs.check_metrics()
            per_rank = [logs.rows(slice(bounds[r], bounds[r + 1])) for r in ranks]
        frames: dict[int, bytes | bytearray] = {}
        result_keys = keys if keys is not None else ()  # (messages name the result's parts by these)
        for r in send:
            meta: dict[str, Any] | None
            if scored is not None:
                meta = {"keys": keys, "logs": per_rank[r], "scored": scored}
            else:
                meta = {"keys": keys, "logs": per_rank[r]} if keys is not None or per_rank[r] else None
            rows = slice(bounds[r], bounds[r + 1])
            frames[r] = encode_rows(
                cols, rows, bounds[r + 1] - bounds[r], allow_pickle, meta, function=function, results=result_keys
            )
        part = take_columns(cols, slice(bounds[here], bounds[here + 1])) if here is not None else None
        mine = rebuild_result(keys, part, None) if part is not None else None
        signature = result_signature(keys, cols) if scored is not None else 0
        return Value(Split(keys, cols, per_rank, frames, part, mine, signature))
    except BaseException as e:
        return Error(e)


def reassemble(
    parts: Sequence[tuple[list[Column], list[Any] | None]], order: Sequence[int], device: torch.device
) -> Any:
    """Put the result slices of several scoring ranks together, dict keys matched by key, rows in ``order``.

    Tensor slices are put together on ``device``, the caller's (:func:`place`), whichever rank scored them.

    ``parts`` are ``(columns, keys)`` per scoring rank, in rank order; the first one's keys give the
    result's order of keys. Returns what the function would have returned for the concatenated rows.
    """
    if not parts:
        return []
    keys = parts[0][1]
    by_key = [dict(zip(_keys(k), cols, strict=True)) for cols, k in parts]
    columns = []
    for j, key in enumerate(_keys(keys)):
        first = by_key[0][key]
        pieces = [p[key].values for p in by_key]
        container = first.container
        if container in (C_LIST, C_TUPLE):
            pieces = [list(p) for p in pieces]
        merged = concat(first.name, pieces, container, device)
        columns.append(Column(str(j), container, take(merged, container, order)))
    return rebuild_result(keys, columns, device)


def _keys(keys: list[Any] | None) -> list[Any]:
    return [None] if keys is None else list(keys)
