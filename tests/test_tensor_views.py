"""Tensor and array views travel as their values: lazy views -- conjugate (``x.conj()``) and negative
(``x.conj().imag``, ``torch._neg_view``) -- are resolved, and strided views of any supported dtype (one sample of
``logits[:, 1]``, steps, transposes, expands, numpy's negative strides) are read in C order."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _helpers import same

from syncreward import synced_reward
from syncreward._codec import (
    C_NDARRAY,
    C_TENSOR,
    Column,
    decode_frame,
    decode_value,
    encode_frame,
    encode_value,
    is_plain,
)
from syncreward.testing import run_ranks, run_threads

_X = torch.tensor([[1 + 2j, -3.5 - 0.25j], [0j, complex("nan+1j")]], dtype=torch.complex64)

VIEWS = {
    "conj": lambda: _X.conj(),
    "conj-complex128": lambda: _X.to(torch.complex128).conj(),
    "conj-imag": lambda: _X.conj().imag,  # a negative view of float32
    "conj-real": lambda: _X.conj().real,
    "neg-view": lambda: torch._neg_view(torch.arange(6, dtype=torch.float64).reshape(2, 3)),
    "conj-transposed": lambda: _X.conj().T,
    "conj-of-neg": lambda: torch._neg_view(_X).conj(),
    "empty-conj": lambda: torch.zeros(0, 3, dtype=torch.complex64).conj(),
}


def _resolved(t: torch.Tensor) -> torch.Tensor:
    return t.resolve_conj().resolve_neg().clone()


@pytest.mark.parametrize("name", VIEWS)
def test_views_round_trip_as_their_values(name: str) -> None:
    view = VIEWS[name]()
    out = bytearray()
    encode_value(view, out)
    back = decode_value(bytes(out))
    assert not back.is_conj()
    assert not back.is_neg()
    assert same(back, _resolved(view))
    np.testing.assert_array_equal(back.numpy(), view.resolve_conj().resolve_neg().numpy())


@pytest.mark.parametrize("name", VIEWS)
def test_view_columns_round_trip(name: str) -> None:
    view = VIEWS[name]()
    assert is_plain(view, C_TENSOR)
    _, (col,), _ = decode_frame(bytes(encode_frame([Column("t", C_TENSOR, view)], len(view))))
    assert same(col.values, _resolved(view))


def test_encoding_a_view_leaves_it_a_view() -> None:
    view = _X.conj()
    encode_value([view, view.imag], bytearray())
    assert view.is_conj()
    assert view.imag.is_neg()
    assert same(view.resolve_conj(), torch.conj_physical(_X))


# --------------------------------------------------------------------- strided views of any supported dtype
# A view of one element keeps its stride: ``contiguous()`` does not copy it (a size-1 dimension is contiguous
# whatever its stride), so reading its bytes as uint8 used to fail with "stride(-1) must be 1 to view Float as
# Byte". A reward model's ``logits[:, 1]`` on a rank with one sample is such a view.

_LOGITS = torch.tensor([[0.25, -1.5]])
STRIDED = {
    "logits[:, 1] of one sample": lambda: _LOGITS[:, 1],
    "scores[:, 0] of one sample": lambda: torch.arange(3.0).reshape(1, 3)[:, 0],
    "bfloat16 logits[:, 1]": lambda: _LOGITS.bfloat16()[:, 1],
    "int64 ids[:, -1]": lambda: torch.arange(4).reshape(1, 4)[:, -1],
    "conj().imag of one sample": lambda: _X[:1, 0].conj().imag,
    "imag of one sample": lambda: _X[:1, 1].imag,
    "real of one sample": lambda: _X[1:, 1].real,
    "one-sample 2-d view": lambda: torch.arange(12.0).reshape(1, 3, 4)[:, 1:2, 2],
    "negative view of one element": lambda: torch._neg_view(torch.arange(6.0).reshape(2, 3))[:1, 2],
    "expanded negative view": lambda: torch._neg_view(torch.arange(4.0).reshape(2, 2))[:1, 1:].expand(2, 1),
    "every other of two": lambda: torch.arange(4.0)[::2],
    "transposed": lambda: torch.arange(6.0).reshape(2, 3).T,
}


def _dense(t: torch.Tensor) -> torch.Tensor:
    return t.resolve_conj().resolve_neg().clone(memory_format=torch.contiguous_format)


@pytest.mark.parametrize("name", STRIDED)
def test_strided_views_of_any_supported_dtype_round_trip(name: str) -> None:
    view = STRIDED[name]()
    out = bytearray()
    encode_value(view, out)
    assert same(decode_value(bytes(out)), _dense(view))
    _, (col,), _ = decode_frame(bytes(encode_frame([Column("t", C_TENSOR, view)], len(view))))
    assert same(col.values, _dense(view))


def test_strided_views_of_any_supported_dtype_round_trip_in_a_random_sweep() -> None:
    """Slices with steps, transposes, selects, expands, conjugate and negative views, of every dtype."""
    rng = np.random.default_rng(23)
    dtypes = [torch.float32, torch.bfloat16, torch.float16, torch.complex64, torch.bool, torch.int16, torch.uint8]
    for trial in range(400):
        shape = [int(rng.choice([1, 1, 2, 3])) for _ in range(int(rng.integers(1, 4)))]
        dtype = dtypes[trial % len(dtypes)]
        base = torch.from_numpy(rng.normal(size=[2 * s + 1 for s in shape]) * 5)
        t = base > 0 if dtype is torch.bool else base.to(dtype)
        t = t[tuple(slice(int(rng.integers(0, 2)), None, int(rng.choice([1, 2]))) for _ in shape)]
        if t.dim() > 1 and rng.random() < 0.3:
            t = t.transpose(0, -1)
        if t.is_complex() and rng.random() < 0.5:
            t = t.conj()
            if rng.random() < 0.5:
                t = t.imag
        if t.dim() > 1 and rng.random() < 0.3:
            t = t.select(int(rng.integers(0, t.dim())), 0)
        if rng.random() < 0.2:
            t = t.unsqueeze(0).expand(2, *t.shape)
        out = bytearray()
        encode_value([t, t[:1]], out)
        back = decode_value(bytes(out))
        assert same(back[0], _dense(t)), (trial, t.shape, t.stride())
        assert same(back[1], _dense(t[:1])), (trial, t.shape, t.stride())


NUMPY_VIEWS = {
    "negative strides": lambda: np.arange(5.0)[::-1],
    "negative 2-d": lambda: np.arange(12, dtype=np.int16).reshape(3, 4)[::-1, ::-2],
    "every other column": lambda: np.arange(20).reshape(4, 5)[:, ::2],
    "one sample [:, 1]": lambda: np.array([[0.25, -1.5]], dtype=np.float32)[:, 1],
    "Fortran order": lambda: np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "broadcast": lambda: np.broadcast_to(np.arange(3), (4, 3)),
    "big-endian reversed": lambda: np.arange(4, dtype=">i4")[::-1],
    "imag of complex": lambda: (np.arange(4) * (1 + 2j))[::-1].imag,
    "str reversed": lambda: np.array(["ab", "c", "def"])[::-1],
}


@pytest.mark.parametrize("name", NUMPY_VIEWS)
def test_numpy_views_round_trip_as_their_values(name: str) -> None:
    view = NUMPY_VIEWS[name]()
    out = bytearray()
    encode_value(view, out)
    assert same(decode_value(bytes(out)), np.ascontiguousarray(view))
    _, (col,), _ = decode_frame(bytes(encode_frame([Column("a", C_NDARRAY, view)], len(view))))
    assert same(col.values, np.ascontiguousarray(view))


# A synced call with one sample per rank: a strided column in, a strided result out. Module level: the gloo
# ranks of run_ranks import this module.


def _picks(scores: torch.Tensor, phase: torch.Tensor, **kwargs: object) -> torch.Tensor:
    logits = torch.stack([scores * 2, scores + phase], dim=1)
    return logits[:, 1]  # stride 2: each rank's one-sample slice of it is a strided view of one element


def _strided_body(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    scores = torch.tensor([[float(rank), 10.0 + rank, 20.0]])[:, 1]
    phase = torch.tensor([1j * (rank + 1)], dtype=torch.complex64)[:1].conj().imag
    return {
        mode: synced_reward(mode=mode, timeout=60, **({"group_size": 1} if mode == "shard" else {}))(_picks)(
            scores=scores, phase=phase
        )
        for mode in ("main", "replicate", "shard")
    }


def _check_strided(results: list[dict[str, torch.Tensor]]) -> None:
    for rank, got in enumerate(results):
        want = torch.tensor([10.0 + rank - (rank + 1)])
        for mode, value in got.items():
            assert same(value, want), (rank, mode, value, want)


def test_one_sample_strided_views_travel_as_inputs_and_results_on_threads() -> None:
    _check_strided(run_threads(_strided_body, 2, timeout=60))


@pytest.mark.multiprocess
def test_one_sample_strided_views_travel_as_inputs_and_results_on_gloo_ranks() -> None:
    _check_strided(run_ranks(_strided_body, 2, timeout=120))
