"""Fuzzing the decoder: random, mutated, truncated and absurd-size payloads only ever raise ``CodecError``.

Never another exception, a crash, a hang, or an allocation sized by a declared length rather than by the
bytes actually present. The same payloads also run in a subprocess under ``RLIMIT_AS`` (so a runaway
allocation fails there instead of swapping the machine) that measures its peak RSS.
"""

from __future__ import annotations

import array
import collections
import enum
import json
import os
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import same
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

try:
    from PIL import Image
except ImportError:  # pillow is a test extra; the image cases are skipped without it
    Image = None

from syncreward import CodecError, SyncRewardError, UnsupportedTypeError
from syncreward import _codec as codec
from syncreward._codec import (
    C_LIST,
    C_NDARRAY,
    C_TENSOR,
    C_TUPLE,
    E_GENERIC,
    E_INT,
    E_INTLISTS,
    E_RECORDS,
    E_STR,
    MAGIC,
    T_ARRAY,
    T_BIGINT,
    T_BYTES,
    T_DICT,
    T_IMAGE,
    T_LIST,
    T_NONE,
    T_NPSCALAR,
    T_PICKLE,
    T_STR,
    T_TENSOR,
    Column,
    _encode_column_body,
    container_of,
    decode_frame,
    decode_value,
    encode_frame,
    encode_value,
    is_plain,
)

FUZZ = settings(
    max_examples=int(os.environ.get("SYNCREWARD_FUZZ_EXAMPLES", "300")),  # raise it for a deep local run
    deadline=timedelta(seconds=5),  # a decode that takes seconds on a small buffer is a hang in the making
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

# --------------------------------------------------------------------------------------------- strategies

NP_DTYPES = ["<i1", "<u1", "<i2", "<u2", "<i4", ">i4", "<i8", "<u8", "<f2", "<f4", "<f8", ">f8", "<c8", "|b1"]
TORCH_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int8,
    torch.uint8,
    torch.bool,
]


def np_arrays(min_dims: int = 0) -> st.SearchStrategy[np.ndarray]:
    return hnp.arrays(
        dtype=st.sampled_from(NP_DTYPES).map(np.dtype) | st.sampled_from(["<U3", "|S2"]).map(np.dtype),
        shape=hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=0, max_side=4),
    )


def tensors(min_dims: int = 0) -> st.SearchStrategy[torch.Tensor]:
    return st.tuples(
        hnp.arrays(
            np.float64,
            hnp.array_shapes(min_dims=min_dims, max_dims=3, min_side=0, max_side=4),
            elements=st.floats(-1e4, 1e4, width=32),
        ),
        st.sampled_from(TORCH_DTYPES),
    ).map(lambda p: torch.from_numpy(p[0]).to(p[1]))


np_scalars = st.tuples(
    st.integers(0, 120), st.sampled_from([np.int8, np.uint16, np.int64, np.float32, np.float64, np.bool_])
).map(lambda p: p[1](p[0]))
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(2**80), 2**80),
    st.floats(),
    st.text(max_size=10),
    st.binary(max_size=10),
    np_scalars,
    np_arrays(),
    tensors(),
)
values = st.recursive(
    leaves,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.one_of(st.text(max_size=4), st.integers(-5, 5), st.none()), inner, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A valid frame: a few columns of one of the fast-path or generic shapes, and maybe meta."""
    n = draw(st.integers(0, 6))
    kinds = draw(
        st.lists(
            st.sampled_from(["str", "float", "int", "bool", "ids", "generic", "array", "tensor", "tuple", "chat"]),
            max_size=4,
        )
    )
    cols = []
    for i, kind in enumerate(kinds):
        name = f"c{i}" + draw(st.text(max_size=3))
        if kind == "str":
            cols.append(Column(name, C_LIST, draw(st.lists(st.text(max_size=6), min_size=n, max_size=n))))
        elif kind == "float":
            cols.append(Column(name, C_LIST, draw(st.lists(st.floats(), min_size=n, max_size=n))))
        elif kind == "int":
            cols.append(Column(name, C_LIST, draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n))))
        elif kind == "bool":
            cols.append(Column(name, C_LIST, draw(st.lists(st.booleans(), min_size=n, max_size=n))))
        elif kind == "ids":
            ids = st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5)
            cols.append(Column(name, C_LIST, draw(st.lists(ids, min_size=n, max_size=n))))
        elif kind == "generic":
            cols.append(Column(name, C_LIST, draw(st.lists(values, min_size=n, max_size=n))))
        elif kind == "chat":
            message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": st.text()})
            cols.append(Column(name, C_LIST, draw(st.lists(st.lists(message, max_size=3), min_size=n, max_size=n))))
        elif kind == "tuple":
            cols.append(Column(name, C_TUPLE, tuple(draw(st.lists(st.text(max_size=3), min_size=n, max_size=n)))))
        elif kind == "array":
            a = draw(hnp.arrays(st.sampled_from(NP_DTYPES).map(np.dtype), st.tuples(st.just(n), st.integers(0, 3))))
            cols.append(Column(name, C_NDARRAY, a))
        else:
            t = torch.arange(n * 2, dtype=torch.float64).reshape(n, 2).to(draw(st.sampled_from(TORCH_DTYPES)))
            cols.append(Column(name, C_TENSOR, t))
    meta = draw(st.none() | values)
    return bytes(encode_frame(cols, n, meta=meta))


def encode(value: Any) -> bytes:
    out = bytearray()
    encode_value(value, out)
    return bytes(out)


ABSURD_U64 = [2**64 - 1, 2**63, 2**63 - 1, 2**62, 2**40, 2**32 + 7, 10**12]
ABSURD_U32 = [2**32 - 1, 2**31, 2**24]


@st.composite
def mutations(draw: st.DrawFn, payload: bytes) -> bytes:
    """Flip, overwrite with an absurd size, insert, delete or truncate -- a few times."""
    buf = bytearray(payload)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "u64", "u32", "byte", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, max(len(buf) - 1, 0)))
        if op == "flip" and buf:
            buf[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "u64":
            buf[pos : pos + 8] = struct.pack("<Q", draw(st.sampled_from(ABSURD_U64)))
        elif op == "u32":
            buf[pos : pos + 4] = struct.pack("<I", draw(st.sampled_from(ABSURD_U32)))
        elif op == "byte" and buf:
            buf[pos] = draw(st.integers(0, 255))
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=9))
        elif op == "delete":
            del buf[pos : pos + draw(st.integers(1, 9))]
        elif op == "truncate":
            del buf[pos:]
    return bytes(buf)


def only_codec_errors(decode: Callable[[bytes], Any], payload: bytes) -> str:
    """Decode; return "ok" or "codec-error". Any other exception fails the test (with the payload)."""
    try:
        decode(payload)
    except CodecError as e:
        # a MemoryError turned into a CodecError would mean an allocation was attempted from a declared size
        assert not isinstance(e.__context__, MemoryError), payload.hex()  # noqa: PT017
        return "codec-error"
    except BaseException as e:
        raise AssertionError(f"{type(e).__name__}: {e} escaped the decoder for payload {payload.hex()}") from e
    return "ok"


# --------------------------------------------------------------------------------------------- random and mutated


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_into_decode_value(payload: bytes) -> None:
    only_codec_errors(decode_value, payload)


@FUZZ
@given(st.integers(0, 20), st.binary(max_size=300))
def test_random_bytes_behind_every_tag(tag: int, rest: bytes) -> None:
    only_codec_errors(decode_value, bytes([tag]) + rest)


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_into_decode_frame(rest: bytes) -> None:
    only_codec_errors(decode_frame, MAGIC + rest)  # past the magic, or nothing gets tested


@FUZZ
@given(values)
def test_random_values_round_trip_exactly(value: Any) -> None:
    back = decode_value(encode(value))
    want = value
    if isinstance(value, torch.Tensor):
        want = value.contiguous()
    assert same(back, want)


@FUZZ
@given(st.data())
def test_mutated_values_raise_only_codec_errors(data: st.DataObject) -> None:
    payload = encode(data.draw(values))
    only_codec_errors(decode_value, data.draw(mutations(payload)))


@FUZZ
@given(st.data())
def test_valid_frames_round_trip_and_mutated_frames_raise_only_codec_errors(data: st.DataObject) -> None:
    payload = data.draw(frames())
    nrows, cols, _ = decode_frame(payload)
    assert all(len(c.values) == nrows for c in cols)
    only_codec_errors(decode_frame, data.draw(mutations(payload)))


# --------------------------------------------------------------------------------------------- truncation

REPRESENTATIVE_VALUES: list[Any] = [
    None,
    7,
    -(2**70),
    1.5,
    "héllo",
    b"\x00\x01",
    [1, "a", None],
    (1.5, (2,)),
    {"k": [1, {"j": b"x"}]},
    np.int16(3),
    np.arange(6, dtype=np.float32).reshape(2, 3),
    torch.ones(2, 2, dtype=torch.bfloat16),
    np.array([["a", None]], dtype=object),
]
if Image is not None:
    _P = Image.new("P", (3, 2), 1)
    _P.putpalette(bytes(range(6)), "RGB")
    _P.info["transparency"] = 1
    REPRESENTATIVE_VALUES += [Image.new("RGB", (3, 2), (1, 2, 3)), _P]


def representative_frames() -> list[bytes]:
    n = 3
    cols = [
        Column("s", C_LIST, ["a", "héllo", ""]),
        Column("f", C_LIST, [1.0, float("nan"), -0.0]),
        Column("i", C_LIST, [1, 2, 3]),
        Column("b", C_LIST, [True, False, True]),
        Column("ids", C_LIST, [[1, 2], [], [3]]),
        Column("g", C_LIST, [None, {"a": 1}, (2,)]),
        Column("t", C_TUPLE, ("x", "y", "z")),
        Column(
            "m",
            C_LIST,
            [[{"role": "assistant", "content": "hello world!"}], [], [{"role": "u", "content": "é漢字..."}]],
        ),
        Column("a", C_NDARRAY, np.arange(6, dtype=np.int32).reshape(3, 2)),
        Column("x", C_TENSOR, torch.ones(3, 2)),
    ]
    return [bytes(encode_frame([c], n)) for c in cols] + [bytes(encode_frame(cols, n, meta={"keys": ["a"]}))]


def test_every_truncation_of_a_valid_payload_is_a_codec_error() -> None:
    cases = [(decode_value, encode(v)) for v in REPRESENTATIVE_VALUES]
    cases += [(decode_frame, f) for f in representative_frames()]
    for decode, payload in cases:
        decode(payload)  # the whole payload is valid
        for cut in range(len(payload)):
            with pytest.raises(CodecError):
                decode(payload[:cut])
        for junk in (b"\x00", b"\x00" * 8, b"\xff" * 3):
            with pytest.raises(CodecError):
                decode(payload + junk)


# --------------------------------------------------------------------------------------------- absurd sizes


def _u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def _pad(b: bytes) -> bytes:
    return b + bytes(-len(b) % 8)


def _ints(code: int, values: list[int]) -> bytes:
    """A narrow integer array of a column body: dtype code, padding, values (as uint64 when code >= 8)."""
    dtype = "<u8" if code == 3 else "<i8" if code >= 7 else ["|u1", "<u2", "<u4", "", "|i1", "<i2", "<i4"][code]
    return _pad(bytes([code]) + bytes(7) + np.array(values, dtype=dtype).tobytes())


def _frame(ncols: int, nrows: int, name: bytes, container: int, enc: int, body_len: int, body: bytes) -> bytes:
    head = (
        MAGIC + struct.pack("<I", ncols) + _u64(nrows) + struct.pack("<I", len(name)) + name + bytes([container, enc])
    )
    return _pad(_pad(head) + _u64(body_len) + body) + b"\x00"


def absurd_payloads() -> list[tuple[str, Callable[[bytes], Any], bytes]]:
    """Hand-made payloads whose declared sizes would need terabytes if believed."""
    huge = 2**64 - 1
    cases: list[tuple[str, Callable[[bytes], Any], bytes]] = []
    for v in (huge, 2**63, 2**40):
        cases += [
            (f"list of {v} items", decode_value, bytes([T_LIST]) + _u64(v) + b"\x00" * 16),
            (f"dict of {v} items", decode_value, bytes([T_DICT]) + _u64(v) + b"\x00" * 16),
            (f"str of {v} bytes", decode_value, bytes([T_STR]) + _u64(v) + b"abc"),
            (f"bytes of {v}", decode_value, bytes([T_BYTES]) + _u64(v) + b"abc"),
            (f"bigint of {v} digits", decode_value, bytes([T_BIGINT]) + _u64(v) + b"123"),
            (f"pickle of {v} bytes", decode_value, bytes([T_PICKLE]) + _u64(v) + b"\x80"),
        ]
    for shape in [(2**32, 2**32), (2**63,), (huge,), (0, huge), (0, 2**62, 2**62), (2**21,) * 3]:
        for tag, dtype in ((T_ARRAY, b"<f8"), (T_TENSOR, b"float64"), (T_TENSOR, b"bool")):
            header = bytes([tag, len(dtype)]) + dtype + bytes([len(shape)]) + b"".join(_u64(s) for s in shape)
            cases.append(
                (
                    f"{'array' if tag == T_ARRAY else 'tensor'} {dtype.decode()} {shape}",
                    decode_value,
                    _pad(header) + b"\x00" * 8,
                )
            )
    cases += [
        ("array with 255 dims", decode_value, bytes([T_ARRAY, 3]) + b"<f8" + bytes([255]) + _u64(1) * 255),
        ("scalar <U999999", decode_value, bytes([T_NPSCALAR, 8]) + b"<U999999" + b"\x00" * 8),
        ("scalar |S999999", decode_value, bytes([T_NPSCALAR, 8]) + b"|S999999" + b"\x00" * 8),
        ("array <U999999 x 2**30", decode_value, _pad(bytes([T_ARRAY, 8]) + b"<U999999" + bytes([1]) + _u64(2**30))),
        ("frame with 2**32-1 columns", decode_frame, MAGIC + struct.pack("<I", 2**32 - 1) + _u64(1) + b"\x00" * 64),
        (
            "frame column name of 2**32-1 bytes",
            decode_frame,
            _frame(1, 1, b"", C_LIST, E_GENERIC, 8, b"")[:16] + struct.pack("<I", 2**32 - 1) + b"abc",
        ),
        ("column body of 2**64-1 bytes", decode_frame, _frame(1, 1, b"a", C_LIST, E_GENERIC, huge, b"\x00" * 8)),
        (
            "generic column of 2**63 rows",
            decode_frame,
            _frame(1, 2**63, b"a", C_LIST, E_GENERIC, 16, _u64(2**63) + b"\x00" * 8),
        ),
        (
            "str column of 2**60 rows",
            decode_frame,
            _frame(1, 2**60, b"a", C_LIST, E_STR, 24, _u64(2**60) + _ints(3, [5])),
        ),
        (
            "str column, row of 2**62 bytes",
            decode_frame,
            _frame(1, 1, b"a", C_LIST, E_STR, 32, _u64(1) + _ints(3, [2**62]) + b"abcdefgh"),
        ),
        (
            "str column, lengths summing past 2**64",
            decode_frame,
            _frame(1, 4, b"a", C_LIST, E_STR, 48, _u64(4) + _ints(3, [2**62] * 4)),
        ),
        (
            "token ids, 2**61 ids declared",
            decode_frame,
            _frame(1, 1, b"a", C_LIST, E_INTLISTS, 40, _u64(1) + _ints(3, [2**61]) + _ints(7, [1])),
        ),
        (
            "token ids, 2**64-1 ids in a row",
            decode_frame,
            _frame(1, 2, b"a", C_LIST, E_INTLISTS, 48, _u64(2) + _ints(3, [2**64 - 1, 2]) + _ints(0, [1, 2])),
        ),
        (
            "token ids, signed (negative) lengths",
            decode_frame,
            _frame(1, 2, b"a", C_LIST, E_INTLISTS, 48, _u64(2) + _ints(7, [-1, 2]) + _ints(0, [1, 2])),
        ),
        (
            "token ids, 2**16 empty rows with uint8 lengths",
            decode_frame,
            _frame(
                1,
                2**16,
                b"a",
                C_LIST,
                E_INTLISTS,
                8 + 8 + 2**16 + 8,
                _u64(2**16) + _ints(0, [0] * 2**16) + _ints(0, []),
            ),
        ),
        (
            "records, 2**40 records in a row",
            decode_frame,
            _frame(1, 1, b"a", C_LIST, E_RECORDS, 8 + 16 + 8, _u64(1) + _ints(3, [2**40]) + _u64(1)),
        ),
        (
            "records, fewer than 16 bytes each",
            decode_frame,
            _frame(1, 1, b"a", C_LIST, E_RECORDS, 8 + 16 + 24, _u64(1) + _ints(2, [4]) + _u64(1) + b"\x00" * 16),
        ),
        (
            "records, 2**20 keys",
            decode_frame,
            _frame(1, 1, b"a", C_LIST, E_RECORDS, 8 + 16 + 8 + 8, _u64(1) + _ints(2, [0]) + _u64(2**20) + b"\x00" * 8),
        ),
        (
            "records of duplicate keys",
            decode_frame,
            _frame(
                1,
                1,
                b"a",
                C_LIST,
                E_RECORDS,
                8 + 16 + 8 + 16 + 8,
                _u64(1) + _ints(2, [0]) + _u64(2) + _ints(0, [1, 1]) + b"aa" + b"\x00" * 6,
            ),
        ),
        (
            "ints of an unknown dtype code",
            decode_frame,
            _frame(1, 1, b"a", C_LIST, E_INT, 24, _u64(1) + _ints(8, [0])),
        ),
        ("frame nrows 2**64-1, no columns", decode_frame, MAGIC + struct.pack("<I", 0) + _u64(huge) + b"\x00" * 8),
    ]
    for mode, w, h, nbytes in [
        (b"RGB", 2**32 - 1, 2**32 - 1, 0),
        (b"RGB", 2**16, 2**16, 3 * 2**32),
        (b"L", 0, 2**32 - 1, 0),  # PIL would allocate a row pointer per row of an empty image
        (b"L", 2**32 - 1, 0, 0),
        (b"1", 2**14, 2**14, 2**25),
        (b"RGB", 4, 4, 2**64 - 1),
        (b"RGB", 4, 4, 47),
        (b"XYZ", 1, 1, 3),
        (b"I;16N", 1, 1, 2),
    ]:
        head = bytes([T_IMAGE, len(mode)]) + mode + struct.pack("<II", w, h) + b"\x00" + bytes([T_NONE])
        cases.append((f"image {mode.decode()} {w}x{h} of {nbytes} bytes", decode_value, head + _u64(nbytes) + b"x" * 8))
    palette_head = bytes([T_IMAGE, 1]) + b"P" + struct.pack("<II", 1, 1)
    cases += [
        ("palette of 2**32-1 bytes", decode_value, palette_head + b"\x03RGB" + struct.pack("<I", 2**32 - 1) + b"x"),
        ("palette of 1025 bytes", decode_value, palette_head + b"\x03RGB" + struct.pack("<I", 1025) + b"x" * 1100),
        ("palette mode CMYK", decode_value, palette_head + b"\x04CMYK" + struct.pack("<I", 4) + b"x" * 4),
        (
            "image transparency a list",
            decode_value,
            palette_head + b"\x00" + bytes([T_LIST]) + _u64(0) + _u64(1) + b"x",
        ),
    ]
    return cases


@pytest.mark.parametrize(("name", "decode", "payload"), absurd_payloads(), ids=[c[0] for c in absurd_payloads()])
def test_absurd_declared_sizes_are_refused_without_allocating(
    name: str, decode: Callable[[bytes], Any], payload: bytes
) -> None:
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        outcome = only_codec_errors(decode, payload)
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # "ok" is allowed only for a frame with no columns (nothing is allocated from its nrows)
    assert outcome == "codec-error" or name.startswith("frame nrows"), name
    assert peak < 1 << 20, f"{name}: {peak} bytes allocated"
    assert seconds < 1.0, f"{name}: took {seconds:.2f}s"


def _size_field_sweep() -> Iterator[tuple[Callable[[bytes], Any], bytes]]:
    """Every valid representative payload with an absurd u64/u32 written over every offset."""
    cases = [(decode_value, encode(v)) for v in REPRESENTATIVE_VALUES]
    cases += [(decode_frame, f) for f in representative_frames()]
    for decode, payload in cases:
        for pos in range(len(payload)):
            for v in (2**64 - 1, 2**62, 2**33):
                yield decode, payload[:pos] + _u64(v) + payload[pos + 8 :]
            yield decode, payload[:pos] + struct.pack("<I", 2**32 - 1) + payload[pos + 4 :]


def test_absurd_size_at_every_offset_of_valid_payloads() -> None:
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        count = 0
        for decode, payload in _size_field_sweep():
            only_codec_errors(decode, payload)
            count += 1
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count > 5000
    assert peak < 4 << 20, f"{peak} bytes allocated"
    assert seconds < 60


_SUBPROCESS = textwrap.dedent(
    """
    import json, os, resource, sys
    sys.path.insert(0, {tests!r})
    import test_codec_fuzz as fz

    def vm_bytes():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024

    limit = vm_bytes() + (1 << 30)  # 1 GiB above what the interpreter, numpy and torch map already
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes = {{}}
    for name, decode, payload in fz.absurd_payloads():
        outcomes[name] = fz.only_codec_errors(decode, payload)
    swept = sum(1 for decode, payload in fz._size_field_sweep() if fz.only_codec_errors(decode, payload))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({{"outcomes": outcomes, "swept": swept, "rss_growth_kb": after - before}}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux")
def test_absurd_sizes_under_an_address_space_limit() -> None:
    """Under RLIMIT_AS a decode that believed a declared size would die or raise MemoryError; neither happens."""
    code = _SUBPROCESS.format(tests=os.path.dirname(__file__))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["swept"] > 5000
    assert all(v == "codec-error" for k, v in report["outcomes"].items() if not k.startswith("frame nrows"))
    assert report["rss_growth_kb"] < 64 * 1024, report["rss_growth_kb"]


# a couple of pinned regressions: payloads that used to let TypeError out of the decoder
@example(bytes([T_NPSCALAR, 3]) + b"<i3" + b"\x00" * 3)
@example(_pad(bytes([T_ARRAY, 3]) + b"<f3" + bytes([1]) + _u64(1)) + b"\x00" * 8)
@example(_pad(bytes([T_TENSOR, 5]) + b"int64" + bytes([2]) + _u64(0) + _u64(2**64 - 1)))
@FUZZ
@given(st.binary(max_size=64))
def test_pinned_regressions(payload: bytes) -> None:
    only_codec_errors(decode_value, payload)


def test_zero_dim_and_mismatched_column_bodies_are_codec_errors() -> None:
    from syncreward._codec import E_ARRAY, E_TENSOR, _encode_ndarray, _encode_tensor

    def frame_with(container: int, enc: int, body: bytearray) -> bytes:
        return _frame(1, 1, b"a", container, enc, len(body), bytes(body))

    body = bytearray()
    _encode_ndarray(np.array(5), body)
    with pytest.raises(CodecError, match="batch dimension"):
        decode_frame(frame_with(C_NDARRAY, E_ARRAY, body))
    body = bytearray()
    _encode_tensor(torch.tensor(5), body)
    with pytest.raises(CodecError, match="batch dimension"):
        decode_frame(frame_with(C_TENSOR, E_TENSOR, body))
    body = bytearray()
    _encode_tensor(torch.tensor([5]), body)
    with pytest.raises(CodecError, match="does not fit"):
        decode_frame(frame_with(C_LIST, E_TENSOR, body))
    with pytest.raises(CodecError, match="does not fit"):
        decode_frame(frame_with(C_TENSOR, E_STR, bytearray(_u64(0))))


# --------------------------------------------------------------------------------------------- encoding anything


class _Boom(Exception):
    pass


class _Exploding:
    """Every hook raises: __len__, __iter__, __eq__, __hash__, __index__, __reduce__, __array__, ..."""

    def _boom(self, *_: Any, **__: Any) -> Any:
        raise _Boom("boom")

    __len__ = __iter__ = __eq__ = __hash__ = __index__ = __reduce__ = __reduce_ex__ = __bool__ = _boom
    __getitem__ = __float__ = __int__ = __array__ = _boom

    def __repr__(self) -> str:
        return "<_Exploding>"


class _LyingClass:
    """``isinstance`` consults ``__class__``, which raises here (kept out of hypothesis: it reprs examples)."""

    @property
    def __class__(self) -> Any:  # type: ignore[override]
        raise _Boom("class")


class _ExplodingList(list):  # type: ignore[type-arg]
    def __iter__(self) -> Any:
        raise _Boom("iter")

    def __len__(self) -> int:
        raise _Boom("len")


class _IntSub(int):
    pass


class _StrSub(str):
    pass


class _Color(enum.IntEnum):
    RED = 1


def _generator() -> Iterator[int]:
    yield 1


def _odd_objects() -> list[Any]:
    out: list[Any] = [
        object(),
        _Exploding(),
        _ExplodingList([1, 2]),
        _IntSub(3),
        _StrSub("s"),
        _Color.RED,
        {1, 2},
        frozenset({"a"}),
        1 + 2j,
        bytearray(b"ab"),
        memoryview(b"ab"),
        _generator(),
        lambda: 1,
        type,
        Ellipsis,
        NotImplemented,
        slice(1, 2),
        range(3),
        collections.deque([1]),
        collections.OrderedDict(a=1),
        array.array("q", [1, 2]),
        10**5000,
        -(10**5000),
        2**64,
        float("nan"),
        "\udcff\ud800",
        np.datetime64("2020-01-01"),
        np.timedelta64(3, "s"),
        np.array(["2020-01-01"], dtype="datetime64[D]"),
        np.zeros(2, dtype=[("a", "<i4")]),
        np.zeros(2, dtype=[("a", object)]),
        np.zeros((2, 2), dtype="V3"),
        np.void(b"abc"),
        np.ma.masked_array([1, 2], mask=[1, 0]),
        np.ma.masked,
        np.matrix([[1, 2]]),
        np.array([object()], dtype=object),
        np.fromiter([1, _Exploding()], dtype=object, count=2).reshape(1, 2),
        np.zeros((1,) * 33),
        np.float128(1) if hasattr(np, "float128") else np.longdouble(1),
        torch.zeros(3).to_sparse(),
        torch.zeros(3, device="meta"),
        torch.zeros(2, dtype=torch.complex32) if hasattr(torch, "complex32") else torch.zeros(2),
        torch.zeros(2, dtype=torch.uint16) if hasattr(torch, "uint16") else torch.zeros(2),
        torch.zeros(2, dtype=torch.float8_e4m3fn) if hasattr(torch, "float8_e4m3fn") else torch.zeros(2),
        torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
        torch.ones(3).as_subclass(_TensorSub),
        torch.nn.Parameter(torch.ones(2)),
    ]
    if Image is not None:
        out += [Image.new("RGB", (2, 2)), Image.new("I;16N", (2, 1)), Image.new("P", (1, 1)), Image.new("1", (9, 2))]
    recursive: list[Any] = [1]
    recursive.append(recursive)
    out.append(recursive)
    d: dict[Any, Any] = {}
    d["self"] = d
    out.append(d)
    return out


class _TensorSub(torch.Tensor):
    pass


with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # experimental / deprecated tensor kinds
    ODD = _odd_objects()


def _odd(i: int) -> Any:
    return ODD[i]


odd = st.integers(0, len(ODD) - 1).map(_odd)  # (sampled_from would repr them all up front)
anything = st.recursive(
    st.one_of(leaves, odd),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=3).map(tuple)
        | st.lists(inner, min_size=1, max_size=3).map(lambda xs: np.fromiter(xs, dtype=object, count=len(xs)))
        | st.dictionaries(st.one_of(st.text(max_size=3), st.integers(-3, 3)), inner, max_size=3)
    ),
    max_leaves=8,
)


def _has_image(value: Any, depth: int = 0) -> bool:
    if Image is None or depth > 20:
        return False
    if isinstance(value, Image.Image):
        return True
    if type(value) in (list, tuple):
        return any(_has_image(v, depth + 1) for v in value)
    if type(value) is dict:
        return any(_has_image(v, depth + 1) for v in value.values())
    if type(value) is np.ndarray and value.dtype == object:
        return any(_has_image(v, depth + 1) for v in value.reshape(-1))
    return False


def only_unsupported(encode: Callable[[], Any]) -> bool:
    """Run an encoding; True if it succeeded, False if it raised UnsupportedTypeError. Anything else fails."""
    try:
        encode()
    except UnsupportedTypeError:
        return False
    except SyncRewardError:
        return False
    except BaseException as e:
        raise AssertionError(f"{type(e).__name__}: {e} escaped the encoder") from e
    return True


@FUZZ
@given(anything, st.booleans())
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_encoding_any_object_raises_only_unsupported_type_error(value: Any, allow_pickle: bool) -> None:
    out = bytearray()
    if only_unsupported(lambda: encode_value(value, out, allow_pickle=allow_pickle)) and not allow_pickle:
        decode_value(bytes(out))  # what encodes, decodes


@FUZZ
@given(st.lists(anything, min_size=1, max_size=4), st.none() | odd)
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_encoding_any_column_raises_only_unsupported_type_error(values: list[Any], column: Any) -> None:
    """As columns: lists of anything, and the odd objects themselves as whole columns (when per-sample)."""
    cases: list[tuple[int, Any]] = [(C_LIST, values), (C_TUPLE, tuple(values))]
    if column is not None:
        container = container_of(column)
        if container is not None:
            cases.append((container, column))
    for container, vals in cases:
        try:
            n = len(vals)
        except Exception:
            n = 2
        col = Column("c\udcff", container, vals)
        ok = only_unsupported(lambda col=col, n=n: encode_frame([col], n))  # type: ignore[misc]
        plain = is_plain(vals, container)
        assert plain == ok or (ok and _has_image(vals)), (container, vals)  # images travel, yet are not plain
        dropped: list[str] = []
        frame = encode_frame([col], n, droppable=frozenset({col.name}), dropped=dropped)  # never raises
        assert dropped == ([] if plain else [col.name])  # a droppable column travels if and only if plain
        decode_frame(bytes(frame))


# --------------------------------------------------------------------------------------------- integer columns

int_cells = st.one_of(
    st.integers(0, 255),
    st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 200_000),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**70), 2**70),
)
odd_cells = st.one_of(
    st.booleans(), st.sampled_from([np.int64(1), np.int32(-1), np.uint8(3), 1.0, None, "1", _Color.RED, _IntSub(2)])
)


@FUZZ
@given(
    st.lists(st.lists(int_cells, max_size=12), min_size=1, max_size=8),
    st.lists(st.tuples(st.integers(0, 7), st.integers(0, 12), odd_cells), max_size=2),
)
@example([[True]], [])
@example([[0, 1], [2]], [(0, 1, True)])
@example([[2**31 - 1, -(2**31)], [2**31]], [])
def test_int_list_columns_round_trip_exactly(rows: list[list[Any]], inserts: list[tuple[int, int, Any]]) -> None:
    """Token-id columns: narrow dtypes, empty rows, negatives, > int32, and bool/numpy/float cells mixed in."""
    for r, i, v in inserts:
        rows[r % len(rows)].insert(i, v)
    pure = all(type(x) is int and -(2**63) <= x < 2**63 for row in rows for x in row)
    for container, column in ((C_LIST, rows), (C_TUPLE, tuple(rows))):
        if any(isinstance(x, (_Color, _IntSub)) for row in rows for x in row):  # int subclasses: refused, not cast
            with pytest.raises(UnsupportedTypeError, match=r"_Color|_IntSub"):
                encode_frame([Column("ids", container, column)], len(rows))
            continue
        frame = encode_frame([Column("ids", container, column)], len(rows))
        _, cols, _ = decode_frame(bytes(frame))
        assert same(list(cols[0].values), list(column))
        body = bytearray()
        assert (_encode_column_body(column, container, body, False) == E_INTLISTS) == pure
        flat = [x for row in rows for x in row]
        if pure and flat:
            assert len(body) <= 8 + 16 + 8 * len(rows) + 8 + 8 * len(flat)
        # the path that does not use marshal's records writes the very same bytes
        codec._MARSHAL_RECORDS = False
        try:
            assert encode_frame([Column("ids", container, column)], len(rows)) == frame
        finally:
            codec._MARSHAL_RECORDS = True


def test_encoding_an_object_whose_class_lookup_raises() -> None:
    for allow_pickle in (False, True):
        assert not only_unsupported(lambda a=allow_pickle: encode_value([_LyingClass()], bytearray(), allow_pickle=a))
        col = Column("c", C_LIST, [_LyingClass()])
        assert not only_unsupported(lambda a=allow_pickle, c=col: encode_frame([c], 1, allow_pickle=a))
    assert not is_plain([_LyingClass()], C_LIST)
