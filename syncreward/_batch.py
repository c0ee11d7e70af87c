"""Column plumbing: concatenate per-rank parts, cut slices, and check and rebuild results."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ._codec import C_LIST, C_NDARRAY, C_TENSOR, C_TUPLE, Column, container_of
from ._errors import InputError, ResultLengthError

__all__ = ["concat", "rebuild_result", "result_columns", "result_signature", "take", "take_columns"]


def _as_container(values: Any, container: int) -> Any:
    """Decoded values arrive as lists for list-like columns; give them back their container."""
    if container == C_TUPLE and not isinstance(values, tuple):
        return tuple(values)
    if container == C_NDARRAY and not isinstance(values, np.ndarray):  # an object array sent per element
        # fromiter stores each value as it is; arr[:] = values would unpack values that are sequences
        return np.fromiter(values, dtype=object, count=len(values))
    return values


def concat(name: str, parts: Sequence[Any], container: int, device: torch.device | None = None) -> Any:
    """Concatenate the per-rank parts of one column, in rank order.

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
    tensors = [p if device is None else p.to(device) for p in nonempty]
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
    """Turn received result columns back into what the function returned, on the caller's device."""
    values = []
    for c in columns:
        v = _as_container(c.values, c.container)
        if c.container == C_TENSOR and device is not None and v.device != device:
            v = v.to(device)
        values.append(v)
    if keys is None:
        return values[0]
    return dict(zip(keys, values, strict=True))
