"""A call's shared arguments: what every rank must pass alike, its digest, and the report a mismatch shows.

A shared argument (not a per-sample column) is one value for the whole batch, and the batch is scored
with one rank's value (``main``: rank 0's). Every rank hashes its plain shared values into its header
(:attr:`SharedValues.digest`, under ``_canonical``'s ``EXACT`` rule); ranks that passed different values
raise together instead of scoring every rank's samples with one rank's argument. Only plain values can
be hashed alike on every rank (an object's repr holds an address, a tokenizer or a model has no
canonical bytes), so only they are checked. Pure functions: nothing here talks to another rank.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

from ._canonical import EXACT, Budget, NotPlain, encode
from ._codec import decode_value, encode_value
from ._errors import CodecError
from ._wire import NO_SHARED, fingerprint_bytes

__all__ = [
    "MAX_REPORT_NAMES",
    "MAX_SHARED_BYTES",
    "MAX_SHARED_ITEMS",
    "SharedValues",
    "differing_shared",
    "read_report",
    "shared_key",
    "shared_values_by_rank",
]


MAX_SHARED_ITEMS = 1024  # a shared value with more elements (nested ones included) is not checked
MAX_SHARED_BYTES = 64 << 10  # ... nor one whose canonical bytes are longer (a hash per call stays cheap)
MAX_REPORT_NAMES = 256  # a disagreement report lists at most this many arguments
_SHORT = 60  # characters of a value's repr shown in the disagreement message
_LEN = struct.Struct("<Q")
_NOT_CHECKED = b"?"  # an argument present, but not plain: its presence counts, not its value
_FLAT = frozenset({type(None), bool, int, float, str, bytes})  # exact types whose repr is their exact value


def shared_key(value: Any) -> bytes | None:
    """The canonical bytes of a plain shared value, or ``None`` when it is not plain (then it is not checked).

    ``_canonical``'s :data:`~syncreward._canonical.EXACT` rule: one rank's value scores every rank's
    samples, so two values are the same only where the function cannot tell them apart (``1``, ``1.0`` and
    ``True`` differ, as do ``-0.0`` and ``0.0``, a list and a tuple; subclasses and arrays are not plain),
    with at most ``MAX_SHARED_ITEMS`` elements and ``MAX_SHARED_BYTES`` bytes in all.
    """
    out = bytearray()
    return bytes(out) if _append_key(value, out) else None


_SHARED_BUDGET = Budget(MAX_SHARED_ITEMS, MAX_SHARED_BYTES, 32)


def _append_key(value: Any, out: bytearray) -> bool:
    """Append :func:`shared_key` of ``value`` to ``out``; ``False`` (and ``out`` as it was) if it has none."""
    try:
        encode(value, out, EXACT, _SHARED_BUDGET)
    except NotPlain:
        return False
    except Exception:  # never seen; a value that cannot be read is not checked rather than fail the call
        return False  # (``encode`` leaves ``out`` as it was on NotPlain only)
    return True


def _short(value: Any, key: bytes | None) -> str:
    """How the disagreement message shows a value: its repr (plain values only), cut to ``_SHORT`` characters."""
    if key is None:
        return f"<{type(value).__name__}: not checked>"
    try:
        text = repr(value)
    except ValueError:  # an int past repr()'s digit limit
        return f"<{type(value).__name__} of {len(key)} bytes>"
    return text if len(text) <= _SHORT else text[: _SHORT - 3] + "..."


def _digest(values: Mapping[str, Any]) -> int:
    """One hash of every name with its value's key (or, for a value that has none, its presence)."""
    if not values:
        return NO_SHARED
    if set(map(type, values.values())) <= _FLAT:  # the common case (a threshold, a step): one repr, in C
        try:
            return fingerprint_bytes(b"R" + repr(sorted(values.items())).encode("utf-8", "surrogatepass")) or 1
        except ValueError:  # an int past repr()'s digit limit: one by one
            pass
    out = bytearray()
    for name in sorted(values):
        raw = name.encode("utf-8", "surrogatepass")
        out += _LEN.pack(len(raw)) + raw
        if not _append_key(values[name], out):
            out += _NOT_CHECKED
    return fingerprint_bytes(bytes(out)) or 1


class SharedValues:
    """The shared arguments of one call that every rank must pass alike, by name.

    ``values`` leaves out what is never checked (TRL's ``trainer_state``, ``log_extra``, ``log_metric``
    and ``exclude=``d names: ``_binding``); of the rest, a value that is not plain (:func:`shared_key`)
    counts by its presence only. :attr:`digest` (computed when it is made: on the caller's thread) goes
    in the call's header and check record; :meth:`report` is what a rank tells the others when the
    digests differ.
    """

    __slots__ = ("digest", "values")

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values
        self.digest = _digest(values)

    def report(self) -> bytes:
        """``{name: [digest of its value or None (not checked), short repr]}``, encoded (plain data only)."""
        entries = {}
        for name in sorted(self.values)[:MAX_REPORT_NAMES]:
            key = shared_key(self.values[name])
            entries[name] = [None if key is None else fingerprint_bytes(key), _short(self.values[name], key)]
        out = bytearray()
        encode_value(entries, out)
        return bytes(out)


def read_report(blob: bytes) -> dict[str, tuple[int | None, str]] | None:
    """A report received from another rank, or ``None`` when it is not one (it is input like any other)."""
    try:
        raw = decode_value(blob)
    except CodecError:
        return None
    if not isinstance(raw, dict) or len(raw) > MAX_REPORT_NAMES:
        return None
    out: dict[str, tuple[int | None, str]] = {}
    for name, entry in raw.items():
        if not (isinstance(name, str) and isinstance(entry, list) and len(entry) == 2):
            return None
        digest, text = entry
        if not ((digest is None or type(digest) is int) and isinstance(text, str)):
            return None
        out[name] = (digest, text[: _SHORT + 40])
    return out


_ABSENT = (None, "<not passed>")


def differing_shared(reports: Sequence[Mapping[str, tuple[int | None, str]]]) -> list[str]:
    """The names whose values differ between ranks (rank order of ``reports``), sorted.

    A name some rank did not pass differs; one that no rank's value is plain for (not checked anywhere)
    does not, whatever the objects are.
    """
    names = sorted({name for r in reports for name in r})
    out = []
    for name in names:
        seen = {(name in r, r.get(name, _ABSENT)[0]) for r in reports}
        if len(seen) > 1:
            out.append(name)
    return out


def shared_values_by_rank(
    reports: Sequence[Mapping[str, tuple[int | None, str]]], name: str
) -> list[tuple[str, list[int]]]:
    """How each rank passed ``name``: ``[(shown value, ranks)]``, in order of the first rank that passed each."""
    groups: dict[tuple[bool, int | None, str], list[int]] = {}
    for rank, r in enumerate(reports):
        digest, text = r.get(name, _ABSENT)
        groups.setdefault((name in r, digest, text), []).append(rank)
    return [(text, ranks) for (_, _, text), ranks in groups.items()]
