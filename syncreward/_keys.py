"""Group keys: the content digest of a sample's value, alike in every process for equal values.

``mode="shard"`` with ``group_by=`` sends every rank a :data:`KEY_BYTES`-byte digest of each sample's
value (:func:`group_keys`) instead of the value, so a TRL conversational prompt (a list of message
dicts) is a group key like a str.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any

import numpy as np
import torch

from ._codec import C_NDARRAY, C_TENSOR, MAX_DEPTH
from ._errors import InputError

__all__ = ["KEY_BYTES", "group_keys"]

KEY_BYTES = 16  # a group key on the wire: the blake2b digest of a sample's group_by value


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
