"""What every mode shares: a decorated function's spec, one call's prepared data, the mode contract.

A mode decides who scores which samples and how inputs and results move. It is one file in
``_modes/`` plus one line in the registry (``_modes/__init__.py``), and implements four hooks. The
lifecycle (``_lifecycle``) calls the last three in this order, each exactly once per call:

* :meth:`Mode.check` -- at decoration time: the options that are the mode's own (``group_size``);
* :meth:`Mode.prepare` -- on the caller's thread, before the call's turn: encode this rank's columns
  into a :class:`Payload`. A failure becomes the call's ``Error`` outcome and travels as a status, so
  every rank raises;
* :meth:`Mode.inbound` -- in the call's inbound turn: exchange inputs; return the mode's
  :class:`Scoring` (whether this rank scores, with which arguments, and the mode's own state for
  ``outbound``) or an ``Error`` that every rank raises;
* :meth:`Mode.outbound` -- in the call's outbound turn: route results (or the error) back to the
  ranks that own the samples; return this rank's results or an ``Error``.

Every hook returns an outcome (``_outcome``); none raises for a reason that only this rank knows: what
this rank's own work inside a hook raises (decoding, slicing results -- a ``KeyboardInterrupt``
included) is caught and travels as its failure. An exception that escapes a hook is a transport
failure and breaks the session.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from .._batch import concat
from .._binding import Binder, Bound
from .._codec import C_TENSOR, CONTAINERS, decode_frame, encode_frame
from .._errors import CodecError, MismatchError
from .._exchange import SITE, Inbound, disagreement, exchange_inbound
from .._identity import Identity, Site, owner_config
from .._logs import Logs
from .._options import Options
from .._outcome import Error, Outcome, Value
from .._session import Session
from .._wire import FAILED, NO_STEP, OK, CallCheck, SharedValues, drop_mask, error_blob, fingerprint, pack_header

__all__ = ["Call", "GatherMode", "GatherScoring", "Mode", "Payload", "Scoring", "Spec"]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]  # the positional and keyword arguments the function is scored with
_NOTHING_SHARED = SharedValues({})  # a call without shared arguments to check (TRL's: only trainer_state and logs)


@dataclass(frozen=True)
class Spec:
    """Everything about a decorated function that does not change between calls."""

    fn: Callable[..., Any]
    name: str
    identity: Identity  # the reward's name, configuration and ``__name__`` (``_identity``), alike on every rank
    options: Options
    binder: Binder
    impl: Mode[Any]  # the mode object that runs the calls (a reward group's members share one)

    @property
    def key(self) -> str:
        o = self.options
        group = f", group_size={o.group_size}" if o.group_size else ""
        group += f", group_by={o.group_by!r}" if o.group_by else ""
        pickle = ", allow_pickle=True" if o.allow_pickle else ""
        return f"{self.identity.key()}(mode={o.mode!r}{group}{pickle})"


@dataclass(frozen=True)
class Payload:
    """What a call sends in its inbound exchange, made by :meth:`Mode.prepare` on the caller's thread."""

    frame: bytes | bytearray = b""  # the encoded columns (or what the mode sends first: shard's group keys)
    dropped: tuple[str, ...] = ()  # the ``**kwargs`` columns this rank leaves behind (non-plain data)


@dataclass(frozen=True, eq=False)
class Call:
    """One synced call on this rank, as prepared before its turn: never changed afterwards.

    Built by :meth:`open`, with what the call's own preparation produced (its :class:`Payload`, or this
    rank's failure) returned beside it, not stored in it: the lifecycle hands that outcome to
    :meth:`Mode.inbound`.
    """

    spec: Spec
    session: Session
    seq: int
    site: Site  # where the call comes from (``_identity.call_site``): its ``key`` is part of the fingerprint
    bound: Bound | None  # None: binding the arguments failed
    fp: int
    description: str
    shared: SharedValues  # the shared arguments every rank must pass alike (their digest is in the header)
    # (none in a mode where every rank scores with its own: ``Mode.shares_arguments``)

    @classmethod
    def open(
        cls,
        spec: Spec,
        session: Session,
        seq: int,
        site: Site,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        problem: str | None,
    ) -> tuple[Call, Value[Payload] | Error]:
        """Bind the arguments, fingerprint the call, let the mode prepare its payload (or fail: an ``Error``)."""
        try:
            if problem is not None:
                raise MismatchError(problem)
            bound = spec.binder.bind(args, kwargs)
        except Exception as e:
            return cls.unbound(spec, session, seq, site), Error(e)
        call = cls._of(spec, session, seq, site, bound)
        try:  # before the turn: an interrupt is raised at once (the lifecycle finishes the call)
            return call, Value(spec.impl.prepare(call))
        except Exception as e:
            return call, Error(e)

    @classmethod
    def unbound(cls, spec: Spec, session: Session, seq: int, site: Site) -> Call:
        """A call whose arguments could not be bound (it can only fail, on every rank)."""
        return cls._of(spec, session, seq, site, None)

    @classmethod
    def _of(cls, spec: Spec, session: Session, seq: int, site: Site, bound: Bound | None) -> Call:
        cols = ", ".join(f"{c.name}:{CONTAINERS[c.container]}" for c in bound.columns) if bound else "?"
        key = spec.key
        if bound is not None and spec.identity.method and "self" in bound.shared:  # @synced_reward on a method
            key = f"{key} of self{owner_config(bound.shared['self'])}"
        schema = f"{key} per-sample columns [{cols}]{SITE}"
        step = bound.step if bound is not None else NO_STEP
        at = f" at step {step}" if step != NO_STEP else ""
        checked = None
        if bound is not None and spec.impl.shares_arguments:
            unchecked = spec.binder.unchecked
            if not bound.shared.keys() <= unchecked:  # TRL's calls: only unchecked ones, nothing to hash
                checked = {k: v for k, v in bound.shared.items() if k not in unchecked}
        shared = SharedValues(checked) if checked else _NOTHING_SHARED  # hashed here: before the call's turn
        # the path-independent site is compared; the user's file and line are shown (they may differ per rank)
        fp = fingerprint(schema + site.key)
        return cls(spec, session, seq, site, bound, fp, f"call #{seq}{at}: {schema}{site.shown}", shared)

    @property
    def rank(self) -> int:
        return self.session.rank

    @property
    def world_size(self) -> int:
        return self.session.world_size

    @property
    def timeout(self) -> float:
        return self.spec.options.timeout

    @property
    def step(self) -> int:
        return self.bound.step if self.bound is not None else NO_STEP

    @cached_property
    def names(self) -> list[str]:
        return [c.name for c in self.bound.columns] if self.bound is not None else []

    @property
    def droppable(self) -> frozenset[str]:
        return self.bound.droppable if self.bound is not None else frozenset()

    def check(self) -> CallCheck:
        """What this rank says of this call where no inbound header checked it."""
        desc = len(self.description.encode("utf-8", "backslashreplace"))
        return CallCheck(self.fp, self.seq, self.step, self.shared.digest, desc)

    def disagreement(self, checks: Sequence[CallCheck], channel: int) -> Error | None:
        """Whether the ranks' check records (``checks``, in rank order) name this call (``_exchange.disagreement``)."""
        return disagreement(
            self.session, checks, self.description, channel, self.timeout, shared=self.shared, function=self.spec.name
        )

    def encode(self) -> Payload:
        """Encode every column (``**kwargs`` columns that hold non-plain data are left behind, not refused)."""
        assert self.bound is not None
        dropped: list[str] = []
        frame = encode_frame(
            self.bound.columns,
            self.bound.n,
            allow_pickle=self.spec.options.allow_pickle,
            droppable=self.droppable,
            dropped=dropped,
            function=self.spec.name,
        )
        return Payload(frame, tuple(dropped))

    def exchange(self, own: Outcome[Payload], route: np.ndarray | None, aux: int = 0) -> Value[Inbound] | Error:
        """The inbound exchange of this call (``_exchange.exchange_inbound``).

        ``own`` is this call's payload, or this rank's failure (which then travels instead); the payload
        goes where ``route`` says (``None``: no payload travels, only the header).
        """
        payload: bytes | bytearray
        dropped: tuple[str, ...]
        if isinstance(own, Error):
            error: BaseException | None = own.error
            blob, payload, dropped = error_blob(own.error), b"", ()
        else:
            error, blob, dropped = None, b"", own.value.dropped
            payload = own.value.frame if route is not None else b""
        ok = error is None
        return exchange_inbound(
            self.session,
            header=self.header(ok, len(payload) if ok else len(blob), aux, dropped),
            payload=payload,
            route=route,
            error=error,
            blob=blob,
            description=self.description,
            names=self.names,
            droppable=self.droppable,
            timeout=self.timeout,
            function=self.spec.name,
            shared=self.shared,
        )

    def header(self, ok: bool, size: int, aux: int, dropped: Sequence[str]) -> bytes:
        """This call's header (``_wire``): ``size`` bytes of payload, or of this rank's error when not ``ok``."""
        return pack_header(
            seq=self.seq,
            status=OK if ok else FAILED,
            fp=self.fp,
            step=self.step,
            n=self.bound.n if self.bound is not None and ok else 0,
            size=size,
            desc=len(self.description.encode("utf-8", "backslashreplace")),
            aux=aux,
            mask=drop_mask(self.names, dropped),
            shared=self.shared.digest,
        )

    def merge(
        self,
        inbound: Inbound,
        frames: Mapping[int, Any],
        rows: Mapping[int, int],
        own: Callable[[Any, int], Any],
    ) -> dict[str, Any]:
        """Decode the given ranks' frames and concatenate every column in rank order.

        ``rows[s]`` is the number of samples expected from rank ``s`` (in rank order); this rank's own part
        of a column is ``own(values, container)`` (its local column, or the rows of it that stay here).
        Columns some rank left behind (``inbound.dropped``) are skipped.
        """
        assert self.bound is not None
        dropped = inbound.dropped
        decoded: dict[int, dict[str, Any]] = {}
        for s in rows:
            if s == self.rank:
                continue
            nrows, cols, _ = decode_frame(frames[s], allow_pickle=self.spec.options.allow_pickle, skip=dropped)
            if nrows != rows[s]:
                raise CodecError(f"rank {s} sent {nrows} rows but announced {rows[s]}")
            decoded[s] = {c.name: c.values for c in cols}
        values: dict[str, Any] = {}
        for col in self.bound.columns:
            if col.name in dropped:
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

    def inputs(
        self, inbound: Inbound, values: dict[str, Any], proxies: Callable[[], dict[str, Any]]
    ) -> Value[Inputs] | Error:
        """The function's arguments: the global ``values``, the log stand-ins, placeholders for dropped columns."""
        assert self.bound is not None
        try:
            return Value(self.bound.call_args({**values, **proxies()}, inbound.dropped))
        except BaseException as e:
            return Error(e)

    def device(self) -> torch.device | None:
        """Where tensors returned to this rank go: the device of its tensor inputs, else the current GPU."""
        if self.bound is not None:
            for c in self.bound.columns:
                if c.container == C_TENSOR:
                    return c.values.device  # type: ignore[no-any-return]
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            return torch.device("cuda", torch.cuda.current_device())
        return None


@dataclass(frozen=True)
class Scoring:
    """What a call's inbound exchange gave this rank: whether it scores, and with which arguments.

    Each mode extends it with the state its :meth:`Mode.outbound` needs.
    """

    inputs: Value[Inputs] | Error | None  # None: this rank does not score; Error: its inputs failed here
    logs: Logs | None

    @property
    def scores(self) -> bool:
        return self.inputs is not None


S = TypeVar("S", bound=Scoring)


class Mode(Generic[S]):
    """A way of spreading a call's scoring over the ranks (see the module docstring); ``S``: its scoring state."""

    name = ""
    own_options: frozenset[str] = frozenset()  # options only this mode takes (others refuse them)
    # whether one rank's shared arguments score other ranks' samples, so every rank must pass the same ones
    # (checked in the call's header: ``Call.shared``)
    shares_arguments = True

    def check(self, options: Options) -> None:
        """Raise ``ValueError`` for options this mode cannot run with (at decoration time)."""
        for option in ("group_size", "group_by"):
            if option not in self.own_options and getattr(options, option) is not None:
                raise ValueError("group_size/group_by only apply to mode='shard'")

    def prepare(self, call: Call) -> Payload:
        return call.encode()

    def inbound(self, call: Call, own: Outcome[Payload]) -> Value[S] | Error:
        raise NotImplementedError

    def outbound(self, call: Call, scoring: S, result: Outcome[Any]) -> Outcome[Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class GatherScoring(Scoring):
    """A gathering mode's scoring: the inbound it came from, and whether an earlier call's gather served it."""

    inbound: Inbound
    shared: bool = False  # scored on what an earlier call gathered (a reward group's hit): no headers checked it


class GatherMode(Mode[GatherScoring]):
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

    def inbound(self, call: Call, own: Outcome[Payload]) -> Value[GatherScoring] | Error:
        got = call.exchange(own, self.route(call.world_size))
        if isinstance(got, Error):
            return got
        return Value(self.scoring_for(call, got.value, self.gather(call, got.value)))

    def gather(self, call: Call, got: Inbound) -> Value[dict[str, Any]] | Error | None:
        """The global columns, where this rank scores (``None`` elsewhere; an ``Error`` if decoding failed)."""
        if not self.scores_here(call):
            return None
        try:
            return Value(call.merge(got, got.frames, dict(enumerate(got.counts)), lambda v, c: v))
        except BaseException as e:
            return Error(e)

    def scoring_for(
        self, call: Call, inbound: Inbound, values: Value[dict[str, Any]] | Error | None, shared: bool = False
    ) -> GatherScoring:
        """This rank's scoring inputs: the global ``values`` (or why they could not be had) and log stand-ins."""
        if values is None or not self.scores_here(call):
            return GatherScoring(None, None, inbound, shared)
        logs = Logs(call.bound, call.spec.name)
        if isinstance(values, Error):
            return GatherScoring(values, logs, inbound, shared)
        inputs = call.inputs(inbound, values.value, lambda: self.proxies(call, logs, inbound))
        return GatherScoring(inputs, logs, inbound, shared)
