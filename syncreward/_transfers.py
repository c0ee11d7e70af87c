"""What a mode does with a call: its transfers, the gathered columns, the function's arguments.

The modes' toolbox, below the modes and above ``_exchange``/``_batch``: every mode does these the same
way with the call's record (``_call.Call``, which imports nothing of this module): :func:`link` (its
transfers on a channel, ``_exchange.Link``), :func:`exchange` (its inbound exchange: header and payload,
or this rank's failure), :func:`encode` / :func:`encodable_here` (its ``Payload``), :func:`merge` (the
gathered columns), :func:`inputs` (the function's arguments), :func:`device` (where its tensor results
go), :func:`record` (its ``CallCheck``), :func:`lost` (a failure after its last exchange).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from ._batch import CPU, encodable, merge_frames
from ._call import Call, Inputs, Payload
from ._codec import C_TENSOR, encode_frame
from ._exchange import INBOUND, Inbound, Link
from ._outcome import Error, Outcome, Value
from ._wire import FAILED, OK, CallCheck, drop_mask, error_blob, pack_header

__all__ = [
    "device",
    "encodable_here",
    "encode",
    "exchange",
    "inputs",
    "link",
    "lost",
    "merge",
    "record",
]

# The header's and check record's description size: unused (0). A mismatch gathers the descriptions' sizes
# itself (``Link.mismatch``), so no call encodes its description unless the ranks disagree.
_NO_DESC = 0


def lost(call: Call, error: BaseException) -> Error:
    """This rank failed after the call's last exchange (reading its results): its outcome here.

    The session notes it, so that this rank's next synced call tells the others (``Session.lose``).
    """
    call.session.lose(call.seq, call.spec.name, error)
    return Error(error)


def link(call: Call, channel: int) -> Link:
    """The call's transfers on ``channel`` (``_exchange.INBOUND`` or ``OUTBOUND``)."""
    return Link(call.session, channel, call.deadline, call.spec.name, call.description, call.shared)


def record(call: Call) -> CallCheck:
    """What this rank says of the call where no inbound header checked it (a reward group's hit)."""
    return CallCheck(call.fp, call.seq, call.step, call.shared.digest, _NO_DESC)


def encode(call: Call) -> Payload:
    """Encode every column (``**kwargs`` columns that hold non-plain data are left behind, not refused)."""
    assert call.bound is not None
    dropped: list[str] = []
    frame = encode_frame(
        call.bound.columns,
        call.bound.n,
        allow_pickle=call.spec.options.allow_pickle,
        droppable=call.droppable,
        dropped=dropped,
        function=call.spec.name,
    )
    return Payload(frame, tuple(dropped))


def encodable_here(call: Call) -> Payload:
    """An empty payload that leaves behind what :func:`encode` would (and refuses what it refuses).

    For a rank that scores its own columns as passed and sends nothing (``main``'s rank 0).
    """
    assert call.bound is not None
    o = call.spec.options
    return Payload(b"", encodable(call.bound.columns, call.bound.n, call.droppable, o.allow_pickle, call.spec.name))


def exchange(
    call: Call, payload: Outcome[Payload], route: np.ndarray | None, mode_word: int = 0, root: int | None = None
) -> Value[Inbound] | Error:
    """The inbound exchange of the call (``_exchange.Link.inbound``).

    ``payload`` is the call's payload, or this rank's failure (which then travels instead); the payload
    goes where ``route`` says (``None``: no payload travels, only the header). ``mode_word`` is the
    header word the mode fills (``_wire``'s ``H_MODE_WORD``): every rank reads every rank's. ``root``:
    ``route`` sends every payload to that rank alone, which alone needs the headers (``main``: the
    inbound is gathered there where the backend can, and its verdict comes with the results).
    """
    data: bytes | bytearray
    dropped: tuple[str, ...]
    if isinstance(payload, Error):
        error: BaseException | None = payload.error
        blob, data, dropped = error_blob(payload.error), b"", ()
    else:
        error, blob, dropped = None, b"", payload.value.dropped
        data = payload.value.frame if route is not None else b""
    ok = error is None
    return link(call, INBOUND).inbound(
        header=header(call, ok, len(data) if ok else len(blob), mode_word, dropped),
        payload=data,
        route=route,
        error=error,
        blob=blob,
        names=call.names,
        droppable=call.droppable,
        seq=call.seq,
        root=root,
        n=call.bound.n if call.bound is not None and ok else 0,
    )


def header(call: Call, ok: bool, size: int, mode_word: int, dropped: tuple[str, ...]) -> bytes:
    """The call's header (``_wire``): ``size`` bytes of payload, or of this rank's error when not ``ok``."""
    return pack_header(
        seq=call.seq,
        status=OK if ok else FAILED,
        fp=call.fp,
        step=call.step,
        n=call.bound.n if call.bound is not None and ok else 0,
        size=size,
        mode_word=mode_word,
        mask=drop_mask(call.names, dropped),
        shared=call.shared.digest,
    )


def merge(
    call: Call,
    inbound: Inbound,
    frames: Mapping[int, Any],
    rows: Mapping[int, int],
    local: Callable[[Any, int], Any],
) -> dict[str, Any]:
    """The given ranks' columns, decoded and concatenated in rank order (``_batch.merge_frames``).

    ``rows[s]`` samples are expected from rank ``s``; this rank's own part of a column is
    ``local(values, container)``. Columns some rank left behind (``inbound.dropped``) are skipped.
    """
    assert call.bound is not None
    o = call.spec.options
    return merge_frames(call.bound.columns, frames, rows, call.rank, local, inbound.dropped, o.allow_pickle)


def inputs(
    call: Call, inbound: Inbound, values: dict[str, Any], proxies: Callable[[], dict[str, Any]]
) -> Value[Inputs] | Error:
    """The function's arguments: the global ``values``, the log stand-ins, placeholders for dropped columns."""
    assert call.bound is not None
    try:
        return Value(call.bound.call_args({**values, **proxies()}, inbound.dropped))
    except BaseException as e:
        return Error(e)


def device(call: Call) -> torch.device:
    """The caller's device, where tensor results handed to this rank go (``_batch.place``).

    The device of its first tensor input column; without one, the current CUDA device where this
    process has initialised CUDA; else the CPU. Never the user's default device
    (``torch.set_default_device``): that is global state of the user's script, not of this call.
    """
    if call.bound is not None:
        for c in call.bound.columns:
            if c.container == C_TENSOR:
                return c.values.device  # type: ignore[no-any-return]
        if call.bound.unread_tensor is not None:  # a tensor column the function never reads stayed here
            return call.bound.unread_tensor.device  # type: ignore[no-any-return]
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return torch.device("cuda", torch.cuda.current_device())
    return CPU
