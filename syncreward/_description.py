"""What a call is, in parts: the record a mismatch message is made of, on every rank.

A call's :class:`Description` (made by ``_call`` for every call, from what it already knows: no text is
formatted, nothing is encoded) is rendered to text only where it is shown (:attr:`Description.text`), and
travels to the other ranks only when the ranks made different calls (``_exchange.Link.mismatch``), encoded
with the codec as plain data (:meth:`Description.encode`) and read back field by field
(:meth:`Description.decode`): no rank parses another's text.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._codec import decode_value, encode_value
from ._errors import CodecError
from ._wire import NO_STEP

__all__ = ["Columns", "Description"]

Columns = tuple[tuple[str, str], ...]  # (name, container word: "list", "tuple", "ndarray", "tensor") per column


class Description(NamedTuple):
    """One call as this rank sees it: which call, which reward, which columns, from where."""

    seq: int  # the call's number on its session
    step: int  # the training step it belongs to (``_wire.NO_STEP``: none)
    reward: str  # the reward's identity and options as shown (``Spec.key``; `` of self[...]`` for a method)
    digest: str  # compared beside ``reward``: the configuration whole (``_identity.Identity.digest``; "": none)
    columns: Columns | None  # its per-sample columns; ``None``: its arguments did not bind
    site: str  # where it was called from, as this rank shows it (``file:line in function``)

    @property
    def text(self) -> str:
        """``call #3 at step 1: <reward> per-sample columns [a:list, b:tensor] called from <site>``."""
        at = f" at step {self.step}" if self.step != NO_STEP else ""
        cols = ", ".join(f"{n}:{c}" for n, c in self.columns) if self.columns is not None else "?"
        return f"call #{self.seq}{at}: {self.reward} per-sample columns [{cols}] called from {self.site}"

    def __str__(self) -> str:
        return self.text

    @property
    def call(self) -> tuple[Any, ...]:
        """What names the call wherever it is made from: all but :attr:`site`."""
        return self[:5]

    @property
    def rewarded(self) -> tuple[str, str]:
        """Which reward it calls: its identity and options, with the configuration's digest."""
        return self.reward, self.digest

    def encode(self) -> bytes:
        """The record as plain data, encoded with the codec (what another rank's :meth:`decode` reads)."""
        out = bytearray()
        cols = None if self.columns is None else [[n, c] for n, c in self.columns]
        encode_value([self.seq, self.step, self.reward, self.digest, cols, self.site], out)
        return bytes(out)

    @classmethod
    def decode(cls, blob: bytes) -> Description | None:
        """A record received from another rank, or ``None`` when it is not one (it is input like any other)."""
        try:
            raw = decode_value(blob)
        except CodecError:
            return None
        if not (isinstance(raw, list) and len(raw) == 6):
            return None
        seq, step, reward, digest, cols, site = raw
        if not (type(seq) is int and type(step) is int and all(type(x) is str for x in (reward, digest, site))):
            return None
        if cols is None:
            return cls(seq, step, reward, digest, None, site)
        if not isinstance(cols, list):
            return None
        columns = []
        for c in cols:
            if not (isinstance(c, list) and len(c) == 2 and type(c[0]) is str and type(c[1]) is str):
                return None
            columns.append((c[0], c[1]))
        return cls(seq, step, reward, digest, tuple(columns), site)
