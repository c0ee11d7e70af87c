"""Canonical bytes: equal plain values write the same bytes in every process, under a named equality rule.

Three things are compared between ranks by content, and each needs its own notion of "equal":

* a call's **shared arguments** (``_shared.SharedValues``): one rank's value scores every rank's samples, so
  two values are equal only when the function cannot tell them apart -- :data:`EXACT`;
* **group keys** (``mode="shard", group_by=``: ``_keys.group_keys``): samples group as Python's ``==`` and
  ``hash()`` would group them in one process -- :data:`EQUAL`;
* a **reward's configuration** (``_identity``): two copies of a reward are the same reward when their
  configurations are alike under :data:`EXACT` (objects without canonical bytes count by their type's
  name: ``_identity`` hands them in as :class:`Opaque`).

One encoder, :func:`encode`, writes all three; the rule is its parameter. Under both rules:

* ``None``, ``str``, ``bytes``, ``int``, ``float`` and lists, tuples and dicts of them are plain;
* a list differs from a tuple (the function sees which), and a dict's insertion order is not part of it
  (str keys are taken in sorted order, other keys in the order of their canonical bytes);
* nothing depends on ``hash()`` (salted per process for str and bytes) or on ``repr()`` of an object.

The rules differ only in what they say about numbers and about arrays:

=====================================  ==========================================  =============================
                                       :data:`EXACT`                               :data:`EQUAL`
=====================================  ==========================================  =============================
``1``, ``1.0``, ``True``               three values                                one value
``-0.0`` and ``0.0``                   two values                                  one value
``np.float32(1)`` and ``1.0``          two values (a numpy scalar has its dtype)   one value
``float("nan")``                       one value (its bits)                        one value
``complex(1, 0)`` and ``1``            two values                                  one value
subclasses (an ``str`` subclass)       not plain (their own ``__eq__``)            as their base type
arrays and tensors                     not plain (not hashed per call)             their ``tolist()``
=====================================  ==========================================  =============================

A value that is not plain raises :class:`NotPlain` (a ``TypeError`` naming its type). A :class:`Budget`
bounds the work (elements, bytes, depth): past it, :class:`NotPlain` too.
"""

from __future__ import annotations

import array
import enum
import math
import struct
import sys
from typing import Any

import numpy as np

__all__ = ["EQUAL", "EXACT", "MAX_DEPTH", "Budget", "NotPlain", "Opaque", "Rule", "encode", "to_bytes"]


class Rule(enum.Enum):
    """When two plain values are the same value (the table in this module's docstring)."""

    EXACT = "exact"  # type and bits: what the function could tell apart differs
    EQUAL = "equal"  # as ``==``: numbers that compare equal are one value


EXACT = Rule.EXACT
EQUAL = Rule.EQUAL


class NotPlain(TypeError):
    """The value has no canonical bytes under the rule (or is past the :class:`Budget`)."""


class Opaque:
    """A stand-in for a value known only by its name (``_identity``: an object's type, an enum member)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Opaque({self.name!r})"


class Budget:
    """How much one :func:`encode` may write: ``items`` elements, ``size`` bytes, ``depth`` levels."""

    __slots__ = ("depth", "end", "items")

    def __init__(self, items: int, size: int, depth: int) -> None:
        self.items = items
        self.end = size  # made absolute (an offset into ``out``) by :func:`encode`
        self.depth = depth


MAX_DEPTH = 100  # levels of nesting written out at most (a self-referencing value ends here)
_LEN = struct.Struct("<Q")
_pack = _LEN.pack
_F64 = struct.Struct("<d")
_C128 = struct.Struct("<dd")
_FLAT = frozenset({type(None), bool, int, float, str, bytes})  # exact types whose repr is their exact value
_FLOATS = frozenset({float})
_STR = frozenset({str})
_REPR_SCALARS = _FLAT - {int}  # an int may be past repr()'s digit limit: it goes by its bytes
_UNBOUNDED = 1 << 62


def to_bytes(value: Any, rule: Rule, budget: Budget | None = None) -> bytes:
    """The canonical bytes of ``value`` under ``rule``.

    Raises:
        NotPlain: the value is not plain under ``rule``, or is larger than ``budget``.
    """
    out = bytearray()
    encode(value, out, rule, budget)
    return bytes(out)


def encode(value: Any, out: bytearray, rule: Rule, budget: Budget | None = None) -> None:
    """Append the canonical bytes of ``value`` under ``rule`` to ``out`` (``out`` is left as it was on failure).

    Raises:
        NotPlain: the value is not plain under ``rule``, or is larger than ``budget``.
    """
    start = len(out)
    if rule is EXACT and type(value) in _REPR_SCALARS:  # the common shape (a threshold, a name): its exact repr
        raw = repr(value).encode("utf-8", "surrogatepass")
        if budget is not None and len(raw) > budget.end:
            raise NotPlain(f"its canonical bytes are longer than {budget.end}")
        out += b"r" + _LEN.pack(len(raw)) + raw
        return
    if budget is None:
        left = [_UNBOUNDED, _UNBOUNDED]
        depth = MAX_DEPTH
    else:
        left = [budget.items, start + budget.end]
        depth = budget.depth
    try:
        if rule is EXACT:
            _exact(value, out, left, depth)
        else:
            _equal(value, out, depth)
        if len(out) > left[1]:
            raise NotPlain(f"its canonical bytes are longer than {left[1] - start}")
    except NotPlain:
        del out[start:]
        raise
    except (ValueError, RecursionError) as e:  # an int past str()'s digit limit; a self-referencing value
        del out[start:]
        raise NotPlain(f"it cannot be written out ({type(e).__name__})") from None


def _name(v: Any) -> str:
    return f"{type(v).__module__}.{type(v).__qualname__}"


def _int(v: int, out: bytearray) -> None:
    raw = v.to_bytes(v.bit_length() // 8 + 1, "little", signed=True)
    out += b"i" + _LEN.pack(len(raw)) + raw


def _str(v: str, out: bytearray) -> None:
    raw = str.encode(v, "utf-8", "surrogatepass")
    out += b"s" + _LEN.pack(len(raw)) + raw


# ------------------------------------------------------------------------------------------------ EXACT


def _exact(v: Any, out: bytearray, left: list[int], depth: int) -> None:
    """``left``: [elements left, where ``out`` must end at most]. Exact built-in types only."""
    left[0] -= 1
    if left[0] < 0 or depth < 0 or len(out) > left[1]:
        raise NotPlain("it is larger or deeper than what is checked")
    t = type(v)
    if v is None:
        out += b"N"
    elif t is bool:
        out += b"T" if v else b"F"
    elif t is int:
        _int(v, out)
    elif t is float:
        out += b"f" + _F64.pack(v)
    elif t is str:
        _str(v, out)
    elif t is bytes:
        out += b"b" + _LEN.pack(len(v)) + v
    elif t is complex:
        out += b"c" + _C128.pack(v.real, v.imag)
    elif t is list or t is tuple:
        left[0] -= len(v)
        if left[0] < 0:
            raise NotPlain(f"it has more than {len(v) + left[0]} elements")
        types = set(map(type, v))
        raw = _flat_bytes(v, types) if types <= _FLAT else None  # the common shapes (weights, labels): one pass in C
        if raw is not None:
            out += (b"D" if types == _FLOATS else b"R") + (b"l" if t is list else b"t") + _LEN.pack(len(raw)) + raw
            return
        left[0] += len(v)  # counted again one by one
        out += (b"l" if t is list else b"t") + _LEN.pack(len(v))
        for x in v:
            _exact(x, out, left, depth - 1)
    elif t is dict:
        _exact_dict(v, out, left, depth)
    elif isinstance(v, np.generic) and v.dtype.kind in "biufcSU":
        code = v.dtype.str.encode()
        out += b"n" + _LEN.pack(len(code)) + code + v.tobytes()
    elif t is Opaque:
        raw = v.name.encode("utf-8", "surrogatepass")
        out += b"o" + _LEN.pack(len(raw)) + raw
    else:
        raise NotPlain(f"it holds a {_name(v)}")


def _repr_bytes(v: Any) -> bytes | None:
    """``repr(v)`` of flat values as bytes; ``None`` where an int is past ``str()``'s digit limit (then: one by one)."""
    try:
        return repr(v).encode("utf-8", "surrogatepass")
    except ValueError:
        return None


def _flat_bytes(v: list[Any] | tuple[Any, ...], types: set[type]) -> bytes | None:
    return array.array("d", v).tobytes() if types == _FLOATS else _repr_bytes(v)


def _exact_dict(v: dict[Any, Any], out: bytearray, left: list[int], depth: int) -> None:
    if set(map(type, v)) <= _STR:  # the common shape (a config): keys in sorted order
        left[0] -= 2 * len(v)
        if left[0] < 0:
            raise NotPlain(f"it has more than {2 * len(v) + left[0]} elements")
        raw = _repr_bytes(sorted(v.items())) if set(map(type, v.values())) <= _FLAT else None
        if raw is not None:  # ... of scalars: one repr, in C
            out += b"E" + _LEN.pack(len(raw)) + raw
            return
        left[0] += 2 * len(v)  # counted again one by one
        out += b"e" + _LEN.pack(len(v))
        for k in sorted(v):
            _exact(k, out, left, depth - 1)
            _exact(v[k], out, left, depth - 1)
        return
    entries = []
    for k, x in v.items():
        key, item = bytearray(), bytearray()
        _exact(k, key, left, depth - 1)
        _exact(x, item, left, depth - 1)
        entries.append((bytes(key), bytes(item)))
    out += b"d" + _LEN.pack(len(entries))
    for pair in sorted(entries):  # in the order of their bytes: any keys, the same order on every rank
        out += pair[0] + pair[1]


# ------------------------------------------------------------------------------------------------ EQUAL


def _equal(v: Any, out: bytearray, depth: int) -> None:
    """Exact built-in types first (the common case: TRL's prompts are str or lists of str-keyed dicts of str)."""
    if depth < 0:
        raise NotPlain(f"it is nested more than {MAX_DEPTH} levels deep")
    t = type(v)
    if t is str:  # inline: TRL's prompts are mostly str
        raw = v.encode("utf-8", "surrogatepass")
        out += b"s"
        out += _pack(len(raw))
        out += raw
    elif t is list or t is tuple:
        out += b"l" if t is list else b"t"
        out += _pack(len(v))
        for x in v:
            _equal(x, out, depth - 1)
    elif t is dict:
        _equal_dict(v, out, depth)
    elif t is int or t is bool:
        _int(int(v), out)
    elif v is None:
        out += b"N"
    else:
        _equal_other(v, out, depth)


def _equal_dict(v: dict[Any, Any], out: bytearray, depth: int) -> None:
    if all(isinstance(k, str) for k in v):  # chat messages: in the order of their str keys
        out += b"e"
        out += _pack(len(v))
        for k in sorted(v):
            _equal(k, out, depth - 1)
            _equal(v[k], out, depth - 1)
        return
    items: list[tuple[bytes, bytes]] = []
    for k, x in v.items():
        key, item = bytearray(), bytearray()
        _equal(k, key, depth - 1)
        _equal(x, item, depth - 1)
        items.append((bytes(key), bytes(item)))
    out += b"d" + _LEN.pack(len(items))
    for key_bytes, item_bytes in sorted(items):  # keys are unique: the values never decide the order
        out += key_bytes + item_bytes


def _equal_other(v: Any, out: bytearray, depth: int) -> None:
    """:func:`_equal` of anything but an exact str, list, tuple, dict, int, bool or ``None``."""
    if isinstance(v, str):  # a str subclass (numpy's str_): its characters
        _str(v, out)
    elif isinstance(v, (bool, int, np.integer, np.bool_)):
        _int(int(v), out)
    elif isinstance(v, (float, np.floating)):
        f = float(v)
        if math.isfinite(f) and f.is_integer():
            _int(int(f), out)  # 1.0 == 1; -0.0 == 0
        else:
            out += b"f" + _F64.pack(math.nan if f != f else f)  # every NaN is one key (one canonical NaN)
    elif isinstance(v, (complex, np.complexfloating)):
        c = complex(v)
        if c.imag:
            out += b"c" + _C128.pack(c.real, c.imag)
        else:
            _equal_other(c.real, out, depth)
    elif isinstance(v, (list, tuple)):
        _equal(list(v) if isinstance(v, list) else tuple(v), out, depth)
    elif isinstance(v, dict):
        _equal_dict(v, out, depth)
    elif isinstance(v, (bytes, np.bytes_)):
        out += b"b" + _LEN.pack(len(v)) + bytes(v)
    elif isinstance(v, np.ndarray):
        _equal(v.tolist(), out, depth - 1)
    elif isinstance(v, np.generic):
        _equal(v.item(), out, depth)
    elif _is_tensor(v):
        _equal(v.detach().cpu().tolist(), out, depth - 1)
    else:
        raise NotPlain(f"it holds a {_name(v)}")


def _is_tensor(v: Any) -> bool:
    """Whether ``v`` is a ``torch.Tensor`` (torch is not imported here: a tensor exists only once it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(v, torch.Tensor)
