"""The wire codec: exact round trips of every supported type, the column fast paths, and no code on the wire."""

from __future__ import annotations

import array
import collections
import math
import pickle
import struct
import threading
import types
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import same

import syncreward
from syncreward import CodecError, UnsupportedTypeError, synced_reward
from syncreward._batch import CPU, concat, take
from syncreward._binding import Binder
from syncreward._codec import (
    _INT_DTYPES,
    C_LIST,
    C_NDARRAY,
    C_TENSOR,
    C_TUPLE,
    E_BOOL,
    E_F64,
    E_GENERIC,
    E_INT,
    E_INTLISTS,
    E_OBJARRAY,
    E_RECORDS,
    E_STR,
    MAX_DEPTH,
    Column,
    _encode_column_body,
    _narrow,
    container_of,
    decode_frame,
    decode_value,
    encode_frame,
    encode_value,
    is_image_column,
    is_plain,
)

# --------------------------------------------------------------------------------------------- helpers


def roundtrip(value: Any, **kwargs: Any) -> Any:
    out = bytearray()
    encode_value(value, out, **kwargs)
    return decode_value(bytes(out), **kwargs)


def frame_roundtrip(values: Any, container: int) -> tuple[int, Column]:
    """Encode one column in a frame, decode it; return the encoding used and the decoded column."""
    body = bytearray()
    enc = _encode_column_body(values, container, body, False)
    frame = encode_frame([Column("col", container, values)], len(values))
    assert len(frame) % 8 == 0
    nrows, cols, meta = decode_frame(bytes(frame))
    assert nrows == len(values)
    assert meta is None
    assert len(cols) == 1
    assert cols[0].name == "col"
    assert cols[0].container == container
    return enc, cols[0]


# --------------------------------------------------------------------------------------------- values

BIG = [2**63 - 1, -(2**63), 2**63, -(2**63) - 1, 2**64, 10**100, -(10**300), 3**2000]
SCALARS: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    *BIG,
    0.0,
    -0.0,
    1.5,
    -1e-310,
    1e308,
    math.inf,
    -math.inf,
    math.nan,
    float.fromhex("0x1.fffffffffffffp+1023"),
    "",
    "ascii",
    "é漢字🎉",
    "\x00nul\x00",
    "lone surrogates \ud800 \udfff",
    "\U0010ffff",
    b"",
    b"\x00\xff" * 10,
]
NUMPY_SCALARS: list[Any] = [
    np.int8(-5),
    np.uint8(255),
    np.int16(-300),
    np.uint16(65535),
    np.int32(-(2**31)),
    np.uint32(2**32 - 1),
    np.int64(-(2**63)),
    np.uint64(2**64 - 1),
    np.float16(1.5),
    np.float32(-0.0),
    np.float64(math.nan),
    np.complex64(1 - 2j),
    np.complex128(math.inf + 1j),
    np.bool_(True),
    np.bool_(False),
    np.str_("héllo"),
    np.bytes_(b"\x00ab"),
    np.str_(""),  # dtype <U0: no bytes at all
    np.bytes_(b""),
]
CONTAINERS: list[Any] = [
    [],
    (),
    {},
    [None],
    (1,),
    [1, (2, [3, {"a": None}])],
    ((), [], {}),
    [[[[]]]],
    {"a": 1, 2: "b", None: [1.5], 2.5: (True, False), (1, "x"): b"y", "": {"nested": {"deep": [0]}}},
    {True: 1, 0: 2},  # bool and int keys that differ (True == 1 but 0 is False-valued, not a clash)
    [True, 1, 1.0, "1", b"1", None, np.int64(1), np.bool_(True)],
]


@pytest.mark.parametrize("value", SCALARS + NUMPY_SCALARS + CONTAINERS, ids=repr)
def test_values_round_trip_exactly(value: Any) -> None:
    assert same(roundtrip(value), value)


def test_bool_is_not_int_and_tuple_is_not_list() -> None:
    back = roundtrip([True, 1, (1,), [1]])
    assert [type(x) for x in back] == [bool, int, tuple, list]
    assert type(roundtrip(np.bool_(True))) is np.bool_


def test_non_string_dict_keys_and_key_order_survive() -> None:
    d = {3: "c", 1: "a", (2, 2): "b", "z": 0, None: None}
    assert list(roundtrip(d)) == list(d)


ARRAYS: list[np.ndarray] = [
    np.arange(12, dtype=np.int64).reshape(3, 4),
    np.arange(12, dtype=">i4").reshape(2, 6),  # big endian stays big endian
    np.array([math.nan, -0.0, math.inf], dtype=np.float32),
    np.array([1 + 2j, math.nan], dtype=np.complex128),
    np.array([True, False]),
    np.array(["a", "héllo", ""], dtype="<U5"),
    np.array([b"a\x00", b"bc"], dtype="|S2"),
    np.zeros((0,), dtype=np.float64),
    np.zeros((2, 0, 3), dtype=np.uint8),
    np.array(7, dtype=np.int16),  # 0-d
    np.arange(20, dtype=np.float64)[::3],  # not contiguous
    np.asfortranarray(np.arange(6, dtype=np.int32).reshape(2, 3)),
    np.arange(4, dtype=np.float16),
]


@pytest.mark.parametrize("array", ARRAYS, ids=lambda a: f"{a.dtype.str}{a.shape}")
def test_numpy_arrays_round_trip_exactly(array: np.ndarray) -> None:
    back = roundtrip(array)
    assert same(back, array)
    assert back.flags.writeable
    assert back.flags.c_contiguous


TENSORS: list[torch.Tensor] = [
    torch.arange(6, dtype=torch.float32).reshape(2, 3),
    torch.tensor([1.5, -0.0, math.inf, math.nan], dtype=torch.bfloat16),
    torch.tensor([1.0, 65504.0], dtype=torch.float16),
    torch.tensor([True, False, True]),
    torch.tensor([-128, 127], dtype=torch.int8),
    torch.tensor([0, 255], dtype=torch.uint8),
    torch.tensor([-(2**63), 2**63 - 1], dtype=torch.int64),
    torch.tensor([1 + 1j], dtype=torch.complex64),
    torch.zeros((0, 3), dtype=torch.bfloat16),
    torch.zeros((0,), dtype=torch.bool),
    torch.tensor(3.25),  # 0-d
    torch.arange(12, dtype=torch.float64).reshape(3, 4).T,  # not contiguous
    torch.ones(3, requires_grad=True),
]


@pytest.mark.parametrize("tensor", TENSORS, ids=lambda t: f"{t.dtype}{tuple(t.shape)}")
def test_tensors_round_trip_exactly(tensor: torch.Tensor) -> None:
    back = roundtrip(tensor)
    assert same(back, tensor.detach().contiguous())
    assert not back.requires_grad


def test_unsupported_values_are_refused_with_a_hint() -> None:
    class Opaque:
        pass

    for value in (
        Opaque(),
        {1, 2},
        frozenset(),
        1 + 2j,
        bytearray(b"x"),
        np.datetime64("2020-01-01"),
        np.array([object()], dtype=object),
        np.zeros(2, dtype=[("a", "<i4")]),
        [1, [Opaque()]],
    ):
        with pytest.raises(UnsupportedTypeError, match=r"allow_pickle|not supported"):
            encode_value(value, bytearray())
    with pytest.raises(UnsupportedTypeError, match="4300 digits"):
        encode_value(10**5000, bytearray())
    if hasattr(torch, "float8_e4m3fn"):
        with pytest.raises(UnsupportedTypeError):
            encode_value(torch.zeros(2, dtype=torch.float8_e4m3fn), bytearray())


def test_nesting_is_bounded_on_both_sides() -> None:
    deep: Any = []
    for _ in range(MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(UnsupportedTypeError, match="nested"):
        encode_value(deep, bytearray())
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(UnsupportedTypeError, match="self-referencing"):
        encode_value(loop, bytearray())
    ok: Any = []
    for _ in range(MAX_DEPTH):
        ok = [ok]
    assert same(roundtrip(ok), ok)
    # a hand-made payload nested deeper than the limit: list tag, count 1, ... (no recursion error)
    payload = struct.pack("<BQ", 8, 1) * (MAX_DEPTH + 50) + b"\x00"
    with pytest.raises(CodecError, match="nested"):
        decode_value(payload)


def test_trailing_bytes_are_an_error() -> None:
    out = bytearray()
    encode_value([1, 2], out)
    with pytest.raises(CodecError, match="trailing"):
        decode_value(bytes(out) + b"\x00")


# --------------------------------------------------------------------------------------------- columns

FAST_PATHS: list[tuple[str, Any, int, int]] = [
    ("str", ["a", "", "héllo", "漢字", "\ud800x", "x" * 1000], C_LIST, E_STR),
    ("str-ascii", ["a", "bb", ""], C_LIST, E_STR),
    ("str-short-utf8", ["é", "漢", "a", "\udcff"], C_LIST, E_STR),
    ("str-short-utf8-no-surrogate", ["é", "漢字", "", "🎉"], C_LIST, E_STR),
    ("str-long-utf8", ["é" * 300, "x", "🎉" * 100], C_LIST, E_STR),
    ("str-long-ascii", ["a" * 100, "", "b" * 300], C_LIST, E_STR),
    ("float", [0.5, -0.0, math.nan, math.inf, -math.inf, 5e-324], C_LIST, E_F64),
    ("int", [0, -(2**63), 2**63 - 1, 7], C_LIST, E_INT),
    ("bool", [True, False, True], C_LIST, E_BOOL),
    ("token-ids", [[1, 2, 3], [], [-(2**63), 2**63 - 1], [5]], C_LIST, E_INTLISTS),
    ("token-ids-int32", [[151935, 0, 7], [], [2**31 - 1, -(2**31)]], C_LIST, E_INTLISTS),
    ("token-ids-uint32", [[2**32 - 1, 0], [2**31]], C_LIST, E_INTLISTS),
    ("token-ids-empty-rows", [[], [], []], C_LIST, E_INTLISTS),
    ("token-ids-negative", [[-1, -2], [3]], C_LIST, E_INTLISTS),
    ("token-ids-tuple-column", ([1, 2], [3]), C_TUPLE, E_INTLISTS),
    ("token-ids-aliased-rows", [[1, 2]] * 3, C_LIST, E_INTLISTS),
    ("tuple-of-str", ("a", "b"), C_TUPLE, E_STR),
    ("tuple-of-float", (1.0, 2.0), C_TUPLE, E_F64),
    (
        "chat-messages",
        [
            [{"role": "assistant", "content": "The answer is 4."}],
            [{"role": "system", "content": "Be brief, please."}, {"role": "user", "content": "2+2=? é漢\udcff"}],
            [],
        ],
        C_LIST,
        E_RECORDS,
    ),
    ("chat-messages-tuple-column", ([{"content": "0123456789abcdef"}], []), C_TUPLE, E_RECORDS),
    # fallbacks to one tagged value per sample
    ("big-int", [1, 2**64], C_LIST, E_GENERIC),
    ("int-and-bool", [1, True], C_LIST, E_GENERIC),
    ("int-and-float", [1, 1.0], C_LIST, E_GENERIC),
    ("ids-with-bool", [[1], [True]], C_LIST, E_GENERIC),
    ("ids-with-big", [[1], [2**64]], C_LIST, E_GENERIC),
    ("ids-with-bool-among-ints", [[0, 1, True, 2]], C_LIST, E_GENERIC),
    ("ids-with-false-first", [[False, 5], [6]], C_LIST, E_GENERIC),
    ("ids-with-numpy-int", [[1, np.int64(2)], [3]], C_LIST, E_GENERIC),
    ("ids-with-numpy-int32", [[np.int32(2)]], C_LIST, E_GENERIC),
    ("ids-with-float", [[1, 2.0]], C_LIST, E_GENERIC),
    ("ids-with-nested-list", [[1, [2]], [3]], C_LIST, E_GENERIC),
    ("ids-with-empty-nested-list", [[[]], [5]], C_LIST, E_GENERIC),
    ("ids-with-tuple-row", [[1], (2,)], C_LIST, E_GENERIC),
    ("ids-with-str", [["1"], [2]], C_LIST, E_GENERIC),
    ("ids-with-none", [[None], [2]], C_LIST, E_GENERIC),
    (
        "chat-keys-differ",
        [[{"role": "user", "content": "hello there!"}], [{"role": "user", "text": "hi!!!!"}]],
        C_LIST,
        E_GENERIC,
    ),
    ("chat-key-order-differs", [[{"a": "0123456789", "b": "x"}, {"b": "x", "a": "0123456789"}]], C_LIST, E_GENERIC),
    ("chat-value-not-str", [[{"role": "tool", "content": None, "name": "calculator"}]], C_LIST, E_GENERIC),
    ("chat-int-keys", [[{1: "0123456789abcdef"}]], C_LIST, E_GENERIC),
    ("chat-empty-dicts", [[{}], [{}]], C_LIST, E_GENERIC),
    ("chat-tiny-records", [[{"a": ""}] * 5], C_LIST, E_GENERIC),
    ("chat-row-is-tuple", [[{"a": "0123456789abcdef"}], ({"a": "0123456789abcdef"},)], C_LIST, E_GENERIC),
    ("mixed", [None, "a", 1, [2.5, {"k": (1,)}], b"x"], C_LIST, E_GENERIC),
    ("str-subclass", [np.str_("a"), np.str_("b")], C_LIST, E_GENERIC),
    ("tensors", [torch.ones(2), torch.zeros(3, dtype=torch.int8)], C_LIST, E_GENERIC),
    ("arrays", [np.ones(2), np.zeros((1, 2), dtype=np.uint8)], C_LIST, E_GENERIC),
]


@pytest.mark.parametrize(
    ("values", "container", "encoding"), [c[1:] for c in FAST_PATHS], ids=[c[0] for c in FAST_PATHS]
)
def test_column_fast_paths_round_trip_exactly(values: Any, container: int, encoding: int) -> None:
    enc, col = frame_roundtrip(values, container)
    assert enc == encoding
    assert same(list(col.values), list(values))


@pytest.mark.parametrize("container", [C_LIST, C_TUPLE])
def test_empty_columns_round_trip(container: int) -> None:
    empty: Any = [] if container == C_LIST else ()
    _enc, col = frame_roundtrip(empty, container)
    assert list(col.values) == []


@pytest.mark.parametrize(
    "column",
    [
        np.arange(12, dtype=np.int32).reshape(4, 3),
        np.zeros((0, 5), dtype=np.float32),
        np.array(["a", "bc"], dtype="<U2"),
        torch.arange(8, dtype=torch.bfloat16).reshape(4, 2),
        torch.zeros((0, 2), dtype=torch.float16),
        torch.tensor([True, False]),
    ],
    ids=lambda c: f"{type(c).__name__}-{c.dtype}-{tuple(c.shape)}",
)
def test_array_and_tensor_columns_round_trip(column: Any) -> None:
    container = C_TENSOR if isinstance(column, torch.Tensor) else C_NDARRAY
    _, col = frame_roundtrip(column, container)
    assert same(col.values, column)


def test_object_ndarray_column_travels_per_element() -> None:
    arr = np.empty(3, dtype=object)
    arr[:] = ["a", 1, None]
    enc, col = frame_roundtrip(arr, C_NDARRAY)
    assert enc == E_GENERIC
    assert col.values == ["a", 1, None]


def test_frame_with_many_columns_meta_skip_and_drop() -> None:
    class Opaque:
        pass

    cols = [
        Column("a", C_LIST, ["x", "y"]),
        Column("b", C_TENSOR, torch.ones(2, 2)),
        Column("c", C_LIST, [Opaque(), Opaque()]),
        Column("d", C_TUPLE, (1.5, None)),
    ]
    dropped: list[str] = []
    meta = {"keys": ["r", 1], "logs": [("metric", "m", 1.0)]}
    frame = bytes(encode_frame(cols, 2, meta=meta, droppable=frozenset({"c"}), dropped=dropped))
    assert dropped == ["c"]
    nrows, got, back_meta = decode_frame(frame)
    assert nrows == 2
    assert [c.name for c in got] == ["a", "b", "d"]
    assert same(back_meta, meta)
    assert same(got[1].values, torch.ones(2, 2))
    assert got[2].values == [1.5, None]
    _, got, _ = decode_frame(frame, skip=frozenset({"a", "b"}))
    assert [c.name for c in got] == ["d"]
    with pytest.raises(UnsupportedTypeError):  # not droppable: an error, never pickled
        encode_frame(cols, 2)


def test_frames_concatenate_8_byte_aligned() -> None:
    a = encode_frame([Column("s", C_LIST, ["abc"])], 1)
    b = encode_frame([Column("t", C_TENSOR, torch.ones(3, dtype=torch.float64))], 3, out=bytearray(a))
    assert len(a) % 8 == 0
    assert len(b) % 8 == 0
    _, cols, _ = decode_frame(bytes(b[len(a) :]))
    assert same(cols[0].values, torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        ([0, 255], "|u1"),
        ([0, 256], "<u2"),
        ([65535], "<u2"),
        ([65536], "<u4"),
        ([151935, 0], "<u4"),  # Qwen2's vocabulary: uint32
        ([2**32 - 1], "<u4"),
        ([2**32], "<u8"),
        ([2**63 - 1], "<u8"),
        ([-1, 127], "|i1"),
        ([-128], "|i1"),
        ([128, -1], "<i2"),
        ([-129], "<i2"),
        ([-(2**15), 2**15 - 1], "<i2"),
        ([-(2**15) - 1], "<i4"),
        ([-1, 2**31 - 1], "<i4"),
        ([-(2**31)], "<i4"),
        ([-1, 2**31], "<i8"),
        ([-(2**63), 2**63 - 1], "<i8"),
    ],
    ids=str,
)
def test_integers_travel_in_the_narrowest_dtype_that_holds_them(values: list[int], dtype: str) -> None:
    code, narrow = _narrow(np.array(values, dtype=np.int64))
    assert _INT_DTYPES[code] == np.dtype(dtype)
    assert narrow.tolist() == values
    width = np.dtype(dtype).itemsize
    for column, encoding in ((values * 50, E_INT), ([values * 50, [], values], E_INTLISTS)):
        enc, col = frame_roundtrip(column, C_LIST)
        assert enc == encoding
        assert same(col.values, column)
        nvalues = len(values) * (50 if encoding == E_INT else 51)
        assert len(encode_frame([Column("c", C_LIST, column)], len(column))) < nvalues * width + 96


def test_an_empty_token_id_array_is_the_narrowest() -> None:
    code, narrow = _narrow(np.zeros(0, dtype=np.int64))
    assert _INT_DTYPES[code] == np.dtype("|u1")
    assert narrow.size == 0


def test_token_id_frames_are_about_as_small_as_pickle() -> None:
    """Token ids of a 150k vocabulary travel as uint32: the frame is no bigger than pickle's bytes."""
    import random

    rng = random.Random(0)
    n = 64
    batch = {
        "completions": [" ".join(rng.choice(["the", "sum", "is", "x"]) for _ in range(200)) for _ in range(n)],
        "completion_ids": [[rng.randrange(151_936) for _ in range(rng.randrange(200, 300))] for _ in range(n)],
        "solution": [str(rng.randrange(1000)) for _ in range(n)],
    }
    frame = encode_frame([Column(k, C_LIST, v) for k, v in batch.items()], n)
    assert len(frame) <= 1.05 * len(pickle.dumps(batch, protocol=5))
    ids_only = encode_frame([Column("ids", C_LIST, batch["completion_ids"])], n)
    assert len(ids_only) <= 4 * sum(map(len, batch["completion_ids"])) + 4 * n + 128  # uint32 ids and lengths


# --------------------------------------------------------------------------------------------- sequences

SEQUENCES: list[Any] = [
    collections.deque(["a", "bb", "ccc"]),
    array.array("q", [3, -1, 2**40]),
    array.array("d", [1.5, -0.0, math.inf]),
    array.array("B", [0, 255, 7]),
    range(5, 8),
    collections.UserList([[1, 2], [], [3]]),
]


@pytest.mark.parametrize("seq", SEQUENCES, ids=lambda s: type(s).__name__)
def test_sequence_columns_are_per_sample_and_travel_as_lists(seq: Any) -> None:
    """A deque, range, array.array... is a per-sample column, not a shared value; it arrives as a list."""
    assert container_of(seq) == C_LIST
    assert is_plain(seq, C_LIST)
    _, col = frame_roundtrip(seq, C_LIST)
    assert type(col.values) is list
    assert same(col.values, list(seq))
    assert take(seq, C_LIST, slice(1, None)) == list(seq)[1:]
    assert take(seq, C_LIST, [2, 0]) == [seq[2], seq[0]]
    assert same(concat("c", [seq, col.values], C_LIST, CPU), list(seq) * 2)
    bound = Binder(lambda completions, **kw: (completions, kw), include=None, exclude=(), shared=()).bind(
        (), {"completions": ["x", "y", "z"], "extra": seq}
    )
    assert [(c.name, c.container) for c in bound.columns] == [("completions", C_LIST), ("extra", C_LIST)]


@pytest.mark.parametrize(
    "value",
    [
        "abc",
        b"abc",
        bytearray(b"abc"),
        memoryview(b"abc"),
        collections.UserString("abc"),
        np.str_("abc"),
        np.bytes_(b"abc"),
        {"a": 1, "b": 2, "c": 3},
        collections.OrderedDict(a=1),
        types.MappingProxyType({"a": 1}),
        collections.UserDict(a=1),
        {1, 2, 3},
        np.array(3),
        torch.tensor(3),
        3,
        None,
        iter([1, 2, 3]),
    ],
    ids=lambda v: type(v).__name__,
)
def test_strings_bytes_and_mappings_are_not_per_sample(value: Any) -> None:
    assert container_of(value) is None


@pytest.mark.parametrize("mode", ["main", "replicate", "shard"])
def test_deque_range_and_array_arguments_are_synced_as_lists(mode: str) -> None:
    seen: list[tuple[str, ...]] = []
    extra = {"group_size": 1} if mode == "shard" else {}

    def reward(completions: Any, ids: Any, **kwargs: Any) -> list[float]:
        seen.append((type(completions).__name__, type(ids).__name__, type(kwargs["steps"]).__name__))
        assert len(completions) == len(ids) == len(kwargs["steps"])
        return [float(i + s) for i, s in zip(ids, kwargs["steps"], strict=True)]

    def body(rank: int, backend: Any) -> Any:
        fn = synced_reward(mode=mode, backend=backend, timeout=10, **extra)(reward)
        ids = array.array("q", [10 * rank, 10 * rank + 1])
        return fn(collections.deque([f"c{rank}", f"d{rank}"]), ids, steps=range(2 * rank, 2 * rank + 2))

    results = _on_threads(2, body)
    assert results == [("ok", [0.0, 2.0]), ("ok", [12.0, 14.0])]
    assert seen
    assert all(s == ("list", "list", "list") for s in seen)
    if mode != "shard":
        assert len(seen) == (1 if mode == "main" else 2)


# --------------------------------------------------------------------------------------------- masked and object arrays


def test_masked_arrays_are_refused_not_silently_unmasked() -> None:
    m = np.ma.masked_array([1.0, 2.0, 3.0], mask=[False, True, False])
    assert container_of(m) == C_NDARRAY
    assert not is_plain(m, C_NDARRAY)
    with pytest.raises(UnsupportedTypeError, match=r"column 'm'.*mask would be lost.*filled.*getmaskarray"):
        encode_frame([Column("m", C_NDARRAY, m)], 3)
    for value in (m, [1, m], {"k": m}, np.ma.masked):  # as a per-sample value too
        with pytest.raises(UnsupportedTypeError, match="mask would be lost"):
            encode_value(value, bytearray())
    with pytest.raises(UnsupportedTypeError, match="mask would be lost"):
        encode_frame([Column("m", C_LIST, [m[:1], m[1:2]])], 2)
    # an object masked array: its tolist() would quietly turn the masked entries into None
    obj = np.ma.masked_array(np.array(["a", "b"], dtype=object), mask=[True, False])
    assert not is_plain(obj, C_NDARRAY)
    with pytest.raises(UnsupportedTypeError, match="mask would be lost"):
        encode_frame([Column("o", C_NDARRAY, obj)], 2)
    # a **kwargs column holding one is left behind (the function gets a NotSynced), never sent unmasked
    dropped: list[str] = []
    frame = encode_frame([Column("m", C_NDARRAY, m)], 3, droppable=frozenset({"m"}), dropped=dropped)
    assert dropped == ["m"]
    assert decode_frame(bytes(frame))[1] == []


OBJECT_ARRAYS: list[np.ndarray] = [
    np.array([["a", "x"], ["b", None]], dtype=object),
    np.array([[[1, "a"], [2.5, b"b"]]], dtype=object),  # 3-D
    np.empty((0, 2), dtype=object),
    np.array(None, dtype=object),  # 0-d
    np.fromiter([[1, 2], (3,), {"k": [4]}], dtype=object, count=3),  # elements that are sequences
    np.asfortranarray(np.array([["a", "b", "c"], ["d", "e", "f"]], dtype=object)),
]


@pytest.mark.parametrize("arr", OBJECT_ARRAYS, ids=lambda a: f"object{a.shape}")
def test_object_arrays_round_trip_with_their_shape(arr: np.ndarray) -> None:
    back = roundtrip(arr)
    assert same(back, arr)
    assert back.flags.c_contiguous


def test_2d_object_array_column_keeps_its_shape_and_concatenates() -> None:
    local = np.array([["a", "x"], ["b", "y"]], dtype=object)
    peer = np.array([["c", None], ["d", "z"], ["e", "w"]], dtype=object)
    enc, col = frame_roundtrip(peer, C_NDARRAY)
    assert enc == E_OBJARRAY
    assert same(col.values, peer)
    both = concat("pairs", [local, col.values], C_NDARRAY, CPU)
    assert both.shape == (5, 2)
    assert both.dtype == object
    assert both.tolist() == [["a", "x"], ["b", "y"], ["c", None], ["d", "z"], ["e", "w"]]
    assert take(both, C_NDARRAY, [4, 0]).tolist() == [["e", "w"], ["a", "x"]]
    assert is_plain(peer, C_NDARRAY)
    assert not is_plain(np.array([[object()]], dtype=object), C_NDARRAY)


@pytest.mark.parametrize("mode", ["main", "replicate"])
def test_2d_object_array_argument_is_synced_with_its_shape(mode: str) -> None:
    seen: list[Any] = []

    def reward(completions: Any, pairs: Any) -> list[float]:
        seen.append(pairs)
        return [float(len(a) + len(b)) for a, b in pairs]

    def body(rank: int, backend: Any) -> Any:
        fn = synced_reward(mode=mode, backend=backend, timeout=10)(reward)
        pairs = np.array([[f"a{rank}", "xy"], [f"b{rank}", "xyz"]], dtype=object)
        return fn(["c", "d"], pairs)

    results = _on_threads(2, body)
    assert results == [("ok", [4.0, 5.0]), ("ok", [4.0, 5.0])]
    for pairs in seen:
        assert pairs.shape == (4, 2)
        assert pairs.dtype == object
        assert pairs[:, 0].tolist() == ["a0", "b0", "a1", "b1"]


def test_1d_object_array_column_of_sequences_concatenates() -> None:
    local = np.fromiter([[1, 2], [3, 4]], dtype=object, count=2)
    _, col = frame_roundtrip(local, C_NDARRAY)
    both = concat("c", [local, col.values], C_NDARRAY, CPU)
    assert both.shape == (4,)
    assert both.tolist() == [[1, 2], [3, 4], [1, 2], [3, 4]]


# --------------------------------------------------------------------------------------------- names, surrogates


def test_lone_surrogates_in_column_names_and_values_round_trip() -> None:
    cols = [
        Column("col\udcff", C_LIST, ["v\udcff", "w"]),
        Column("x\ud800", C_LIST, [{"k\udfff": "\ud800"}, None]),
        Column("ok", C_TUPLE, ("\udfff", "\ud83d")),
    ]
    frame = encode_frame(cols, 2, meta={"\udcff": ["\ud800"]})
    _, back, meta = decode_frame(bytes(frame))
    assert [c.name for c in back] == ["col\udcff", "x\ud800", "ok"]
    assert back[0].values == ["v\udcff", "w"]
    assert back[1].values == [{"k\udfff": "\ud800"}, None]
    assert back[2].values == ["\udfff", "\ud83d"]
    assert meta == {"\udcff": ["\ud800"]}
    assert decode_frame(bytes(frame), skip=frozenset({"col\udcff"}))[1][0].name == "x\ud800"


# --------------------------------------------------------------------------------------------- tensors the wire refuses


def _odd_tensors() -> list[torch.Tensor]:
    out = [
        torch.zeros(3).to_sparse(),
        torch.zeros(3, device="meta"),
        torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
    ]

    class Sub(torch.Tensor):
        pass

    out.append(torch.ones(3).as_subclass(Sub))
    return out


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_tensors_a_plain_tensor_cannot_represent_are_refused() -> None:
    for t in _odd_tensors():
        assert not is_plain(t, C_TENSOR)
        with pytest.raises(UnsupportedTypeError):
            encode_value(t, bytearray())
        with pytest.raises(UnsupportedTypeError, match="column 't'"):
            encode_frame([Column("t", C_TENSOR, t)], 3)
    p = torch.nn.Parameter(torch.ones(2))  # a Parameter is a plain tensor
    assert same(roundtrip(p), torch.ones(2))
    assert is_plain(p, C_TENSOR)


# --------------------------------------------------------------------------------------------- PIL images

IMAGE_MODES = ["1", "L", "P", "LA", "La", "PA", "I;16", "I;16L", "I;16B", "RGB", "YCbCr", "LAB", "HSV"]
IMAGE_MODES += ["RGBA", "RGBa", "RGBX", "CMYK", "I", "F"]


def _image(mode: str, size: tuple[int, int] = (13, 7), seed: int = 0) -> Any:
    """A deterministic image of ``mode`` whose every byte (palette too) differs from its neighbours."""
    image = pytest.importorskip("PIL.Image")
    im = image.new(mode, size)
    raw = np.random.default_rng(seed).integers(0, 256, len(im.tobytes()), dtype=np.uint8).tobytes()
    if mode == "F":  # keep the floats finite (NaN payloads would make the byte comparison moot)
        raw = np.random.default_rng(seed).standard_normal(size[0] * size[1]).astype(np.float32).tobytes()
    im = image.frombytes(mode, size, raw)
    if mode in ("P", "PA"):
        im.putpalette(bytes(range(256)) * 3, "RGB")
        im.info["transparency"] = 3
    return im


def same_image(a: Any, b: Any) -> bool:
    return (
        a.mode == b.mode
        and a.size == b.size
        and a.tobytes() == b.tobytes()
        and (a.mode not in ("P", "PA") or a.getpalette() == b.getpalette())
        and a.info.get("transparency") == b.info.get("transparency")
    )


@pytest.mark.parametrize("mode", IMAGE_MODES)
def test_pil_images_round_trip_without_pickle(mode: str) -> None:
    from syncreward._codec import _image_nbytes

    for size in ((13, 7), (1, 1), (0, 0), (9, 0), (448, 3)):
        im = _image(mode, size)
        assert len(im.tobytes()) == _image_nbytes(mode, *size)  # the decoder's size table is PIL's
        out = bytearray()
        encode_value(im, out)
        assert b"PIL" not in out  # raw pixels, no pickle
        back = decode_value(bytes(out))
        assert type(back).__name__ == "Image"
        assert same_image(back, im)
        back.load()  # a real, writable image
        if size != (0, 0) and size[1]:
            back.putpixel((0, 0), im.getpixel((0, 0)))


def test_image_columns_travel_when_named_and_are_left_behind_in_kwargs() -> None:
    ims = [_image("RGB", seed=i) for i in range(3)]
    column = [ims[0], None, [ims[1], ims[2]]]
    assert is_image_column(column, C_LIST)
    assert is_image_column(tuple(column), C_TUPLE)
    assert not is_plain(column, C_LIST)  # what counts as plain (for **kwargs columns) is unchanged
    frame = encode_frame([Column("image", C_LIST, column)], 3)
    _, cols, _ = decode_frame(bytes(frame))
    back = cols[0].values
    assert same_image(back[0], ims[0])
    assert back[1] is None
    assert all(map(same_image, back[2], ims[1:]))
    dropped: list[str] = []
    encode_frame([Column("image", C_LIST, column)], 3, droppable=frozenset({"image"}), dropped=dropped)
    assert dropped == ["image"]
    with pytest.raises(UnsupportedTypeError, match="names"):
        _encode_column_body(column, C_LIST, bytearray(), False)  # the plain-only level, as is_plain uses it
    for other in ([], [None], [ims[0], "x"], [ims[0], [ims[1], 1]], np.array([1]), [_image("I;16N")]):
        container = container_of(other) or C_LIST
        assert not is_image_column(other, container)


def test_unsupported_image_modes_are_refused_clearly() -> None:
    im = _image("I;16N")  # native-endian 16 bit: not portable
    with pytest.raises(UnsupportedTypeError, match=r"mode 'I;16N'.*convert"):
        encode_value(im, bytearray())
    with pytest.raises(UnsupportedTypeError, match=r"column 'image'.*mode 'I;16N'"):
        encode_frame([Column("image", C_LIST, [im])], 1)
    back = roundtrip([im], allow_pickle=True)  # the opt-in pickles it instead
    assert back[0].mode == "I;16N"
    assert back[0].tobytes() == im.tobytes()


def test_images_are_refused_by_a_rank_without_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    out = bytearray()
    encode_value(_image("L"), out)
    real_import = builtins.__import__

    def no_pil(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("PIL"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pil)
    with pytest.raises(CodecError, match="pillow is not installed"):
        decode_value(bytes(out))


# --------------------------------------------------------------------------------------------- no code on the wire

RAN: list[str] = []


def _side_effect(tag: str) -> str:
    RAN.append(tag)
    return tag


class Exploit:
    """Unpickling this runs ``_side_effect``: the shape of every pickle-based remote code execution."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        RAN.append("reduce")  # the sender side serializing it at all
        return (_side_effect, ("unpickled",))


def test_object_with_custom_reduce_is_refused_and_nothing_runs() -> None:
    RAN.clear()
    with pytest.raises(UnsupportedTypeError, match="allow_pickle=True") as info:
        encode_value([1, Exploit()], bytearray())
    assert "trusted clusters only" in str(info.value)
    with pytest.raises(UnsupportedTypeError, match="allow_pickle"):
        encode_frame([Column("x", C_LIST, [Exploit()])], 1)
    assert RAN == []  # not even __reduce__ was called


def test_pickled_payload_is_not_unpickled_without_opt_in() -> None:
    RAN.clear()
    out = bytearray()
    encode_value({"obj": Exploit()}, out, allow_pickle=True)  # a sender that opted in (or a hostile one)
    assert RAN == ["reduce"]
    RAN.clear()
    with pytest.raises(CodecError, match="allow_pickle is off"):
        decode_value(bytes(out))
    frame = encode_frame([Column("x", C_LIST, [Exploit()])], 1, allow_pickle=True)
    with pytest.raises(CodecError, match="allow_pickle"):
        decode_frame(bytes(frame))
    # the raw pickle opcode stream, smuggled in as bytes, stays inert bytes
    raw = pickle.dumps(Exploit())
    assert roundtrip(raw) == raw
    assert "unpickled" not in RAN
    RAN.clear()
    assert roundtrip({"obj": Exploit()}, allow_pickle=True) == {"obj": "unpickled"}  # the opt-in does run it
    assert RAN == ["reduce", "unpickled"]


class _ThreadHub:
    """Two channels of barrier-based collectives shared by W threads (a minimal in-process transport)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.barriers = [threading.Barrier(world_size) for _ in range(2)]
        self.slots: list[list[Any]] = [[None] * world_size for _ in range(2)]

    def exchange(self, rank: int, channel: int, item: Any, timeout: float) -> list[Any]:
        self.slots[channel][rank] = item
        self.barriers[channel].wait(timeout)
        got = list(self.slots[channel])
        self.barriers[channel].wait(timeout)
        return got


class _ThreadBackend:
    def __init__(self, hub: _ThreadHub, rank: int) -> None:
        self.hub, self.rank, self.world_size = hub, rank, hub.world_size

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        return np.stack(self.hub.exchange(self.rank, channel, row.copy(), timeout))

    def all_to_all(
        self, send: np.ndarray, send_counts: Any, recv_counts: Any, *, channel: int, timeout: float
    ) -> np.ndarray:
        items = self.hub.exchange(self.rank, channel, (send.copy(), list(send_counts)), timeout)
        parts = []
        for buf, counts in items:
            start = sum(counts[: self.rank])
            parts.append(buf[start : start + counts[self.rank]])
        return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def _on_threads(world_size: int, body: Any) -> list[Any]:
    hub = _ThreadHub(world_size)
    results: list[Any] = [None] * world_size

    def run(rank: int) -> None:
        try:
            results[rank] = ("ok", body(rank, _ThreadBackend(hub, rank)))
        except Exception as e:
            results[rank] = (type(e).__name__, e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    return results


def _echo(completions: Any, payload: Any) -> list[float]:
    return [1.0] * len(completions)


@pytest.mark.parametrize("mode", ["main", "replicate", "shard"])
def test_synced_call_refuses_exploit_on_every_rank_and_runs_nothing(mode: str) -> None:
    """One rank passes an object with a custom ``__reduce__``: every rank raises, nothing is (un)pickled."""
    RAN.clear()
    extra = {"group_size": 1} if mode == "shard" else {}

    def body(rank: int, backend: Any) -> Any:
        fn = synced_reward(mode=mode, backend=backend, timeout=10, **extra)(_echo)
        payload = [Exploit()] if rank == 1 else ["plain"]
        return fn(["c"], payload)

    results = _on_threads(3, body)
    assert results[1][0] == "UnsupportedTypeError"
    assert "allow_pickle=True" in str(results[1][1])
    assert "trusted clusters only" in str(results[1][1])
    for r in (0, 2):
        kind, err = results[r]
        assert kind == "RemoteError"
        assert err.origin_rank == 1
        assert err.exc_type == "syncreward.UnsupportedTypeError"
    assert RAN == []
    assert isinstance(results[0][1], syncreward.SyncRewardError)


class _Int(int):
    pass


@pytest.mark.parametrize(
    "odd",
    [None, True, 1.5, 2**31, -(2**31) - 1, 2**70, _Int(3), np.int64(3), np.int32(3), "7", b"7", [1], (1,), object()],
    ids=lambda v: type(v).__name__ + ("" if not isinstance(v, int) or isinstance(v, bool) else f"_{v}")[:12],
)
def test_is_plain_token_id_lists_agrees_with_the_encoder(odd: Any) -> None:
    """Token-id columns take a marshal fast path in is_plain; one odd element anywhere gives the encoder's answer."""
    rows = [list(range(i, i + 300)) for i in range(40)]
    assert is_plain(rows, C_LIST)
    for where in (0, 17, 39):
        column = [list(r) for r in rows]
        column[where].insert(150, odd)
        try:
            _encode_column_body(column, C_LIST, bytearray(), False)  # the plain-only level
            encodable = True
        except Exception:
            encodable = False
        assert is_plain(column, C_LIST) == encodable, (odd, where)


_I_BYTES = struct.unpack("<d", b"iiiiiiii")[0]  # a float whose 8 data bytes all read as marshal's int tag


@pytest.mark.parametrize(
    "odd",
    [
        [None, _I_BYTES],  # 1 + 9 bytes: the size of two int records, the float's bytes read "i" at every offset
        [_I_BYTES, True],  # 9 + 1
        ["iii"],  # a 3-character str: a 5-byte record, like an int's
        ["[[[" + "i" * 7],  # 12 bytes of list and int tags
        [[7], 1, 2],  # a list inside a row where ints were
        [2**40],  # an int past int32: a longer record
    ],
    ids=["none-float", "float-bool", "str3", "str-tags", "nested", "int64"],
)
def test_token_id_fast_path_refuses_records_that_mimic_ints(odd: list[Any]) -> None:
    """The marshal fast path reads every record's type byte: values whose bytes look like int records stay exact."""
    rows = [list(range(i, i + 20)) for i in range(6)]
    for where in (0, 3, 5):
        column = [list(r) for r in rows]
        column[where][4 : 4 + len(odd)] = odd  # replaces as many ints as it holds
        try:
            _encode_column_body(column, C_LIST, bytearray(), False)  # the plain-only level
            encodable = True
        except Exception:
            encodable = False
        assert is_plain(column, C_LIST) == encodable, (odd, where)
        _, col = frame_roundtrip(column, C_LIST)
        assert same(col.values, column), (odd, where)
