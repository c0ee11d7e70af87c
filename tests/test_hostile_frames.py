"""Hostile frames: what a peer sends costs work and memory in proportion to its bytes, and bad values are refused.

Each case crafts a frame (or patches a valid ``encode_frame``/``encode_value`` output) the way a corrupted or
hostile peer could, and checks that decoding raises :class:`~syncreward.CodecError` at once -- never a
quadratic dict build, a huge allocation, or a value that crashes the interpreter when used.
"""

from __future__ import annotations

import struct
import time
import tracemalloc
from typing import Any

import numpy as np
import pytest

from syncreward import CodecError
from syncreward._codec import (
    C_LIST,
    C_NDARRAY,
    MAX_MAP_HASH_COLLISIONS,
    MAX_UNBACKED_ROWS,
    T_DICT,
    T_NONE,
    T_STR,
    Column,
    decode_frame,
    decode_value,
    encode_frame,
    encode_value,
)

P = 2**61 - 1  # hash(k * P) == 0 for every int k


def _dict_of_int_keys(keys: list[int]) -> bytes:
    """A tagged dict {k: None for k in keys}, written by hand (building it in Python is what is slow)."""
    out = bytearray(struct.pack("<BQ", T_DICT, len(keys)))
    for k in keys:
        encode_value(k, out)  # (k * P beyond int64: a bigint, as decimal text)
        out.append(T_NONE)
    return bytes(out)


def _encoded(value: Any) -> bytes:
    out = bytearray()
    encode_value(value, out)
    return bytes(out)


def _patch_rows(frame: bytes, dname: bytes, rows: int) -> bytes:
    """A frame of one array column with its row count and its array's first dimension set to ``rows``."""
    at = frame.index(dname) + len(dname) + 1  # the dtype name, the ndim byte, then the dims
    frame = frame[:at] + struct.pack("<Q", rows) + frame[at + 8 :]
    return frame[:8] + struct.pack("<Q", rows) + frame[16:]


def _timed(fn: Any, *args: Any) -> tuple[float, float]:
    """Seconds and peak traced MiB of ``fn(*args)``, which must raise CodecError."""
    tracemalloc.start()
    t = time.perf_counter()
    try:
        with pytest.raises(CodecError):
            fn(*args)
        return time.perf_counter() - t, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


# ------------------------------------------------------------------------------------------ dict keys


def test_dict_of_colliding_int_keys_is_refused_in_linear_time() -> None:
    frame = _dict_of_int_keys([k * P for k in range(1, 20_001)])  # 20k keys, all of hash 0: took 8.8 s before
    t = time.perf_counter()
    with pytest.raises(CodecError, match="collide"):
        decode_value(frame)
    assert time.perf_counter() - t < 2.0  # refused after the 34th key: about 1 ms


def test_dict_of_colliding_keys_in_a_frame_column_is_refused() -> None:
    hostile = _dict_of_int_keys([k * P for k in range(1, 2001)])
    frame = bytearray(b"SRW2" + struct.pack("<IQ", 1, 1))  # one column, one row
    frame += struct.pack("<I", 1) + b"d" + bytes([C_LIST, 0])  # container list, encoding generic
    frame += bytes(-len(frame) % 8)
    body = struct.pack("<Q", 1) + hostile
    frame += struct.pack("<Q", len(body)) + body
    frame += bytes(-len(frame) % 8) + b"\x00"  # no meta
    frame += bytes(-len(frame) % 8)
    with pytest.raises(CodecError, match="collide"):
        decode_frame(bytes(frame))
    honest = bytes(frame).replace(hostile, _dict_of_int_keys([k * P for k in range(1, 2001)][::-1]))
    with pytest.raises(CodecError, match="collide"):  # (the order does not matter)
        decode_frame(honest)


def test_a_few_colliding_keys_still_decode() -> None:
    honest = {-1: "a", -2: "b", 0: "c", P: "d"}  # hash(-1) == hash(-2), hash(P) == hash(0)
    assert decode_value(_encoded(honest)) == honest
    keys = [k * P for k in range(1, MAX_MAP_HASH_COLLISIONS + 2)]  # exactly the limit of collisions
    assert list(decode_value(_dict_of_int_keys(keys))) == keys
    with pytest.raises(CodecError, match="collide"):
        decode_value(_dict_of_int_keys([*keys, len(keys) * P]))


def test_non_string_keys_still_round_trip() -> None:
    d = {3: "c", 1.5: "a", (2, 2): "b", "z": 0, None: None, b"k": 1, np.int64(7): 2, True: 3}
    back = decode_value(_encoded(d))
    assert back == d
    assert list(back) == list(d)


@pytest.mark.parametrize(
    "frame",
    [
        _dict_of_int_keys([5, 5]),
        struct.pack("<BQ", T_DICT, 2) + (struct.pack("<BQ", T_STR, 1) + b"k" + bytes([T_NONE])) * 2,
    ],
    ids=["int", "str"],
)
def test_duplicate_dict_keys_are_refused(frame: bytes) -> None:
    with pytest.raises(CodecError, match="duplicate dict key"):
        decode_value(frame)


def test_unhashable_dict_key_is_refused() -> None:
    frame = bytearray(_encoded({(1, 2): None}))
    frame[frame.index(bytes([9]))] = 8  # T_TUPLE -> T_LIST: the key becomes a list
    with pytest.raises(CodecError, match="unhashable"):
        decode_value(bytes(frame))


# ------------------------------------------------------------------------------------ numpy unicode


def _bad_unicode(value: Any, *, big: bool = False) -> bytes:
    """The encoding of ``value`` (holding "ab") with "a" overwritten by 0x110000, which is no code point."""
    buf = _encoded(value) if not isinstance(value, Column) else bytes(encode_frame([value], len(value.values)))
    a = "a".encode("utf-32-be" if big else "utf-32-le")
    bad = (0x110000).to_bytes(4, "big" if big else "little")
    assert buf.count(a) == 1
    return buf.replace(a, bad)


@pytest.mark.parametrize(
    "value",
    [np.array(["ab", "c"]), np.array(["ab"], dtype=">U2"), np.str_("ab"), np.array([["ab"]]), [np.str_("ab")]],
    ids=["array", "big-endian", "scalar", "2-d", "in-a-list"],
)
def test_unicode_beyond_the_last_code_point_is_refused(value: Any) -> None:
    big = isinstance(value, np.ndarray) and value.dtype.byteorder == ">"
    with pytest.raises(CodecError, match="U\\+10FFFF"):
        decode_value(_bad_unicode(value, big=big))


def test_unicode_array_column_beyond_the_last_code_point_is_refused() -> None:
    with pytest.raises(CodecError, match="U\\+10FFFF"):
        decode_frame(_bad_unicode(Column("u", C_NDARRAY, np.array(["ab", "cd"]))))


def test_unicode_with_lone_surrogates_and_the_last_code_point_still_round_trips() -> None:
    a = np.array(["\ud800x", "\U0010ffff", ""])
    back = decode_value(_encoded(a))
    assert back.dtype == a.dtype
    assert back.tolist() == a.tolist()
    assert decode_value(_encoded(np.str_("\udfff"))) == np.str_("\udfff")


# ------------------------------------------------------------------------------------- row counts


def test_frame_announcing_more_rows_than_its_bytes_is_refused_at_once() -> None:
    frame = bytes(encode_frame([], 16))
    hostile = frame[:8] + struct.pack("<Q", 20_000_000) + frame[16:]
    seconds, peak = _timed(decode_frame, hostile)
    assert seconds < 0.5
    assert peak < 1


def test_zero_width_array_column_announcing_millions_of_rows_is_refused() -> None:
    frame = bytes(encode_frame([Column("x", C_NDARRAY, np.zeros((16, 0)))], 16))
    assert decode_frame(frame)[1][0].values.shape == (16, 0)
    hostile = _patch_rows(frame, b"<f8", 20_000_000)
    seconds, peak = _timed(decode_frame, hostile)
    assert seconds < 0.5
    assert peak < 1


@pytest.mark.parametrize("shape", [(2**40,), (2**20, 2**20, 0), (0, 2**62)], ids=str)
def test_zero_size_array_of_huge_dimensions_is_refused(shape: tuple[int, ...]) -> None:
    buf = _encoded(np.zeros((3, 0), dtype=np.uint8) if len(shape) > 1 else np.array([], dtype="<U1"))
    # rewrite the shape: ndim byte, then the dims
    dname = b"|u1" if len(shape) > 1 else b"<U1"
    at = buf.index(dname) + len(dname)
    old_ndim = buf[at]
    new = bytes([len(shape)]) + b"".join(struct.pack("<Q", s) for s in shape)
    rest = buf[at + 1 + 8 * old_ndim :]
    rest = rest.lstrip(b"\x00")  # the padding before the (empty) data
    head = buf[:at] + new
    hostile = head + bytes(-len(head) % 8) + rest
    with pytest.raises(CodecError):
        decode_value(hostile)


def test_honest_frames_of_rows_without_bytes_still_decode() -> None:
    assert decode_frame(bytes(encode_frame([], MAX_UNBACKED_ROWS)))[0] == MAX_UNBACKED_ROWS
    values = np.zeros((MAX_UNBACKED_ROWS, 0), dtype=np.float32)
    nrows, cols, _ = decode_frame(bytes(encode_frame([Column("x", C_NDARRAY, values)], len(values))))
    assert nrows == len(values)
    assert cols[0].values.shape == values.shape
    assert decode_value(_encoded(np.zeros((3, 0, 5)))).shape == (3, 0, 5)


def test_a_column_of_integers_past_the_digit_limit_is_not_plain() -> None:
    """A kwargs-only column of them is left behind, not refused at encode (found by the column fuzzer)."""
    from syncreward._codec import C_LIST, is_plain

    assert not is_plain([1 << 16610], C_LIST)
    assert not is_plain([[1, 1 << 16610]], C_LIST)
    assert is_plain([10**4300 - 1, 3], C_LIST)  # 4300 digits: still carried
