"""Lazy tensor views -- conjugate (``x.conj()``) and negative (``x.conj().imag``, ``torch._neg_view``) -- travel
as their values: the codec resolves the view before reading the bytes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_codec import same

from syncreward._codec import C_TENSOR, Column, decode_frame, decode_value, encode_frame, encode_value, is_plain

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
