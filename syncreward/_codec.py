"""The wire format: plain data and columns of it, without pickle.

Decoding never executes code. Plain data -- ``str``, ``bytes``, ``int``, ``float``, ``bool``, ``None``,
lists, tuples, dicts, numpy arrays (object arrays of plain data included) and scalars, torch tensors --
is written with a small tagged binary format; arrays and tensors travel as raw buffers (CUDA tensors are
copied to the CPU first). Any other object is refused unless the caller opted in to pickle
(``allow_pickle=True``, trusted clusters only).

A *frame* carries a batch of per-sample columns. Homogeneous columns, the common case in RL rewards,
take fast paths that cost a few C-level passes instead of one Python call per value:

=========================  ==================================================================
column                     encoding
=========================  ==================================================================
list of ``str``            byte lengths + one UTF-8 blob
list of float / bool       one raw float64 / bool array
list of int                one integer array of the narrowest dtype that holds every value
list of lists of ints      row lengths + one flat integer array of the narrowest dtype (token ids)
list of lists of str dicts row lengths, the keys, one string column per key (chat messages)
numpy array / tensor       dtype, shape, raw bytes of the whole column
PIL image (a value)        mode, size, palette, raw pixels (``Image.tobytes()``); named columns only
object array, 2-D or more  its shape and one tagged value per element
anything else              one tagged value per sample
=========================  ==================================================================

"Narrowest dtype" is chosen from the minimum and maximum: token ids of a 150k vocabulary travel as
uint32, ids of a 32k vocabulary as uint16, string lengths as uint8/uint16 -- frames are about as small
as pickle's. The token-id path converts the rows with one ``marshal.dumps`` (a single C pass that keeps
exact types: a ``bool`` or a numpy integer is not an ``int`` to it) whose fixed 5-byte records numpy
checks and gathers; it only ever *writes* marshal data, the decoder never reads any.

Frame layout (little endian; every raw buffer 8-byte aligned relative to the frame start, and every
frame padded to a multiple of 8 bytes so frames can be concatenated)::

    b"SRW2" u32 ncols u64 nrows
    per column: u32 namelen, name, u8 container, u8 encoding, pad8, u64 body_len, body, pad8
    u8 has_meta [generic value]  pad8

The decoder checks every declared size against the bytes that are actually there before it allocates
anything, bounds nesting depth, and only accepts an allowlist of dtypes and image modes, so truncated,
corrupted or hostile buffers produce a :class:`~syncreward.CodecError`, never a crash, a hang or a huge
allocation: what a frame decodes to is proportional to the bytes it holds, never to a declared size.
Encoding raises only :class:`~syncreward.UnsupportedTypeError` (a ``SyncRewardError``) for values it
cannot carry, whatever they are.

This module is laid out by kind, then by encoding, each encoder beside its decoder:

* *hostile-input limits*: every bound on what a received frame can make the decoder do;
* *codes*: containers, column encodings, value tags, and the primitives both directions share (padding,
  narrow integers, the bounds-checked ``_Reader``);
* *values*, one tag at a time: numpy arrays, numpy scalars, object arrays, tensors, PIL images, big
  integers, pickled objects, then the tagged value itself (``_encode``/``_decode``, whose hot loop reads the
  common tags in place) and ``encode_value``/``decode_value``;
* *columns*, one encoding at a time, then ``_COLUMN_ENCODINGS``, the one registry ``code -> (encode,
  decode)`` that both directions dispatch through, and ``is_plain``;
* *frames*: ``encode_frame``/``decode_frame``.

Adding a column encoding is a new code at the end of the ``E_`` line (codes are the wire format: never
renumber one), its encode and decode functions side by side, and one ``_COLUMN_ENCODINGS`` entry saying
which columns it is tried on.
"""

from __future__ import annotations

import marshal
import pickle
import re
import struct
import sys
from collections import UserString
from collections.abc import Callable, Sequence
from itertools import accumulate, chain, pairwise
from operator import itemgetter
from typing import Any

import numpy as np
import torch

from ._errors import CodecError, SyncRewardError, UnsupportedTypeError

__all__ = [
    "CONTAINERS",
    "Column",
    "container_of",
    "decode_frame",
    "decode_value",
    "encode_frame",
    "encode_value",
    "is_image_column",
    "is_plain",
]

MAGIC = b"SRW2"

# ------------------------------------------------------------------------------------ hostile-input limits
# Every bound on what a received frame can make the decoder do, in one place, as msgpack documents its
# ``Unpacker(max_str_len=, max_array_len=, max_map_len=, strict_map_key=, ...)``. Past one, the frame is a
# CodecError, raised before the work or the allocation it would cause. The encoder refuses
# (UnsupportedTypeError) values beyond the nesting, dimension, digit and pixel limits, so what one rank sends
# another accepts; it does not count dict-key hash collisions (a dict with 33 colliding keys took its sender
# quadratic time to build, and is refused only when received).
#
# Three rules need no number. Every count a frame declares (rows, items, elements, column headers) is checked
# against the bytes left before anything is allocated, each item taking at least one byte (``_Reader.count``,
# ``_Reader.shape``). Only allowlisted types are built: the dtypes of ``_NP_DTYPE_RE`` and ``_TORCH_DTYPES``,
# the image modes of ``_IMAGE_MODES``, and unpickling only with ``allow_pickle=True``. A dict key equal to an
# earlier one (which no dict can hold twice) is refused, never silently overwritten.

# Nesting levels of a value: the decoder recurses once per level.
MAX_DEPTH = 100
# Dimensions of an array or tensor: what numpy before 2.0 can build (the frame's u8 count would allow 255).
_MAX_NDIM = 32
# Digits of an integer beyond int64 (decimal text): int(text) is quadratic (sys.get_int_max_str_digits()).
_MAX_BIGINT_DIGITS = 4300
# Pixels of a PIL image (1 GiB of RGBA); larger images are refused on both sides.
MAX_IMAGE_PIXELS = 1 << 28
# Rows that hold no bytes (see below): a frame declares at most this many, or one per byte it holds.
MAX_UNBACKED_ROWS = 1 << 16
# Keys of one received dict whose hash another of its keys has (see below): more make building it quadratic.
MAX_MAP_HASH_COLLISIONS = 32
# Keys per record of a record (chat-format) column, each one more string column; more are written generically.
_MAX_RECORD_KEYS = 64
# Bytes per record at least, else generic: a dict takes ~200 bytes, so empty records cannot decode to 100x.
_RECORD_MIN_BYTES = 16
# Row lengths (of token-id and record columns) are uint32 at least: each row decodes to a 56-byte list.
_ROW_LENGTH_MIN_CODE = 2
# Code points of numpy unicode values: one above it makes a broken str (see below).
_MAX_CODE_POINT = 0x10FFFF
#
# MAX_UNBACKED_ROWS: rows that hold no bytes at all -- a frame without columns, an array column of shape
# (n, 0), an empty PIL image -- are the exception to "each item takes a byte": no array dimension and no side
# of an empty image may be larger either. (A dimension of a zero-size array allocates nothing here, but
# whoever iterates over the rows does; PIL allocates a pointer per row even for an empty image.)
#
# MAX_MAP_HASH_COLLISIONS: str and bytes keys are hashed with a per-process random seed (SipHash), so a peer
# cannot choose keys that collide. Other keys (int, float, tuple, None, numpy scalars) hash deterministically:
# 20,000 int keys k * (2**61 - 1) all hash to 0 and make building the dict quadratic (over 15 s). An honest
# dict almost never holds two keys of one hash (hash(-1) == hash(-2)), which keeps building one linear.
#
# _ROW_LENGTH_MIN_CODE: narrower lengths would let a hostile frame build 64x its size in empty lists. With
# this, the fast paths decode to at most about 20x their bytes (uint16 ids: 2 bytes -> a 32-byte int + a
# pointer).
#
# _MAX_CODE_POINT: numpy unicode ('<U', '>U') arrays and scalars hold UCS-4 code points as raw bytes; numpy
# builds a str from any of them, and one above this (not a code point) makes a str that raises SystemError
# when used. (Lone surrogates, U+D800-U+DFFF, are valid in a Python str and travel.)

# --------------------------------------------------------------------------------------------------- codes

# Column containers: how the column was passed, so it is handed back the same way.
C_LIST, C_TUPLE, C_NDARRAY, C_TENSOR = 0, 1, 2, 3
CONTAINERS = {C_LIST: "list", C_TUPLE: "tuple", C_NDARRAY: "ndarray", C_TENSOR: "tensor"}

# Column encodings (``_COLUMN_ENCODINGS`` below says what each is for). New codes go at the end.
E_GENERIC, E_STR, E_F64, E_INT, E_BOOL, E_INTLISTS, E_ARRAY, E_TENSOR, E_OBJARRAY, E_RECORDS = range(10)

# Generic value tags.
(
    T_NONE,
    T_TRUE,
    T_FALSE,
    T_INT,
    T_BIGINT,
    T_FLOAT,
    T_STR,
    T_BYTES,
    T_LIST,
    T_TUPLE,
    T_DICT,
    T_ARRAY,
    T_NPSCALAR,
    T_TENSOR,
    T_PICKLE,
    T_OBJARRAY,
    T_IMAGE,
) = range(17)

# What an encoding may hold besides plain data (the ``level`` of the internal encoders):
# _PLAIN: nothing else (is_plain, and **kwargs columns that may be left behind);
# _IMAGES: PIL images too (columns the function names, meta);  _PICKLE: images and pickled objects.
_PLAIN, _IMAGES, _PICKLE = 0, 1, 2

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")
_F64 = struct.Struct("<d")
_TAG_INT = struct.Struct("<Bq")
_TAG_FLOAT = struct.Struct("<Bd")
_TAG_LEN = struct.Struct("<BQ")

# Integer dtypes of the narrow integer encodings, by code. Codes 0-3 are unsigned (the only ones allowed
# for lengths).
_INT_DTYPES = tuple(np.dtype(d) for d in ("|u1", "<u2", "<u4", "<u8", "|i1", "<i2", "<i4", "<i8"))
_I64_CODE = 7


def _type_name(obj: object) -> str:
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _unsupported(obj: object) -> UnsupportedTypeError:
    if _is_image(obj):
        return UnsupportedTypeError(
            "PIL images travel without pickle only in columns the function names (or that include=[...] lists); "
            "a **kwargs image column is left behind."
        )
    if isinstance(obj, np.ma.MaskedArray):
        return UnsupportedTypeError(
            "cannot send a numpy masked array between ranks: its mask would be lost. HINT: send the data and the "
            "mask as two columns, e.g. values=x.filled(<fill value>) and mask=np.ma.getmaskarray(x), and rebuild "
            "it with np.ma.masked_array(values, mask) inside the function."
        )
    error = UnsupportedTypeError(_plain_only(_type_name(obj)))
    error.unsupported_type = _type_name(obj)  # type: ignore[attr-defined]  # encode_frame rewrites the hint
    return error


def _plain_only(type_name: str, column: str | None = None, function: str | None = None) -> str:
    """What a value the wire cannot carry says.

    With the column and the reward it is an input of, the hint names both (``exclude=['meta']``).
    """
    leave = (
        f"if {function!r} does not need column {column!r}, pass exclude=[{column!r}] to its synced_reward; otherwise "
        if column is not None and function is not None
        else ""
    )
    return (
        f"cannot send a {type_name} between ranks: syncreward's wire format carries plain data only "
        "(str, bytes, int, float, bool, None, list, tuple, dict, numpy arrays/scalars, torch tensors, "
        f"and PIL images in named columns). HINT: {leave}convert it to plain data, or pass allow_pickle=True "
        "(pickle runs code when decoded: trusted clusters only)."
    )


def _unsendable_result(e: Exception, label: str, function: str | None) -> UnsupportedTypeError:
    """What a function's result the wire cannot carry says: ``label`` names it (``results['acc']``, ``its result``).

    A result is not an input column: the user never named it, so the message names what the function returned
    and says what to return instead (an input's hint, ``exclude=``, does not apply).
    """
    kind = getattr(e, "unsupported_type", None)
    if kind is not None:
        why = f"it holds a {kind}"
    elif isinstance(e, RecursionError):
        why = "a value in it is nested too deeply (or holds itself)"
    elif isinstance(e, UnsupportedTypeError):
        why = str(e).split(" HINT: ")[0].rstrip(".")  # the value's own words; the hint below is a result's
    else:
        why = f"encoding it failed with {type(e).__name__}: {e}"
    return UnsupportedTypeError(
        f"synced function {function!r}: {label} cannot be sent between ranks: {why}. syncreward's wire format "
        "carries plain data only (str, bytes, int, float, bool, None, list, tuple, dict, numpy arrays/scalars, "
        "torch tensors, PIL images). HINT: return plain data -- numbers, strings or None per sample, in a list, "
        "tuple, numpy array or tensor (or a dict of those) -- e.g. a float taken from your own object; or pass "
        "allow_pickle=True (pickle runs code when decoded: trusted clusters only)."
    )


def _wrap_failure(e: Exception, what: str) -> UnsupportedTypeError:
    """An unexpected exception while encoding (a broken ``__len__``, a failing ``__reduce__``, ...)."""
    return UnsupportedTypeError(f"cannot encode {what}: {type(e).__name__}: {e}")


# ------------------------------------------------------------------------------------- primitives: writing


# ``out += _PADDING[len(out) & 7]`` pads a frame being written to a multiple of 8 bytes (written in place:
# a helper's call costs more than the padding, a dozen times a frame)
_PADDING = tuple(bytes(-i % 8) for i in range(8))


def _raw(a: np.ndarray) -> memoryview | bytes:
    """The bytes of an array (C order) without a copy where it already is contiguous."""
    if not a.size:
        return b""
    return np.ascontiguousarray(a).reshape(-1).data.cast("B")


_MIN, _MAX = np.minimum.reduce, np.maximum.reduce  # a.min()/a.max() without their Python wrappers


def _narrow(a: np.ndarray) -> tuple[int, np.ndarray]:
    """The code of the narrowest integer dtype that holds every value of ``a``, and ``a`` in it."""
    if not a.size:
        return 0, a.astype(_INT_DTYPES[0])
    lo, hi = int(_MIN(a)), int(_MAX(a))
    if lo >= 0:
        code = 0 if hi < 1 << 8 else 1 if hi < 1 << 16 else 2 if hi < 1 << 32 else 3
    else:
        lim = max(-lo - 1, hi)
        code = 4 if lim < 1 << 7 else 5 if lim < 1 << 15 else 6 if lim < 1 << 31 else _I64_CODE
    dtype = _INT_DTYPES[code]
    # same width and byte order (the int32 of the token-id path -> uint32): reinterpret, do not copy
    if a.dtype.kind in "iu" and a.dtype.str[0] + str(a.dtype.itemsize) == dtype.str[0] + str(dtype.itemsize):
        return code, a.view(dtype)
    return code, a.astype(dtype)


def _encode_ints(a: np.ndarray, out: bytearray, min_code: int = 0) -> None:
    """Append the dtype code, padding and the values of ``a`` in its narrowest dtype (at least ``min_code``)."""
    code, narrow = _narrow(a)
    if code < min_code:
        code, narrow = min_code, a.astype(_INT_DTYPES[min_code])
    out += _U8.pack(code)
    out += _PADDING[len(out) & 7]
    out += _raw(narrow)


def _encode_shape(shape: Sequence[int], out: bytearray) -> None:
    out += _U8.pack(len(shape))
    for s in shape:
        out += _U64.pack(s)


def _encode_array_header(dtype: str, shape: Sequence[int], out: bytearray) -> None:
    d = dtype.encode()
    out += _U8.pack(len(d))
    out += d
    _encode_shape(shape, out)


# ------------------------------------------------------------------------------------- primitives: reading


def _np_dtype(dname: str) -> np.dtype[Any]:
    try:
        return np.dtype(dname)
    except TypeError:  # matches the allowlist pattern but is no numpy dtype, e.g. "<i3"
        raise CodecError(f"unsupported array dtype {dname!r} in payload") from None


class _Reader:
    """Bounds-checked cursor over a buffer. Positions are relative to the frame start (for alignment)."""

    __slots__ = ("allow_pickle", "buf", "end", "pos")

    def __init__(self, buf: memoryview, allow_pickle: bool) -> None:
        self.buf = buf
        self.pos = 0
        self.end = len(buf)
        self.allow_pickle = allow_pickle

    def _short(self, n: int) -> CodecError:
        return CodecError(
            f"truncated or corrupt payload: {n} bytes declared at offset {self.pos}, {self.end - self.pos} available"
        )

    def take(self, n: int) -> memoryview:
        p = self.pos
        if n < 0 or n > self.end - p:
            raise self._short(n)
        self.pos = p + n
        return self.buf[p : p + n]

    # The fixed-size reads below run a few dozen times per frame: each is one call, bounds checked inline.

    def u8(self) -> int:
        p = self.pos
        if p >= self.end:
            raise self._short(1)
        self.pos = p + 1
        return self.buf[p]

    def u32(self) -> int:
        p = self.pos
        if p + 4 > self.end:
            raise self._short(4)
        self.pos = p + 4
        return _U32.unpack_from(self.buf, p)[0]  # type: ignore[no-any-return]

    def u64(self) -> int:
        p = self.pos
        if p + 8 > self.end:
            raise self._short(8)
        self.pos = p + 8
        return _U64.unpack_from(self.buf, p)[0]  # type: ignore[no-any-return]

    def align8(self) -> None:
        p = self.pos
        q = (p + 7) & ~7
        if q > self.end:
            raise self._short(q - p)
        self.pos = q

    def count(self, n: int, min_item_bytes: int) -> int:
        """Validate a declared item count against the bytes left."""
        if n * min_item_bytes > self.end - self.pos:
            raise CodecError(f"corrupt payload: {n} items declared but only {self.end - self.pos} bytes left")
        return n

    def shape(self) -> tuple[int, ...]:
        ndim = self.u8()
        if ndim > _MAX_NDIM:
            raise CodecError(f"corrupt payload: {ndim} dimensions")
        shape = tuple(self.u64() for _ in range(ndim))
        size = 1
        for s in shape:  # the elements, or the rows of a zero-size array (what tolist() would build)
            if s:
                size *= s
        if size > MAX_UNBACKED_ROWS and size > self.end - self.pos:
            raise CodecError(f"corrupt payload: an array of shape {shape} declared in {self.end - self.pos} bytes")
        return shape

    def array_header(self, torch_dtype: bool) -> tuple[Any, tuple[int, ...], int]:
        dname = bytes(self.take(self.u8())).decode("ascii", "replace")
        if torch_dtype:
            if dname not in _TORCH_DTYPES:
                raise CodecError(f"unsupported tensor dtype {dname!r} in payload")
            dtype: Any = _TORCH_DTYPES[dname]
            itemsize = dtype.itemsize
        else:
            if not _NP_DTYPE_RE.match(dname):
                raise CodecError(f"unsupported array dtype {dname!r} in payload")
            dtype = _np_dtype(dname)
            itemsize = dtype.itemsize
        shape = self.shape()
        nbytes = itemsize
        for s in shape:
            nbytes *= s
        self.align8()
        if nbytes > self.end - self.pos:
            raise CodecError(f"truncated or corrupt payload: array of {nbytes} bytes declared")
        return dtype, shape, nbytes

    def ints(self, n: int, unsigned: bool = False, min_code: int = 0) -> np.ndarray:
        """``n`` integers of a narrow integer encoding (dtype code, padding, values): a read-only view."""
        code = self.u8()
        if not min_code <= code < (4 if unsigned else len(_INT_DTYPES)):
            raise CodecError(f"corrupt payload: integer dtype code {code}")
        dtype = _INT_DTYPES[code]
        self.align8()
        self.count(n, dtype.itemsize)
        return np.frombuffer(self.take(n * dtype.itemsize), dtype=dtype)


def _rows(r: _Reader, n: int, min_code: int = 0) -> tuple[np.ndarray, list[int]]:
    """Row lengths (validated) and their offsets, of an E_STR, E_INTLISTS or E_RECORDS body."""
    lengths = r.ints(n, unsigned=True, min_code=min_code)
    if n <= 1024:  # a few rows: Python's max and running sum beat numpy's fixed cost
        items = lengths.tolist()
        if n and max(items) > r.end - r.pos:
            raise CodecError("corrupt payload: row length out of range")
        return lengths, list(accumulate(items, initial=0))
    if int(lengths.max()) > r.end - r.pos:
        raise CodecError("corrupt payload: row length out of range")
    return lengths, [0, *np.cumsum(lengths, dtype=np.int64).tolist()]


# ------------------------------------------------------------------------------------ values: numpy arrays

_NP_DTYPE_RE = re.compile(r"^[<>|=][biufcUS][0-9]{1,6}$")


def _array_problem(a: np.ndarray) -> str | None:
    """Why the wire format cannot carry this (non-object) array as raw bytes, or ``None`` if it can."""
    dt = a.dtype
    if dt.fields is not None or dt.subdtype is not None or not _NP_DTYPE_RE.match(dt.str):
        return f"numpy arrays of dtype {dt} are not supported by the wire format"
    if a.ndim > _MAX_NDIM:
        return f"arrays with more than {_MAX_NDIM} dimensions are not supported"
    return None


def _encode_ndarray(a: np.ndarray, out: bytearray) -> None:
    problem = _array_problem(a)
    if problem:
        raise UnsupportedTypeError(problem)
    _encode_array_header(a.dtype.str, a.shape, out)
    out += _PADDING[len(out) & 7]
    out += _raw(a)


def _check_code_points(raw: memoryview, dtype: np.dtype[Any]) -> None:
    """Refuse the raw UCS-4 data of a numpy unicode array or scalar if it holds a value that is no code point."""
    if len(raw) and int(np.frombuffer(raw, dtype=dtype.byteorder + "u4").max()) > _MAX_CODE_POINT:
        raise CodecError(f"corrupt payload: a numpy {dtype.str} value holds a character beyond U+10FFFF")


def _decode_ndarray(r: _Reader) -> np.ndarray:
    dtype, shape, nbytes = r.array_header(torch_dtype=False)
    raw = r.take(nbytes)
    if dtype.kind == "U":
        _check_code_points(raw, dtype)
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------- values: numpy scalars


def _encode_npscalar(obj: np.generic, out: bytearray) -> None:
    """A numpy scalar of an allowlisted dtype (after its tag): the dtype and the raw bytes of its value."""
    d = obj.dtype.str.encode()
    out += _U8.pack(len(d))
    out += d
    out += obj.tobytes()[: obj.dtype.itemsize]  # np.str_("") is "<U0" yet tobytes() gives 4 bytes


def _decode_npscalar(r: _Reader) -> Any:
    dname = bytes(r.take(r.u8())).decode("ascii", "replace")
    if not _NP_DTYPE_RE.match(dname):
        raise CodecError(f"unsupported scalar dtype {dname!r} in payload")
    dt = _np_dtype(dname)
    if dt.itemsize == 0:  # an empty numpy str or bytes scalar, np.str_("") ("<U0")
        return dt.type()
    raw = r.take(dt.itemsize)
    if dt.kind == "U":
        _check_code_points(raw, dt)
    return np.frombuffer(raw, dtype=dt)[0]


# ----------------------------------------------------------------------------------- values: object arrays


def _encode_objarray(a: np.ndarray, out: bytearray, level: int, depth: int) -> None:
    """An object array: its shape, then one tagged value per element (C order)."""
    if a.ndim > _MAX_NDIM:
        raise UnsupportedTypeError(f"arrays with more than {_MAX_NDIM} dimensions are not supported")
    _encode_shape(a.shape, out)
    for item in a.reshape(-1):
        _encode(item, out, level, depth + 1)


def _decode_objarray(r: _Reader, depth: int) -> np.ndarray:
    shape = r.shape()
    size = 1
    for s in shape:
        size *= s
        if size > r.end - r.pos:  # every element takes at least one byte
            raise CodecError(f"corrupt payload: object array of shape {shape} declared")
    items = [_decode(r, depth + 1) for _ in range(size)]
    return np.fromiter(items, dtype=object, count=size).reshape(shape)


# ----------------------------------------------------------------------------------------- values: tensors

CPU = torch.device("cpu")  # decoded tensors are made here, whatever the user's default device
_TORCH_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.complex64,
        torch.complex128,
    )
}
_PLAIN_TENSOR_TYPES = (torch.Tensor, torch.nn.Parameter)


def _tensor_problem(t: torch.Tensor) -> str | None:
    """Why the wire format cannot carry this tensor, or ``None`` if it can."""
    if type(t) not in _PLAIN_TENSOR_TYPES:
        return (
            f"tensor subclasses ({_type_name(t)}) are not supported by the wire format: they may hold state "
            "that a plain tensor would lose. HINT: send t.as_subclass(torch.Tensor) (or its parts) instead"
        )
    if t.layout is not torch.strided or t.is_nested:
        return f"{t.layout} tensors are not supported by the wire format. HINT: send t.to_dense() instead"
    if t.device.type == "meta":
        return "meta tensors hold no data and cannot be sent between ranks"
    if str(t.dtype).removeprefix("torch.") not in _TORCH_DTYPES:
        return f"tensors of dtype {t.dtype} are not supported by the wire format"
    if t.dim() > _MAX_NDIM:
        return f"tensors with more than {_MAX_NDIM} dimensions are not supported"
    return None


def _tensor_bytes(t: torch.Tensor) -> np.ndarray:
    """Raw bytes of a tensor as a uint8 numpy array (copied to the CPU if needed)."""
    t = t.detach()
    if t.is_conj() or t.is_neg():  # a lazy view (x.conj(), its .imag, torch._neg_view): its values, materialised
        t = t.resolve_conj().resolve_neg()
    if t.numel() == 0:  # an empty view may keep any stride (zeros(0, 5)[:, 1]), which view(uint8) refuses
        return np.empty(0, dtype=np.uint8)
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.reshape(-1)  # a view where the data is contiguous, else a contiguous copy
    if t.stride(0) != 1:  # one element viewed with a stride (logits[:, 1] of one sample): contiguous() keeps it
        t = t.clone(memory_format=torch.contiguous_format)
    if t.dtype is torch.bool:
        t = t.to(torch.uint8)
    return t.view(torch.uint8).numpy()


def _encode_tensor(t: torch.Tensor, out: bytearray) -> None:
    problem = _tensor_problem(t)
    if problem:
        raise UnsupportedTypeError(problem)
    _encode_array_header(str(t.dtype).removeprefix("torch."), tuple(t.shape), out)
    out += _PADDING[len(out) & 7]
    try:
        raw = _tensor_bytes(t)
    except (RuntimeError, NotImplementedError, TypeError, ValueError) as e:
        raise UnsupportedTypeError(f"cannot read the data of a {_type_name(t)} on {t.device}: {e}") from e
    out += raw.data


def _decode_tensor(r: _Reader) -> torch.Tensor:
    dtype, shape, nbytes = r.array_header(torch_dtype=True)
    raw = np.frombuffer(r.take(nbytes), dtype=np.uint8).copy()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=CPU)  # never the user's default device
    t = torch.from_numpy(raw)
    if dtype is torch.bool:
        return t.reshape(shape).to(torch.bool)
    return t.view(dtype).reshape(shape)


# -------------------------------------------------------------------------------------- values: PIL images

# PIL image modes that travel as raw pixels, with their bits per pixel (mode "1" rows are padded to bytes).
# "I" and "F" are native-endian 32-bit in PIL: they travel between little-endian hosts only.
_IMAGE_MODES = {
    "1": 1,
    "L": 8,
    "P": 8,
    "LA": 16,
    "La": 16,
    "PA": 16,
    "I;16": 16,
    "I;16L": 16,
    "I;16B": 16,
    "RGB": 24,
    "YCbCr": 24,
    "LAB": 24,
    "HSV": 24,
    "RGBA": 32,
    "RGBa": 32,
    "RGBX": 32,
    "CMYK": 32,
    "I": 32,
    "F": 32,
}
_NATIVE_IMAGE_MODES = frozenset({"I", "F"})
_PALETTE_MODES = {"RGB": 3, "RGBA": 4}


def _image_module() -> Any:
    """``PIL.Image`` if something already imported it (a PIL image cannot exist otherwise), else ``None``."""
    return sys.modules.get("PIL.Image")


def _is_image(obj: object) -> bool:
    image = _image_module()
    return image is not None and isinstance(obj, image.Image)


def _image_nbytes(mode: str, width: int, height: int) -> int:
    if mode == "1":
        return (width + 7) // 8 * height
    return _IMAGE_MODES[mode] // 8 * width * height


def _image_problem(im: Any) -> str | None:
    """Why the wire format cannot carry this PIL image, or ``None`` if it can."""
    if im.mode not in _IMAGE_MODES or (im.mode in _NATIVE_IMAGE_MODES and sys.byteorder != "little"):
        return (
            f"PIL images of mode {im.mode!r} are not supported by the wire format "
            f"(supported: {', '.join(_IMAGE_MODES)}). HINT: convert it first, e.g. image.convert('RGB')"
        )
    if im.width * im.height > MAX_IMAGE_PIXELS or (im.width * im.height == 0 and max(im.size) > MAX_UNBACKED_ROWS):
        return f"a {im.width}x{im.height} PIL image is larger than the wire format's {MAX_IMAGE_PIXELS} pixels"
    if im.mode in ("P", "PA") and im.palette is not None and im.palette.mode not in _PALETTE_MODES:
        return f"PIL images with a {im.palette.mode!r} palette are not supported. HINT: convert it to 'RGB'/'RGBA'"
    return None


def is_image_column(values: Any, container: int) -> bool:
    """Whether a column holds PIL images that the wire format carries without pickle.

    True for a list or tuple column in which every sample is a PIL image of a supported mode, ``None``,
    or a list/tuple of such images (multi-image samples), with at least one image. Such columns are *not*
    plain (:func:`is_plain` is False for them, so a ``**kwargs`` image column is still left behind), but
    they travel without pickle in columns the function names; the binding layer can use this predicate to
    decide to send image columns too.
    """
    if container not in (C_LIST, C_TUPLE) or _image_module() is None:
        return False
    seen = False
    try:
        for v in values:
            items = v if type(v) in (list, tuple) else (v,)
            for item in items:
                if item is None:
                    continue
                if not _is_image(item) or _image_problem(item) is not None:
                    return False
                seen = True
    except Exception:
        return False
    return seen


def _encode_image(im: Any, out: bytearray) -> None:
    """A PIL image: mode, size, palette (P/PA), ``info["transparency"]``, raw pixels (``Image.tobytes()``)."""
    problem = _image_problem(im)
    if problem:
        raise UnsupportedTypeError(problem)
    raw = im.tobytes()
    if len(raw) != _image_nbytes(im.mode, im.width, im.height):  # never expected: the table is tested
        raise UnsupportedTypeError(f"unexpected raw size of a PIL image of mode {im.mode!r}")
    mode = im.mode.encode()
    out += _U8.pack(len(mode))
    out += mode
    out += _U32.pack(im.width)
    out += _U32.pack(im.height)
    palette = im.palette.mode if im.mode in ("P", "PA") and im.palette is not None else ""
    out += _U8.pack(len(palette))
    if palette:
        out += palette.encode()
        data = bytes(im.getpalette(palette) or ())
        out += _U32.pack(len(data))
        out += data
    transparency = im.info.get("transparency")
    if not (
        type(transparency) in (int, bytes)
        or (type(transparency) is tuple and all(type(x) is int for x in transparency) and len(transparency) <= 4)
    ):
        transparency = None
    _encode(transparency, out, _PLAIN, MAX_DEPTH - 1)
    out += _U64.pack(len(raw))
    out += raw


def _decode_image(r: _Reader) -> Any:
    mode = bytes(r.take(r.u8())).decode("ascii", "replace")
    width, height = r.u32(), r.u32()
    if mode not in _IMAGE_MODES or (mode in _NATIVE_IMAGE_MODES and sys.byteorder != "little"):
        raise CodecError(f"unsupported image mode {mode!r} in payload")
    # PIL allocates a pointer per row even for an empty image: an empty image may not be tall (or wide)
    if width * height > MAX_IMAGE_PIXELS or (width * height == 0 and max(width, height) > MAX_UNBACKED_ROWS):
        raise CodecError(f"corrupt payload: a {width}x{height} image declared")
    palette_mode = bytes(r.take(r.u8())).decode("ascii", "replace")
    palette = b""
    if palette_mode:
        if palette_mode not in _PALETTE_MODES or mode not in ("P", "PA"):
            raise CodecError(f"corrupt payload: palette {palette_mode!r} for an image of mode {mode!r}")
        palette = bytes(r.take(r.u32()))
        if len(palette) > 256 * _PALETTE_MODES[palette_mode] or len(palette) % _PALETTE_MODES[palette_mode]:
            raise CodecError(f"corrupt payload: palette of {len(palette)} bytes")
    transparency = _decode(r, MAX_DEPTH - 1)
    if not (
        transparency is None
        or type(transparency) in (int, bytes)
        or (type(transparency) is tuple and len(transparency) <= 4 and all(type(x) is int for x in transparency))
    ):
        raise CodecError("corrupt payload: invalid image transparency")
    nbytes = r.u64()
    if nbytes != _image_nbytes(mode, width, height):
        raise CodecError(f"corrupt payload: {nbytes} bytes of pixels for a {width}x{height} {mode!r} image")
    raw = r.take(nbytes)  # every pixel byte is present before PIL allocates the image
    try:
        from PIL import Image
    except ImportError:
        raise CodecError(
            "payload holds a PIL image but pillow is not installed on this rank. HINT: pip install pillow"
        ) from None
    im = Image.frombytes(mode, (width, height), raw)
    if palette_mode:
        im.putpalette(palette, palette_mode)
    if transparency is not None:
        im.info["transparency"] = transparency
    return im


# ----------------------------------------------------------------------- values: big ints, pickled objects


def _encode_bigint(obj: int, out: bytearray) -> None:
    """An integer beyond int64: the T_BIGINT tag, the length and the decimal digits."""
    try:
        b = str(obj).encode()
    except ValueError:  # beyond sys.get_int_max_str_digits()
        b = b""
    if not 0 < len(b.removeprefix(b"-")) <= _MAX_BIGINT_DIGITS:
        raise UnsupportedTypeError(f"integers of more than {_MAX_BIGINT_DIGITS} digits are not supported")
    out += _TAG_LEN.pack(T_BIGINT, len(b))
    out += b


def _decode_bigint(r: _Reader) -> int:
    """An integer written by :func:`_encode_bigint`, from its length on."""
    text = bytes(r.take(r.u64()))
    if not re.fullmatch(rb"-?[0-9]{1,%d}" % _MAX_BIGINT_DIGITS, text):
        raise CodecError("corrupt payload: malformed integer")
    return int(text)


def _encode_pickled(obj: object, out: bytearray) -> None:
    """Any object, with ``allow_pickle=True`` only: the T_PICKLE tag, the length and the pickle."""
    b = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out += _TAG_LEN.pack(T_PICKLE, len(b))
    out += b


def _decode_pickled(r: _Reader) -> Any:
    """An object written by :func:`_encode_pickled`, from its length on; refused unless pickle is allowed."""
    data = r.take(r.u64())
    if not r.allow_pickle:
        raise CodecError(
            "payload contains a pickled object but allow_pickle is off on this rank; refusing to unpickle. "
            "HINT: all ranks must use the same allow_pickle setting."
        )
    return pickle.loads(data)


# -------------------------------------------------------------------------------- values: the tagged value


def _encode(obj: object, out: bytearray, level: int, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise UnsupportedTypeError(f"value nested deeper than {MAX_DEPTH} levels (or self-referencing)")
    t = type(obj)
    if t is str:
        b = obj.encode("utf-8", "surrogatepass")  # type: ignore[attr-defined]
        out += _TAG_LEN.pack(T_STR, len(b))
        out += b
    elif t is float:
        out += _TAG_FLOAT.pack(T_FLOAT, obj)
    elif t is int:
        if -(1 << 63) <= obj < (1 << 63):  # type: ignore[operator]
            out += _TAG_INT.pack(T_INT, obj)
        else:
            _encode_bigint(obj, out)  # type: ignore[arg-type]
    elif obj is None:
        out.append(T_NONE)
    elif obj is True:
        out.append(T_TRUE)
    elif obj is False:
        out.append(T_FALSE)
    elif t is list or t is tuple:
        out += _TAG_LEN.pack(T_LIST if t is list else T_TUPLE, len(obj))  # type: ignore[arg-type]
        for item in obj:  # type: ignore[attr-defined]
            _encode(item, out, level, depth + 1)
    elif t is dict:
        out += _TAG_LEN.pack(T_DICT, len(obj))  # type: ignore[arg-type]
        for k, v in obj.items():  # type: ignore[attr-defined]
            _encode(k, out, level, depth + 1)
            _encode(v, out, level, depth + 1)
    elif t is bytes:
        out += _TAG_LEN.pack(T_BYTES, len(obj))  # type: ignore[arg-type]
        out += obj  # type: ignore[operator,arg-type]
    elif t is np.ndarray and obj.dtype == object:  # type: ignore[attr-defined]
        out.append(T_OBJARRAY)
        _encode_objarray(obj, out, level, depth)  # type: ignore[arg-type]
    elif t is np.ndarray and not obj.dtype.hasobject:  # type: ignore[attr-defined]
        out.append(T_ARRAY)
        _encode_ndarray(obj, out)  # type: ignore[arg-type]
    elif isinstance(obj, np.generic) and not isinstance(obj, np.object_) and _NP_DTYPE_RE.match(obj.dtype.str):
        out.append(T_NPSCALAR)
        _encode_npscalar(obj, out)
    elif isinstance(obj, torch.Tensor) and (level < _PICKLE or _tensor_problem(obj) is None):
        out.append(T_TENSOR)
        _encode_tensor(obj, out)
    elif level and _is_image(obj) and (level < _PICKLE or _image_problem(obj) is None):
        out.append(T_IMAGE)
        _encode_image(obj, out)
    elif level >= _PICKLE:
        _encode_pickled(obj, out)
    else:
        raise _unsupported(obj)


def encode_value(obj: object, out: bytearray, allow_pickle: bool = False, _depth: int = 0) -> None:
    """Append the tagged encoding of ``obj`` to ``out``.

    Raises:
        UnsupportedTypeError: ``obj`` holds something that is not plain data and pickle is not allowed (or
            holds something that failed to encode, e.g. an object whose pickling raised). Nothing else is
            raised (but ``MemoryError``); ``out`` may then hold a partial encoding.
    """
    try:
        _encode(obj, out, _PICKLE if allow_pickle else _IMAGES, _depth)
    except (SyncRewardError, MemoryError):
        raise
    except RecursionError as e:
        raise UnsupportedTypeError("value nested too deeply (or self-referencing)") from e
    except Exception as e:
        raise _wrap_failure(e, f"a {_type_name(obj)}") from e


_SIZED_TAGS = frozenset({T_STR, T_BYTES, T_LIST, T_TUPLE, T_DICT, T_BIGINT, T_PICKLE})


def _truncated(r: _Reader, pos: int, n: int) -> CodecError:
    return CodecError(
        f"truncated or corrupt payload: {n} bytes declared at offset {pos}, {max(r.end - pos, 0)} available"
    )


def _decode(r: _Reader, depth: int) -> Any:
    # The common tags read the buffer in place (no method calls, no slices): this is the generic path's
    # inner loop. Every read is bounds-checked against r.end first.
    if depth > MAX_DEPTH:
        raise CodecError(f"corrupt payload: nested deeper than {MAX_DEPTH} levels")
    buf, pos, end = r.buf, r.pos, r.end
    if pos >= end:
        raise _truncated(r, pos, 1)
    tag = buf[pos]
    pos += 1
    if tag in _SIZED_TAGS:
        if pos + 8 > end:
            raise _truncated(r, pos, 8)
        n = _U64.unpack_from(buf, pos)[0]
        pos += 8
        if tag in (T_STR, T_BYTES):
            if n > end - pos:
                raise _truncated(r, pos, n)
            r.pos = pos + n
            if tag == T_BYTES:
                return bytes(buf[pos : pos + n])
            try:
                return str(buf[pos : pos + n], "utf-8", "surrogatepass")
            except UnicodeDecodeError as e:
                raise CodecError(f"corrupt payload: invalid UTF-8 ({e})") from None
        r.pos = pos
        if tag == T_DICT:
            if 2 * n > end - pos:
                raise CodecError(f"corrupt payload: {n} items declared but only {end - pos} bytes left")
            d: dict[Any, Any] = {}
            # The hashes of the keys that Python does not hash with a random seed (all but str and bytes):
            # ints that hash to themselves, so this set costs one probe per key whatever the keys are.
            hashes: set[int] | None = None
            collisions = 0
            for _ in range(n):
                k = _decode(r, depth + 1)
                if type(k) is not str and type(k) is not bytes:
                    try:
                        h = hash(k)
                    except TypeError:
                        raise CodecError("corrupt payload: unhashable dict key") from None
                    if hashes is None:
                        hashes = {h}
                    elif h not in hashes:
                        hashes.add(h)
                    elif (collisions := collisions + 1) > MAX_MAP_HASH_COLLISIONS:
                        raise CodecError(
                            f"corrupt or hostile payload: a dict with more than {MAX_MAP_HASH_COLLISIONS} keys "
                            "whose hashes collide (building it would take time quadratic in its size)"
                        )
                d[k] = _decode(r, depth + 1)
            if len(d) != n:
                raise CodecError("corrupt payload: duplicate dict key")
            return d
        if tag in (T_LIST, T_TUPLE):
            if n > end - pos:
                raise CodecError(f"corrupt payload: {n} items declared but only {end - pos} bytes left")
            items = [_decode(r, depth + 1) for _ in range(n)]
            return items if tag == T_LIST else tuple(items)
        r.pos = pos - 8  # T_BIGINT, T_PICKLE: below, with their length
    elif tag in (T_INT, T_FLOAT):
        if pos + 8 > end:
            raise _truncated(r, pos, 8)
        r.pos = pos + 8
        return (_I64 if tag == T_INT else _F64).unpack_from(buf, pos)[0]
    elif tag == T_NONE:
        r.pos = pos
        return None
    elif tag in (T_TRUE, T_FALSE):
        r.pos = pos
        return tag == T_TRUE
    else:
        r.pos = pos
    if tag == T_BIGINT:
        return _decode_bigint(r)
    if tag == T_ARRAY:
        return _decode_ndarray(r)
    if tag == T_OBJARRAY:
        return _decode_objarray(r, depth)
    if tag == T_NPSCALAR:
        return _decode_npscalar(r)
    if tag == T_TENSOR:
        return _decode_tensor(r)
    if tag == T_IMAGE:
        return _decode_image(r)
    if tag == T_PICKLE:
        return _decode_pickled(r)
    raise CodecError(f"corrupt payload: unknown tag {tag}")


def decode_value(buf: bytes | bytearray | memoryview, allow_pickle: bool = False) -> Any:
    """Decode one value written by :func:`encode_value`; the whole buffer must be consumed."""
    r = _Reader(memoryview(buf).cast("B"), allow_pickle)
    try:
        value = _decode(r, 0)
    except (ValueError, TypeError, struct.error, OverflowError, MemoryError, RuntimeError) as e:
        if isinstance(e, CodecError):
            raise
        raise CodecError(f"corrupt payload: {e}") from None
    if r.pos != r.end:
        raise CodecError(f"corrupt payload: {r.end - r.pos} trailing bytes")
    return value


# ------------------------------------------------------------------------------------------------- columns
# Each column encoding is a pair: ``_encode_<x>_column(values, out, level) -> bool`` appends the body and
# returns True, or returns False having written nothing when the column does not fit (the next encoding is
# tried); ``_decode_<x>_column(r)`` reads a body and returns the column's values. ``_COLUMN_ENCODINGS``, after
# the pairs, registers them.


def container_of(value: object) -> int | None:
    """Return the container code of a per-sample column, or ``None`` if ``value`` is not one.

    Lists, tuples, numpy arrays and tensors with a batch dimension are per-sample columns, and so is any
    other :class:`~collections.abc.Sequence` (a ``deque``, ``range``, ``array.array``, ...), which travels
    and is handed to the function as a list. Strings and bytes-like values are not (they are one value).
    """
    if isinstance(value, list):
        return C_LIST
    if isinstance(value, tuple):
        return C_TUPLE
    if isinstance(value, np.ndarray):
        return C_NDARRAY if value.ndim >= 1 else None
    if isinstance(value, torch.Tensor):
        return C_TENSOR if value.dim() >= 1 else None
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray, memoryview, UserString)):
        return C_LIST
    return None


# -- E_GENERIC: one tagged value per sample (any column the others do not take)


def _encode_generic_column(values: Sequence[Any], out: bytearray, level: int) -> bool:
    out += _U64.pack(len(values))
    for v in values:
        _encode(v, out, level, 1)
    return True


def _decode_generic_column(r: _Reader) -> list[Any]:
    n = r.u64()
    r.count(n, 1)
    return [_decode(r, 1) for _ in range(n)]


# -- E_STR: str samples, as byte lengths + one UTF-8 blob

# Strings at least this long on average are decoded one by one (one copy); shorter ones as one blob that
# is then sliced (fewer calls, but two copies).
_ROW_DECODE_MIN = 64


def _encode_lengths(lengths: list[int], out: bytearray) -> None:
    """Like :func:`_encode_ints` for a Python list of non-negative ints (string lengths): cheap when short."""
    hi = max(lengths, default=0)
    code = 0 if hi < 1 << 8 else 1 if hi < 1 << 16 else 2 if hi < 1 << 32 else 3
    out += _U8.pack(code)
    out += _PADDING[len(out) & 7]
    out += bytes(lengths) if code == 0 else _raw(np.array(lengths, dtype=_INT_DTYPES[code]))


def _encode_strs(values: Sequence[str], out: bytearray) -> None:
    """Byte lengths and the UTF-8 blob of a column of ``str`` (lone surrogates pass through)."""
    # short strings, or not much text: whole-column calls (join, one encode) beat one call per string
    if (nchars := sum(map(len, values))) < 256 * len(values) or nchars < 1 << 17:
        text = "".join(values)
        if text.isascii():
            _encode_lengths(list(map(len, values)), out)
            out += _PADDING[len(out) & 7]
            out += text.encode("ascii")
            return
    try:
        encoded = list(map(str.encode, values))
    except UnicodeEncodeError:  # a lone surrogate somewhere
        encoded = [s.encode("utf-8", "surrogatepass") for s in values]
    _encode_lengths(list(map(len, encoded)), out)
    out += _PADDING[len(out) & 7]
    for b in encoded:  # (long strings: appending each costs less than joining them first)
        out += b


def _decode_strs(r: _Reader, n: int) -> list[str]:
    """``n`` strings written by :func:`_encode_strs`."""
    _, offsets = _rows(r, n)
    r.align8()
    raw = r.take(offsets[-1])
    try:
        if len(raw) < _ROW_DECODE_MIN * n:  # short strings: one decode, then slices if all ASCII
            text = str(raw, "utf-8", "surrogatepass")
            if len(text) == len(raw):  # all ASCII (any other character takes 2-4 bytes): offsets are indices
                return [text[a:b] for a, b in pairwise(offsets)]
        return [str(raw[a:b], "utf-8", "surrogatepass") for a, b in pairwise(offsets)]
    except UnicodeDecodeError as e:
        raise CodecError(f"corrupt payload: invalid UTF-8 ({e})") from None


def _encode_str_column(values: Sequence[str], out: bytearray, level: int) -> bool:
    out += _U64.pack(len(values))
    _encode_strs(values, out)
    return True


def _decode_str_column(r: _Reader) -> list[str]:
    return _decode_strs(r, r.u64())


# -- E_F64, E_BOOL: float or bool samples, as one raw float64 or bool array


def _encode_fixed(values: Sequence[Any], out: bytearray, dtype: str) -> bool:
    """The count, padding and the raw values in ``dtype``."""
    out += _U64.pack(len(values))
    out += _PADDING[len(out) & 7]
    out += _raw(np.array(values, dtype=dtype))
    return True


def _take_fixed(r: _Reader, itemsize: int) -> memoryview:
    """The raw values written by :func:`_encode_fixed`, of ``itemsize`` bytes each."""
    n = r.u64()
    r.align8()
    r.count(n, itemsize)
    return r.take(n * itemsize)


def _encode_f64_column(values: Sequence[float], out: bytearray, level: int) -> bool:
    return _encode_fixed(values, out, "<f8")


def _decode_f64_column(r: _Reader) -> Any:
    return np.frombuffer(_take_fixed(r, 8), dtype="<f8").tolist()


def _encode_bool_column(values: Sequence[bool], out: bytearray, level: int) -> bool:
    return _encode_fixed(values, out, "|b1")


def _decode_bool_column(r: _Reader) -> Any:
    raw = _take_fixed(r, 1)
    if bytes(raw).translate(None, b"\x00\x01"):
        raise CodecError("corrupt payload: invalid bool")
    return np.frombuffer(raw, dtype="|b1").tolist()


# -- E_INT: int samples (within int64), as one integer array of the narrowest dtype


def _encode_int_column(values: Sequence[int], out: bytearray, level: int) -> bool:
    try:
        arr = np.array(values, dtype="<i8")
    except OverflowError:  # an int beyond int64: E_GENERIC
        return False
    out += _U64.pack(len(values))
    _encode_ints(arr, out)
    return True


def _decode_int_column(r: _Reader) -> Any:
    return r.ints(r.u64()).tolist()


# -- E_INTLISTS: lists of ints (token ids), as row lengths + one flat integer array of the narrowest dtype

# marshal (format version 2, no back-references) writes a list as b"[" + u32 count and an int of the
# int32 range as b"i" + i32: a list of lists of such ints is a run of 5-byte records.
_M_INT = ord("i")
# (checked once: an interpreter whose marshal writes otherwise takes the slower, equally exact path)
_MARSHAL_RECORDS = marshal.dumps([[1, -2], [True]], 2) == b"[\2\0\0\0[\2\0\0\0i\1\0\0\0i\xfe\xff\xff\xff[\1\0\0\0T"
# Rows at least this long on average are made one ``tolist()`` each; shorter ones are sliced out of one
# list of the whole column (a numpy call per row costs more than slicing a short list).
_ROW_TOLIST_MIN = 48


def _marshal_records(rows: list[Any], n: int) -> tuple[bytes, bytes] | None:
    """``rows`` as marshal records, with each record's type byte, if a list of lists of int32 ints.

    One ``marshal.dumps`` converts every value in C; then the output must be exactly ``1 + n + total``
    records of 5 bytes (``total``: the rows' lengths summed), whose type bytes (every 5th byte, one C
    slice) are ``n + 1`` list headers and ``total`` ints. That proves every element an exact ``int`` in the
    int32 range: records are read in order, so the first element that is not such an int starts at a type
    byte that is read, and is neither ``i`` (only an int32 writes ``i``, always 5 bytes) nor ``[`` (a list
    inside a row: one header too many). ``bool``, numpy integers, floats, strings, ``None``, nested lists
    and values beyond int32 all write other records. ``None`` otherwise.
    """
    try:
        m = marshal.dumps(rows, 2)
    except Exception:  # unmarshallable objects, too deep, ...: not a column of int lists
        return None
    total = sum(map(len, rows))
    if len(m) != 5 * (1 + n + total):
        return None
    tags = m[::5]
    if tags.count(b"[") != n + 1 or tags.count(b"i") != total:
        return None
    return m, tags


def _intlists_marshal(rows: list[Any], n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Row lengths and flat int32 values of a list of lists of ints in the int32 range, or ``None``."""
    got = _marshal_records(rows, n)
    if got is None:
        return None
    m, tags = got
    values = np.ndarray((len(tags),), dtype="<i4", buffer=m, offset=1, strides=(5,))
    is_int = np.frombuffer(tags, dtype=np.uint8) == _M_INT
    return np.fromiter(map(len, rows), dtype=np.int64, count=n), values[is_int]


def _intlists(rows: list[Any], n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Row lengths and flat values (int32 or int64) of a list of lists of ints, or ``None``."""
    first = next((row[0] for row in rows if row), 0)
    if type(first) is not int:  # e.g. lists of str: not worth a marshal pass
        return None
    got = _intlists_marshal(rows, n) if _MARSHAL_RECORDS else None
    if got is not None:
        return got
    if not set(map(type, chain.from_iterable(rows))) <= {int}:
        return None
    try:
        flat = np.fromiter(chain.from_iterable(rows), dtype="<i8")
    except OverflowError:
        return None
    return np.fromiter(map(len, rows), dtype=np.int64, count=n), flat


def _encode_intlists_column(values: Sequence[list[Any]], out: bytearray, level: int) -> bool:
    n = len(values)
    got = _intlists(values if type(values) is list else list(values), n)
    if got is None:
        return False
    lengths, flat = got
    out += _U64.pack(n)
    _encode_ints(lengths, out, _ROW_LENGTH_MIN_CODE)
    _encode_ints(flat, out)
    return True


def _decode_intlists_column(r: _Reader) -> list[list[int]]:
    n = r.u64()
    _, offsets = _rows(r, n, _ROW_LENGTH_MIN_CODE)
    flat = r.ints(offsets[-1])
    if n and offsets[-1] >= _ROW_TOLIST_MIN * n:
        return [flat[a:b].tolist() for a, b in pairwise(offsets)]
    items = flat.tolist()
    return [items[a:b] for a, b in pairwise(offsets)]


# -- E_RECORDS: lists of dicts of str (chat messages), as row lengths, the keys, one string column per key


def _encode_records_column(rows: Sequence[list[Any]], out: bytearray, level: int) -> bool:
    """Encode a column of lists of dicts that share one tuple of str keys and hold only str values.

    That is a chat-format column -- TRL's conversational ``prompts`` and ``completions``, e.g.
    ``[[{"role": "assistant", "content": "..."}], ...]`` -- written as row lengths, the keys, and one string
    column per key. Returns False (writing nothing) for anything else.
    """
    records = list(chain.from_iterable(rows))
    if not records or set(map(type, records)) != {dict}:
        return False
    keys = tuple(records[0])
    if not 0 < len(keys) <= _MAX_RECORD_KEYS or set(map(type, keys)) != {str} or set(map(tuple, records)) != {keys}:
        return False
    columns = [list(map(itemgetter(k), records)) for k in keys]
    if any(set(map(type, col)) != {str} for col in columns):
        return False
    n = len(rows)
    mark = len(out)
    out += _U64.pack(n)
    _encode_ints(np.fromiter(map(len, rows), dtype=np.int64, count=n), out, _ROW_LENGTH_MIN_CODE)
    out += _PADDING[len(out) & 7]
    out += _U64.pack(len(keys))
    _encode_strs(keys, out)
    for col in columns:
        out += _PADDING[len(out) & 7]
        _encode_strs(col, out)
    if len(records) * _RECORD_MIN_BYTES > len(out) - mark:  # records of (nearly) empty strings: see the limits
        del out[mark:]
        return False
    return True


def _decode_records_column(r: _Reader) -> list[list[dict[str, str]]]:
    start = r.pos
    n = r.u64()
    _, offsets = _rows(r, n, _ROW_LENGTH_MIN_CODE)
    total = offsets[-1]
    if total * _RECORD_MIN_BYTES > r.end - start:
        raise CodecError(f"corrupt payload: {total} records declared in {r.end - start} bytes")
    r.align8()
    nkeys = r.u64()
    if not 0 < nkeys <= _MAX_RECORD_KEYS:
        raise CodecError(f"corrupt payload: records of {nkeys} keys")
    keys = _decode_strs(r, nkeys)
    if len(set(keys)) != nkeys:
        raise CodecError("corrupt payload: duplicate record keys")
    columns = []
    for _ in keys:
        r.align8()
        columns.append(_decode_strs(r, total))
    records = [dict(zip(keys, row, strict=True)) for row in zip(*columns, strict=True)]
    return [records[a:b] for a, b in pairwise(offsets)]


# -- E_ARRAY, E_TENSOR, E_OBJARRAY: an array or tensor column as one value (T_ARRAY, T_TENSOR, T_OBJARRAY)


def _batched(column: Any) -> Any:
    if column.ndim == 0:
        raise CodecError("corrupt payload: a column array without a batch dimension")
    return column


def _encode_array_column(values: np.ndarray, out: bytearray, level: int) -> bool:
    """A numpy array of a plain dtype; False for an object array (E_OBJARRAY, or its items as a list)."""
    if isinstance(values, np.ma.MaskedArray):
        raise _unsupported(values)
    if values.dtype.hasobject:  # an object array is a list of Python objects in disguise
        if values.dtype != object:
            raise UnsupportedTypeError(f"numpy arrays of dtype {values.dtype} are not supported")
        return False
    _encode_ndarray(values, out)
    return True


def _decode_array_column(r: _Reader) -> np.ndarray:
    return _batched(_decode_ndarray(r))  # type: ignore[no-any-return]


def _encode_tensor_column(values: torch.Tensor, out: bytearray, level: int) -> bool:
    _encode_tensor(values, out)
    return True


def _decode_tensor_column(r: _Reader) -> torch.Tensor:
    return _batched(_decode_tensor(r))  # type: ignore[no-any-return]


def _encode_objarray_column(values: np.ndarray, out: bytearray, level: int) -> bool:
    """An object array of two dimensions or more (it keeps its shape: a (n, 2) array of str comes back (n, 2))."""
    if values.dtype != object or values.ndim <= 1:  # one dimension: its items, in the list encodings
        return False
    _encode_objarray(values, out, level, 0)
    return True


def _decode_objarray_column(r: _Reader) -> np.ndarray:
    return _batched(_decode_objarray(r, 0))  # type: ignore[no-any-return]


# -- the registry

# The containers a column of the list encodings may have been passed as: a 1-D object array travels as its items.
_SEQUENCE_CONTAINERS = frozenset({C_LIST, C_TUPLE, C_NDARRAY})


class _ColumnEncoding:
    """One column encoding: its encode and decode functions, and the columns it is tried on.

    ``container`` (C_NDARRAY, C_TENSOR): tried on every column passed as that container, which is then the
    only one a frame may declare it with. ``sample_type``: tried on list and tuple columns (and 1-D object
    arrays, as lists) whose samples all are of exactly this type. Neither: E_GENERIC, which takes any column.
    Encodings tried on the same columns are tried in code order.
    """

    __slots__ = ("container", "containers", "decode", "encode", "sample_type")

    def __init__(
        self,
        encode: Callable[[Any, bytearray, int], bool],
        decode: Callable[[_Reader], Any],
        *,
        container: int | None = None,
        sample_type: type | None = None,
    ) -> None:
        self.encode = encode
        self.decode = decode
        self.container = container
        self.sample_type = sample_type
        self.containers = _SEQUENCE_CONTAINERS if container is None else frozenset({container})


_COLUMN_ENCODINGS: dict[int, _ColumnEncoding] = {
    E_GENERIC: _ColumnEncoding(_encode_generic_column, _decode_generic_column),
    E_STR: _ColumnEncoding(_encode_str_column, _decode_str_column, sample_type=str),
    E_F64: _ColumnEncoding(_encode_f64_column, _decode_f64_column, sample_type=float),
    E_INT: _ColumnEncoding(_encode_int_column, _decode_int_column, sample_type=int),
    E_BOOL: _ColumnEncoding(_encode_bool_column, _decode_bool_column, sample_type=bool),
    E_INTLISTS: _ColumnEncoding(_encode_intlists_column, _decode_intlists_column, sample_type=list),
    E_ARRAY: _ColumnEncoding(_encode_array_column, _decode_array_column, container=C_NDARRAY),
    E_TENSOR: _ColumnEncoding(_encode_tensor_column, _decode_tensor_column, container=C_TENSOR),
    E_OBJARRAY: _ColumnEncoding(_encode_objarray_column, _decode_objarray_column, container=C_NDARRAY),
    E_RECORDS: _ColumnEncoding(_encode_records_column, _decode_records_column, sample_type=list),
}

_Tried = dict[Any, tuple[tuple[int, Callable[[Any, bytearray, int], bool]], ...]]


def _tried_on(attribute: str) -> _Tried:
    """``{container or sample type: ((code, encode), ...)}``, in code order, from ``_COLUMN_ENCODINGS``."""
    tried: _Tried = {}
    for code, encoding in sorted(_COLUMN_ENCODINGS.items()):
        key = getattr(encoding, attribute)
        if key is not None:
            tried[key] = (*tried.get(key, ()), (code, encoding.encode))
    return tried


_TRIED_ON_CONTAINER = _tried_on("container")
_TRIED_ON_SAMPLE_TYPE = _tried_on("sample_type")


def _encode_column_body(values: Any, container: int, out: bytearray, level: int) -> int:
    """Append a column body to ``out``; return the encoding used (see :class:`_ColumnEncoding`).

    ``level``: ``_PLAIN`` (or False), ``_IMAGES`` or ``_PICKLE``: what the column may hold besides plain data.
    """
    for code, encode in _TRIED_ON_CONTAINER.get(container, ()):
        if encode(values, out, level):
            return code
    if container == C_NDARRAY:  # an object array of one dimension: its items
        values = values.tolist()
    elif not isinstance(values, (list, tuple)):  # another Sequence (deque, range, array.array, ...)
        values = list(values)
    types = set(map(type, values))
    if len(types) == 1:
        for code, encode in _TRIED_ON_SAMPLE_TYPE.get(next(iter(types)), ()):
            if encode(values, out, level):
                return code
    _encode_generic_column(values, out, level)
    return E_GENERIC


_SCALARS = frozenset({str, float, int, bool, type(None), bytes})


def _ints_fit(values: Any) -> bool:
    """Whether every ``int`` among ``values`` has at most ``_MAX_BIGINT_DIGITS`` digits (what the encoder takes)."""
    ints = [v for v in values if type(v) is int]
    try:
        np.array(ints, dtype=np.int64)  # the common case, in one C pass
        return True
    except OverflowError:
        pass
    for v in ints:
        bits = v.bit_length()
        if bits > 3.33 * _MAX_BIGINT_DIGITS:  # past 10 ** _MAX_BIGINT_DIGITS whatever the rounding
            return False
        if bits > 3.32 * _MAX_BIGINT_DIGITS and len(str(abs(v))) > _MAX_BIGINT_DIGITS:
            return False
    return True


def is_plain(values: Any, container: int) -> bool:
    """Whether a column can travel without pickle (cheap type checks for the common shapes)."""
    if container == C_TENSOR:
        return _tensor_problem(values) is None
    if container == C_NDARRAY and isinstance(values, np.ma.MaskedArray):
        return False
    if container == C_NDARRAY and not values.dtype.hasobject:
        return _array_problem(values) is None
    try:
        types = set(map(type, values))
        if types <= _SCALARS:
            return int not in types or _ints_fit(values)
        if types == {list}:
            # token ids: one marshal pass proves every element an exact int (2x faster than the type set)
            first = next((row[0] for row in values if row), None)
            token_ids = type(first) is int and type(values) is list and _MARSHAL_RECORDS
            if token_ids and _marshal_records(values, len(values)) is not None:
                return True
            inner = set(map(type, chain.from_iterable(values)))
            if inner <= _SCALARS:
                return int not in inner or _ints_fit(chain.from_iterable(values))
        _encode_column_body(values, container, bytearray(), _PLAIN)
    except Exception:
        return False
    return True


# -------------------------------------------------------------------------------------------------- frames


class Column:
    """A per-sample column: its name, how it was passed (container code) and its values."""

    __slots__ = ("container", "name", "values")

    def __init__(self, name: str, container: int, values: Any) -> None:
        self.name = name
        self.container = container
        self.values = values


def encode_frame(
    columns: Sequence[Column],
    nrows: int,
    *,
    allow_pickle: bool = False,
    meta: object = None,
    out: bytearray | None = None,
    droppable: frozenset[str] = frozenset(),
    dropped: list[str] | None = None,
    function: str | None = None,
    results: Sequence[Any] | None = None,
) -> bytearray:
    """Encode ``columns`` (each ``nrows`` long) and an optional generic ``meta`` value as one frame.

    A column named in ``droppable`` that holds non-plain data is left out (never pickled) and its name
    appended to ``dropped`` instead of raising. ``function``: the reward whose inputs the columns are (its
    name goes into the hint of a column the wire cannot carry), or whose result they are. ``results``: the
    columns are ``function``'s result, and these are its dict's keys (empty: a single result); a message names a
    column as the user knows it, ``results['acc']`` or ``its result``, not by its position on the wire.

    Raises:
        UnsupportedTypeError: a column (not in ``droppable``) or ``meta`` holds something the wire format
            cannot carry; the message names the column (or the part of the result: ``results``).
    """
    out = bytearray() if out is None else out
    start = len(out)
    if start % 8:
        raise ValueError("frames must start 8-byte aligned")
    out += MAGIC
    out += _U32.pack(len(columns))
    out += _U64.pack(nrows)
    ncols_at = start + 4
    ncols = 0
    for col in columns:
        mark = len(out)
        name = col.name.encode("utf-8", "surrogatepass")
        out += _U32.pack(len(name))
        out += name
        out += _U8.pack(col.container)
        enc_at = len(out)
        out.append(0)
        out += _PADDING[len(out) & 7]
        len_at = len(out)
        out += bytes(8)
        body_at = len(out)
        drop = col.name in droppable
        try:
            level = _PLAIN if drop else _PICKLE if allow_pickle else _IMAGES
            out[enc_at] = _encode_column_body(col.values, col.container, out, level)
        except MemoryError:
            del out[mark:]
            raise
        except Exception as e:
            del out[mark:]
            if drop:
                if dropped is not None:
                    dropped.append(col.name)
                continue
            if results is not None and (isinstance(e, UnsupportedTypeError) or not isinstance(e, SyncRewardError)):
                label = f"results[{results[int(col.name)]!r}]" if results else "its result"
                raise _unsendable_result(e, label, function) from e
            if isinstance(e, UnsupportedTypeError):
                kind = getattr(e, "unsupported_type", None)
                text = _plain_only(kind, col.name, function) if kind is not None and function is not None else e
                raise UnsupportedTypeError(f"column {col.name!r}: {text}") from e
            if isinstance(e, SyncRewardError):
                raise
            if isinstance(e, RecursionError):
                raise UnsupportedTypeError(f"column {col.name!r}: a value nested too deeply") from e
            raise _wrap_failure(e, f"column {col.name!r}") from e
        out[len_at:body_at] = _U64.pack(len(out) - body_at)
        out += _PADDING[len(out) & 7]
        ncols += 1
    out[ncols_at : ncols_at + 4] = _U32.pack(ncols)
    if meta is None:
        out.append(0)
    else:
        out.append(1)
        encode_value(meta, out, allow_pickle)
    out += _PADDING[len(out) & 7]
    return out


def decode_frame(
    buf: bytes | bytearray | memoryview,
    *,
    allow_pickle: bool = False,
    skip: frozenset[str] = frozenset(),
) -> tuple[int, list[Column], Any]:
    """Decode one frame. Returns ``(nrows, columns, meta)``; columns named in ``skip`` are not decoded.

    Raises:
        CodecError: the buffer is not a valid frame.
    """
    r = _Reader(memoryview(buf).cast("B"), allow_pickle)
    try:
        if bytes(r.take(4)) != MAGIC:
            raise CodecError("not a syncreward payload (bad magic); ranks may run different syncreward versions")
        ncols = r.count(r.u32(), 16)
        nrows = r.u64()
        if nrows > MAX_UNBACKED_ROWS and nrows > r.end:
            raise CodecError(f"corrupt payload: {r.end} bytes declare {nrows} rows")
        cols: list[Column] = []
        buf, end = r.buf, r.end
        for _ in range(ncols):
            # a column's head (name length, name, container, encoding, padding, body length), read in place:
            # every read bounds-checked against ``end`` first, as ``_Reader``'s methods do
            pos = r.pos
            if pos + 4 > end:
                raise _truncated(r, pos, 4)
            name_len = _U32.unpack_from(buf, pos)[0]
            pos += 4
            if name_len > end - pos:
                raise _truncated(r, pos, name_len)
            try:
                name = str(buf[pos : pos + name_len], "utf-8", "surrogatepass")
            except UnicodeDecodeError:
                raise CodecError("corrupt payload: invalid column name") from None
            pos += name_len
            if pos + 2 > end:
                raise _truncated(r, pos, 2)
            container, enc = buf[pos], buf[pos + 1]
            if container not in CONTAINERS:
                raise CodecError(f"corrupt payload: unknown container {container}")
            encoding = _COLUMN_ENCODINGS.get(enc)
            if encoding is None or container not in encoding.containers:
                raise CodecError(f"corrupt payload: column encoding {enc} does not fit container {container}")
            pos = (pos + 2 + 7) & ~7
            if pos + 8 > end:
                raise _truncated(r, pos, 8)
            body_len = _U64.unpack_from(buf, pos)[0]
            pos += 8
            body_end = pos + body_len
            if body_len > end - pos:
                raise CodecError("truncated or corrupt payload: a column runs past the end of the payload")
            if name not in skip:
                r.pos, r.end = pos, body_end  # the column's decoder reads its body only
                try:
                    values = encoding.decode(r)
                finally:
                    r.end = end
                if r.pos != body_end:
                    raise CodecError(f"corrupt payload: column {name!r} body has trailing bytes")
                n = len(values)
                if n != nrows:
                    raise CodecError(f"corrupt payload: column {name!r} has {n} rows, the payload declares {nrows}")
                cols.append(Column(name, container, values))
            r.pos = body_end
            r.align8()
        meta = _decode(r, 0) if r.u8() else None
        r.align8()
    except CodecError:
        raise
    except (ValueError, TypeError, struct.error, OverflowError, MemoryError, RuntimeError) as e:
        raise CodecError(f"corrupt payload: {e}") from None
    if r.pos != r.end:
        raise CodecError(f"corrupt payload: {r.end - r.pos} trailing bytes after its columns")
    return nrows, cols, meta
