"""Group keys: the content digest of a sample's value, alike in every process for equal values.

``mode="shard"`` with ``group_by=`` sends every rank a :data:`KEY_BYTES`-byte digest of each sample's
value (:func:`group_keys`) instead of the value, so a TRL conversational prompt (a list of message
dicts) is a group key like a str.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import torch

from ._canonical import EQUAL, NotPlain, encode
from ._codec import C_NDARRAY, C_TENSOR
from ._errors import InputError

__all__ = ["KEY_BYTES", "group_keys"]

KEY_BYTES = 16  # a group key on the wire: the blake2b digest of a sample's group_by value
_LEN = struct.Struct("<Q")


def group_keys(values: Any, container: int, column: str) -> bytes:
    """The group key of every sample: ``KEY_BYTES`` per sample, the blake2b digest of its value's content.

    Every rank computes the same key for equal values (``_canonical``'s :data:`~syncreward._canonical.EQUAL`
    rule: values equal under ``==`` write alike, ``1 == 1.0 == True``), so samples group by the
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
    pack = _LEN.pack
    seen: dict[str | int, bytes] = {}  # a prompt repeats once per completion (TRL: num_generations)
    for i, v in enumerate(values):
        t = type(v)
        if t is str or t is int:  # the common keys inline: the bytes ``_canonical.encode`` writes
            key = seen.get(v)
            if key is None:
                if t is str:
                    b = b"s" + pack(len(raw := v.encode("utf-8", "surrogatepass"))) + raw
                else:
                    b = b"i" + pack(len(raw := v.to_bytes(v.bit_length() // 8 + 1, "little", signed=True))) + raw
                key = seen[v] = blake2b(b, digest_size=KEY_BYTES).digest()
            keys += key
            continue
        try:
            out.clear()
            encode(v, out, EQUAL)
        except NotPlain as e:
            raise InputError(
                f"mode='shard' with group_by={column!r}: the value of this rank's sample {i} cannot be a group key "
                f"({e}). HINT: group by a column of plain data (str, int, float, bytes, None, and lists, tuples and "
                "dicts of them, such as TRL's prompts), e.g. a per-prompt id."
            ) from None
        keys += blake2b(out, digest_size=KEY_BYTES).digest()
    return bytes(keys)
