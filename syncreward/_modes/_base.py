"""What every mode shares: the options of a decorated function, one call's prepared data, the mode contract.

A mode decides who scores which samples and how inputs and results move. It implements three hooks,
which the lifecycle (``_lifecycle``) calls in this order, each exactly once per call:

* :meth:`Mode.prepare` -- on the caller's thread, before the call's turn: encode this rank's columns.
  A failure is recorded on the call (``call.error``) and travels as a status, so every rank raises;
* :meth:`Mode.inbound` -- in the call's channel-0 turn: exchange inputs; return :class:`Scoring`
  (whether this rank scores, and with which arguments) or a ``Raise`` that every rank raises;
* :meth:`Mode.outbound` -- in the call's channel-1 turn: route results (or the error) back to the
  ranks that own the samples; return this rank's results or a ``Raise``.

Hooks never raise for a reason that only this rank knows: such failures are statuses on the wire. An
exception that escapes a hook is a transport failure and breaks the session.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .._batch import concat
from .._binding import Binder, Bound
from .._codec import C_TENSOR, CONTAINERS, decode_frame, encode_frame
from .._errors import CodecError, MismatchError
from .._exchange import SITE, Inbound, exchange_inbound
from .._identity import Identity
from .._logs import Logs
from .._session import Raise, Session
from .._wire import FAILED, NO_STEP, OK, drop_mask, error_blob, fingerprint, pack_header

__all__ = ["Call", "GatherMode", "Mode", "Scoring", "Spec"]


@dataclass(frozen=True)
class Spec:
    """Everything about a decorated function that does not change between calls."""

    fn: Callable[..., Any]
    name: str
    identity: Identity  # what tells this reward from its siblings (``_identity``), the same on every rank
    mode: str
    timeout: float
    group_size: int | None
    group_by: str | None
    allow_pickle: bool
    binder: Binder
    impl: Mode  # the mode object that runs the calls (a reward group's members share one)

    @property
    def key(self) -> str:
        group = f", group_size={self.group_size}" if self.group_size else ""
        group += f", group_by={self.group_by!r}" if self.group_by else ""
        pickle = ", allow_pickle=True" if self.allow_pickle else ""
        return f"{self.identity.key()}(mode={self.mode!r}{group}{pickle})"


class Call:
    """One synced call on this rank: its sequence number, bound arguments, encoded payload, header fields."""

    def __init__(self, spec: Spec, session: Session, seq: int, site: str) -> None:
        self.spec = spec
        self.session = session
        self.seq = seq
        self.site = site  # where the call comes from (``_identity.call_site``): part of the fingerprint
        self.rank = session.rank
        self.world_size = session.world_size
        self.error: BaseException | None = None  # this rank's own failure before the exchange
        self.bound: Bound | None = None
        self.names: list[str] = []
        self.droppable: frozenset[str] = frozenset()
        self.frame: bytes | bytearray = b""
        self.dropped_local: list[str] = []
        self.dropped: frozenset[str] = frozenset()  # left behind on some rank (from the gathered headers)
        self.step = NO_STEP
        self.fp = 0
        self.description = ""
        self.blob = b""

    def prepare(self, mode: Mode, args: tuple[Any, ...], kwargs: dict[str, Any], problem: str | None) -> None:
        try:
            if problem is not None:
                raise MismatchError(problem)
            self.bound = self.spec.binder.bind(args, kwargs)
            self.names = [c.name for c in self.bound.columns]
            self.droppable = self.bound.droppable
            self.step = self.bound.step
            mode.prepare(self)
        except Exception as e:
            self.error = e
        cols = ", ".join(f"{c.name}:{CONTAINERS[c.container]}" for c in self.bound.columns) if self.bound else "?"
        schema = f"{self.spec.key} per-sample columns [{cols}]{SITE}{self.site}"
        self.fp = fingerprint(schema)
        step = f" at step {self.step}" if self.step != NO_STEP else ""
        self.description = f"call #{self.seq}{step}: {schema}"
        self.blob = error_blob(self.error) if self.error is not None else b""

    @property
    def timeout(self) -> float:
        return self.spec.timeout

    def encode(self) -> None:
        """Encode every column (``**kwargs`` columns that hold non-plain data are left behind, not refused)."""
        assert self.bound is not None
        self.frame = encode_frame(
            self.bound.columns,
            self.bound.n,
            allow_pickle=self.spec.allow_pickle,
            droppable=self.droppable,
            dropped=self.dropped_local,
        )

    def exchange(self, payload: bytes | bytearray, route: np.ndarray | None, aux: int = 0) -> Inbound | Raise:
        """The inbound exchange of this call (``_exchange.exchange_inbound``); sets :attr:`dropped`."""
        if self.error is not None:
            payload = b""
        got = exchange_inbound(
            self.session,
            header=self.header(len(payload), aux),
            payload=payload,
            route=route,
            error=self.error,
            blob=self.blob,
            description=self.description,
            names=self.names,
            droppable=self.droppable,
            timeout=self.timeout,
            function=self.spec.name,
        )
        if not isinstance(got, Raise):
            self.dropped = got.dropped
        return got

    def header(self, payload_bytes: int, aux: int = 0) -> bytes:
        ok = self.error is None
        return pack_header(
            seq=self.seq,
            status=OK if ok else FAILED,
            fp=self.fp,
            step=self.step,
            n=self.bound.n if self.bound is not None and ok else 0,
            size=payload_bytes if ok else len(self.blob),
            desc=len(self.description.encode("utf-8", "backslashreplace")),
            aux=aux,
            mask=drop_mask(self.names, self.dropped_local),
        )

    def merge(
        self, frames: Mapping[int, Any], rows: Mapping[int, int], own: Callable[[Any, int], Any]
    ) -> dict[str, Any]:
        """Decode the given ranks' frames and concatenate every column in rank order.

        ``rows[s]`` is the number of samples expected from rank ``s`` (in rank order); this rank's own part
        of a column is ``own(values, container)`` (its local column, or the rows of it that stay here).
        """
        assert self.bound is not None
        decoded: dict[int, dict[str, Any]] = {}
        for s in rows:
            if s == self.rank:
                continue
            nrows, cols, _ = decode_frame(frames[s], allow_pickle=self.spec.allow_pickle, skip=self.dropped)
            if nrows != rows[s]:
                raise CodecError(f"rank {s} sent {nrows} rows but announced {rows[s]}")
            decoded[s] = {c.name: c.values for c in cols}
        values: dict[str, Any] = {}
        for col in self.bound.columns:
            if col.name in self.dropped:
                continue
            parts = []
            for s in rows:
                if s == self.rank:
                    parts.append(own(col.values, col.container))
                elif col.name in decoded[s]:
                    parts.append(decoded[s][col.name])
                else:
                    raise CodecError(f"rank {s} did not send column {col.name!r}")
            device = col.values.device if col.container == C_TENSOR else None
            values[col.name] = concat(col.name, parts, col.container, device)
        return values

    def device(self) -> torch.device | None:
        """Where tensors returned to this rank go: the device of its tensor inputs, else the current GPU."""
        if self.bound is not None:
            for c in self.bound.columns:
                if c.container == C_TENSOR:
                    return c.values.device  # type: ignore[no-any-return]
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return torch.device("cuda", torch.cuda.current_device())
        return None


@dataclass
class Scoring:
    """The outcome of a call's inbound exchange on this rank."""

    scores: bool
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    error: BaseException | None = None  # preparing the scoring inputs failed here: travels as the result
    logs: Logs | None = None
    state: Any = None  # the mode's own data for outbound()
    values: dict[str, Any] | None = None  # the global columns this rank scores (gathering modes)
    shared: bool = False  # scored on what an earlier call gathered (a reward group's hit): no headers checked it


class Mode:
    """A way of spreading a call's scoring over the ranks (see the module docstring)."""

    name = ""

    def prepare(self, call: Call) -> None:
        call.encode()

    def inbound(self, call: Call) -> Scoring | Raise:
        raise NotImplementedError

    def outbound(self, call: Call, scoring: Scoring, result: Any, error: BaseException | None) -> Any:
        raise NotImplementedError


class GatherMode(Mode):
    """A mode whose scoring ranks get the whole batch (``main``, ``replicate``): one gather, then score.

    Subclasses say where payloads go (:meth:`route`), who scores (:meth:`scores_here`) and what
    ``log_extra``/``log_metric`` become (:meth:`proxies`). :meth:`scoring_for` builds a rank's scoring
    inputs from the global columns -- freshly gathered, or kept from an earlier call of a reward group.
    """

    def route(self, world_size: int) -> np.ndarray:
        """``route[src, dst]``: whether ``src``'s payload goes to ``dst``."""
        raise NotImplementedError

    def scores_here(self, call: Call) -> bool:
        raise NotImplementedError

    def proxies(self, call: Call, logs: Logs, inbound: Inbound) -> dict[str, Any]:
        raise NotImplementedError

    def inbound(self, call: Call) -> Scoring | Raise:
        got = call.exchange(call.frame, self.route(call.world_size))
        if isinstance(got, Raise):
            return got
        return self.scoring_for(call, got, self.gather(call, got))

    def gather(self, call: Call, got: Inbound) -> dict[str, Any] | Exception | None:
        """The global columns, where this rank scores (``None`` elsewhere; the exception if decoding failed)."""
        if not self.scores_here(call):
            return None
        try:
            return call.merge(got.frames, dict(enumerate(got.counts)), lambda v, c: v)
        except Exception as e:
            return e

    def scoring_for(self, call: Call, inbound: Inbound, values: dict[str, Any] | Exception | None) -> Scoring:
        """This rank's scoring inputs: the global ``values`` (or why they could not be had) and log stand-ins."""
        if not self.scores_here(call):
            return Scoring(scores=False, state=inbound)
        assert call.bound is not None
        logs = Logs(call.bound, call.spec.name)
        scoring = Scoring(scores=True, logs=logs, state=inbound, values=values if isinstance(values, dict) else None)
        if isinstance(values, Exception):
            scoring.error = values
            return scoring
        try:
            merged = {**(values or {}), **self.proxies(call, logs, inbound)}
            scoring.args, scoring.kwargs = call.bound.call_args(merged, call.dropped)
        except Exception as e:
            scoring.error = e
        return scoring
