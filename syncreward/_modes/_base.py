"""The mode contract: four hooks, and the gathering modes' shared half.

A mode says who scores which samples and who gets which rows. It is one file in ``_modes/`` plus one
line in the registry (``_modes/__init__.py``), and implements four hooks. The lifecycle
(``_lifecycle``) calls the last three in this order, each exactly once per call:

* :meth:`Mode.check` -- at decoration time: the options that are the mode's own (``group_size``);
* :meth:`Mode.prepare` -- on the caller's thread, before the call's turn: encode this rank's columns
  into a :class:`~syncreward._call.Payload`. A failure becomes the call's ``Error`` outcome and travels
  as a status, so every rank raises;
* :meth:`Mode.inbound` -- in the call's inbound turn: exchange inputs; return the mode's
  :class:`Scoring` (whether this rank scores, with which arguments, and the mode's own state for
  ``outbound``) or an ``Error`` that every rank raises;
* :meth:`Mode.outbound` -- in the call's outbound turn: route results (or the error) back to the
  ranks that own the samples; return this rank's results or an ``Error``.

A mode moves data only through the call's transfers (``_call.exchange``, ``_call.link``: the
``_exchange`` procedures) and the column plumbing of ``_batch`` (merging frames, splitting results):
it never sees a frame layout, a status row or a result block.

Every hook returns an outcome (``_outcome``); none raises for a reason that only this rank knows: what
this rank's own work inside a hook raises (decoding, slicing results -- a ``KeyboardInterrupt``
included) is caught and travels as its failure. An exception that escapes a hook is a transport
failure and breaks the session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from .._batch import read_frame, rebuild_result
from .._call import Call, Inputs, Payload, device, encode, exchange, inputs, link, lost, merge, record
from .._errors import CodecError
from .._exchange import OUTBOUND, Inbound, exchange_results
from .._logs import Logs
from .._options import Options
from .._outcome import Error, Outcome, Value

__all__ = ["GatherMode", "GatherScoring", "Mode", "Scoring"]


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
        return encode(call)

    def inbound(self, call: Call, payload: Outcome[Payload]) -> Value[S] | Error:
        raise NotImplementedError

    def outbound(self, call: Call, scoring: S, result: Outcome[Any]) -> Outcome[Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class GatherScoring(Scoring):
    """A gathering mode's scoring: the inbound it came from, and whether an earlier call's gather served it."""

    inbound: Inbound
    reused: bool = False  # scored on what an earlier call gathered (a reward group's hit): no headers checked it


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

    def inbound(self, call: Call, payload: Outcome[Payload]) -> Value[GatherScoring] | Error:
        got = exchange(call, payload, self.route(call.world_size))
        if isinstance(got, Error):
            return got
        return Value(self.scoring_for(call, got.value, self.gather(call, got.value)))

    def gather(self, call: Call, got: Inbound) -> Value[dict[str, Any]] | Error | None:
        """The global columns, where this rank scores (``None`` elsewhere; an ``Error`` if decoding failed)."""
        if not self.scores_here(call):
            return None
        try:
            return Value(merge(call, got, got.frames, dict(enumerate(got.counts)), lambda v, c: v))
        except BaseException as e:
            return Error(e)

    def scoring_for(
        self, call: Call, inbound: Inbound, values: Value[dict[str, Any]] | Error | None, reused: bool = False
    ) -> GatherScoring:
        """This rank's scoring inputs: the global ``values`` (or why they could not be had) and log stand-ins."""
        if values is None or not self.scores_here(call):
            return GatherScoring(None, None, inbound, reused)
        logs = Logs(call.bound, call.spec.name)
        if isinstance(values, Error):
            return GatherScoring(values, logs, inbound, reused)
        got = inputs(call, inbound, values.value, lambda: self.proxies(call, logs, inbound))
        return GatherScoring(got, logs, inbound, reused)

    def failed_scoring(self, call: Call, inbound: Inbound, failure: Error) -> GatherScoring:
        """A reward group's hit whose call failed on this rank before its turn (``failure``): nothing is scored here.

        Every rank's call is a hit (no inbound exchange), so ``failure`` travels in the result exchange: as
        this rank's inputs, which :meth:`outbound` sends as its failure whether or not this rank scores.
        """
        logs = Logs(call.bound, call.spec.name) if self.scores_here(call) else None
        return GatherScoring(failure, logs, inbound, reused=True)

    def send_results(
        self,
        call: Call,
        scoring: GatherScoring,
        bodies: Mapping[int, bytes | bytearray] | BaseException | None,
        root: int,
    ) -> Value[bytes] | Error:
        """Rank ``root``'s result bodies, or its failure, to every other rank; return this rank's body.

        ``bodies`` (on ``root`` only: ``None`` elsewhere) are the frames of ``_batch.split_result``, or the
        failure every rank must then raise: ``root`` enters this even when its scoring failed. Where an
        earlier call's gather served this one (a reward group's hit: no inbound header checked it), every
        rank's record of the call travels too, so every rank raises if the ranks made different calls, or
        if the call failed on a rank before its turn (:meth:`failed_scoring`).
        """
        rec = record(call) if scoring.reused else None
        if call.rank != root and scoring.reused and isinstance(scoring.inputs, Error):
            bodies = scoring.inputs.error  # this rank's own failure (``failed_scoring``): its record says so
        return exchange_results(
            link(call, OUTBOUND), call.fp, call.seq, scoring.inbound.counts, bodies, record=rec, root=root
        )

    def read_results(self, call: Call, inbound: Inbound, body: bytes, root: int) -> Outcome[Any]:
        """This rank's results, from the body ``root`` sent it: rows checked, log records replayed, on its device."""
        try:
            nrows, cols, meta = read_frame(body, call.spec.options.allow_pickle)
            if nrows != inbound.counts[call.rank]:
                raise CodecError(f"rank {root} sent {nrows} results for {inbound.counts[call.rank]} samples")
            Logs(call.bound, call.spec.name).replay(meta.get("logs", ()))
            return Value(rebuild_result(meta.get("keys"), cols, device(call)))
        except BaseException as e:  # everything was exchanged: a local failure, told at this rank's next call
            return lost(call, e)
