"""The mode contract: what a mode author writes, and what the framework does around it.

A mode says who scores which samples and who gets which rows; it moves nothing by hand. An author writes
one class and registers one instance (:func:`syncreward._modes.register`, or a line in ``MODES``):

* ``name`` -- the ``mode=`` string; ``options`` -- the :class:`ModeOption` s only this mode takes
  (name, type, default, check): the decorator checks them, refuses them for other modes, and puts the
  ones given into the call's identity; :meth:`Mode.check` -- a check across them (optional);
* :meth:`Mode.prepare` -- on the caller's thread: this rank's :class:`~syncreward._call.Payload`
  (default: every column encoded);
* :meth:`Mode.route_inputs` -- in the call's inputs turn: exchange the inputs (``_transfers.exchange``,
  ``_transfers.link``), return the mode's :class:`Scoring` (whether this rank scores, with which arguments,
  and what :meth:`Mode.route_results` needs);
* :meth:`Mode.route_results` -- in the call's results turn: results (or the function's error) back to
  the ranks that own the samples; return this rank's results.

A gathering mode (:class:`GatherMode`: its scoring ranks get the whole batch) writes less: ``route``
(whose payload goes where), ``scores_here``, ``proxies`` (what ``log_extra``/``log_metric`` become) and
``route_results``; :meth:`GatherMode.send_results`/:meth:`GatherMode.read_results` are its result transfer.

Two rules, both kept by the framework rather than by each mode:

* **local work goes through** :func:`local`. Decoding, slicing, building frames: any exception (a
  ``KeyboardInterrupt`` included) becomes a :class:`~syncreward._outcome.LocalError`, this rank's failure,
  which the mode hands to its next transfer (a transfer's ``Error`` is every rank's). No mode file catches
  ``BaseException`` itself;
* **lockstep**: every rank enters every transfer of the call, the one that failed included -- a failure is
  what it sends. The framework (:func:`inputs_turn`, :func:`results_turn`) refuses a ``LocalError``
  returned from ``route_inputs`` (never sent: the other ranks would go on) by breaking the group at once
  with a :class:`ModeContractError` naming the mode, instead of a hang; a ``LocalError`` returned from
  ``route_results`` (after the call's last transfer) is this rank's alone, and the framework makes this
  rank's next call tell every rank (``_transfers.lost``).

An exception that escapes a hook is a transport failure and breaks the session. A mode file imports
neither ``_codec`` nor ``_wire``: no frame layout, status row or result block is its business.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from .._batch import read_frame, rebuild_result
from .._call import Call, Hooks, Inputs, Payload
from .._errors import CodecError, ModeContractError
from .._exchange import OUTBOUND, Inbound, exchange_results
from .._logs import Logs
from .._options import Options
from .._outcome import Error, LocalError, Outcome, Value, local
from .._transfers import device, encode, exchange, inputs, link, lost, merge, record

__all__ = [
    "GatherMode",
    "GatherScoring",
    "Mode",
    "ModeOption",
    "Scoring",
    "inputs_turn",
    "local",
    "results_turn",
]

T = TypeVar("T")


@dataclass(frozen=True)
class ModeOption:
    """One option a mode declares: the decorator's keyword, its type as the signature spells it, default, check.

    ``check(value)`` returns why a value is refused (``None``: accepted); it runs at decoration time on a
    value other than the default. ``column``: the value names a per-sample column the mode reads itself
    (``group_by=``): it travels whether the function reads it or not, and may not be a shared argument.
    """

    name: str
    type: str
    default: Any = None
    check: Callable[[Any], str | None] | None = None
    column: bool = False


@dataclass(eq=False)  # never changed after it is made (not frozen: made on every call)
class Scoring:
    """What the call's inputs turn gave this rank: whether it scores, and with which arguments.

    Each mode extends it with the state its :meth:`Mode.route_results` needs.
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
    options: tuple[ModeOption, ...] = ()  # the options only this mode takes (the decorator refuses them elsewhere)
    # whether one rank's shared arguments score other ranks' samples, so every rank must pass the same ones
    # (checked in the call's header: ``Call.shared``)
    shares_arguments = True

    def check(self, values: Mapping[str, Any]) -> None:
        """Raise ``ValueError`` for a combination of this mode's options it cannot run with (decoration time).

        ``values``: each declared option's value (given, or its default); each was checked on its own already.
        """

    def option(self, options: Options, name: str) -> Any:
        """The value of this mode's option ``name`` in ``options`` (its declared default where not given)."""
        for k, v in options.mode_options:
            if k == name:
                return v
        return next(o.default for o in self.options if o.name == name)

    def prepare(self, call: Call) -> Payload:
        return encode(call)

    def route_inputs(self, call: Call, payload: Outcome[Payload]) -> Value[S] | Error:
        raise NotImplementedError

    def route_results(self, call: Call, scoring: S, result: Outcome[Any]) -> Outcome[Any]:
        raise NotImplementedError


def inputs_turn(mode: Hooks, call: Call, payload: Outcome[Payload]) -> Value[Any] | Error:
    """The call's inputs turn: ``mode.route_inputs``, held to the lockstep rule (see the module docstring)."""
    got = mode.route_inputs(call, payload)
    if isinstance(got, LocalError):
        raise ModeContractError(
            f"mode {mode.name!r} returned this rank's own failure from route_inputs without sending it "
            f"({type(got.error).__name__}: {got.error}), so the other ranks would go on without it. HINT: a bug in "
            "the mode: hand a failure of local() to the call's next transfer (every rank enters every transfer)."
        ) from got.error
    return got


def results_turn(mode: Hooks, call: Call, scoring: Any, result: Outcome[Any]) -> Outcome[Any]:
    """The call's results turn: ``mode.route_results``; a failure after its last transfer is told at the next call."""
    got = mode.route_results(call, scoring, result)
    return lost(call, got.error) if isinstance(got, LocalError) else got


@dataclass(eq=False)
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

    root: int | None = None  # the one rank every payload goes to (``route`` says so), if there is one

    def route(self, world_size: int) -> np.ndarray:
        """``route[src, dst]``: whether ``src``'s payload goes to ``dst``."""
        raise NotImplementedError

    def scores_here(self, call: Call) -> bool:
        raise NotImplementedError

    def proxies(self, call: Call, logs: Logs, inbound: Inbound) -> dict[str, Any]:
        raise NotImplementedError

    def route_inputs(self, call: Call, payload: Outcome[Payload]) -> Value[GatherScoring] | Error:
        got = exchange(call, payload, self.route(call.world_size), root=self.root)
        if isinstance(got, Error):
            return got
        return Value(self.scoring_for(call, got.value, self.gather(call, got.value)))

    def gather(self, call: Call, got: Inbound) -> Value[dict[str, Any]] | Error | None:
        """The global columns, where this rank scores (``None`` elsewhere; an ``Error`` if decoding failed)."""
        if not self.scores_here(call) or not got.ok:  # (a gathered inbound's verdict: raised with the results)
            return None
        return local(merge, call, got, got.frames, dict(enumerate(got.counts)), lambda v, c: v)

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
        this rank's inputs, which :meth:`Mode.route_results` sends as its failure whether or not this rank scores.
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
        return exchange_results(link(call, OUTBOUND), call.fp, call.seq, scoring.inbound, bodies, record=rec, root=root)

    def read_results(self, call: Call, inbound: Inbound, body: bytes, root: int) -> Outcome[Any]:
        """This rank's results, from the body ``root`` sent it: rows checked, log records replayed, on its device.

        After the call's last transfer: a failure here is a ``LocalError`` (told at this rank's next call).
        """
        return local(self._read, call, inbound, body, root)

    def _read(self, call: Call, inbound: Inbound, body: bytes, root: int) -> Any:
        nrows, cols, meta = read_frame(body, call.spec.options.allow_pickle)
        if nrows != inbound.counts[call.rank]:
            raise CodecError(f"rank {root} sent {nrows} results for {inbound.counts[call.rank]} samples")
        records = meta.get("logs")
        if records:  # most calls log nothing
            Logs(call.bound, call.spec.name).replay(records)
        return rebuild_result(meta.get("keys"), cols, device(call))
