"""One synced call on this rank: its record (:class:`Call`) and how it is built.

A :class:`Call` is a plain record, made once before the call's turn by :func:`open_call` (bind the
arguments, fingerprint the call, describe it, hash its shared arguments, let the mode prepare its
:class:`Payload`) and never changed afterwards. What a mode does with a call (its transfers, merging
the gathered columns, the function's arguments) is in ``_transfers``, below the modes: this module
imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any, Protocol

from ._binding import Binder, Bound
from ._codec import CONTAINERS
from ._deadline import Deadline
from ._description import Columns, Description
from ._errors import MismatchError
from ._identity import Identity, Site, owner_config
from ._options import Options
from ._outcome import Error, LocalError, Outcome, Value
from ._session import Session
from ._shared import SharedValues
from ._wire import NO_STEP, fingerprint

__all__ = [
    "Call",
    "Hooks",
    "Inputs",
    "Payload",
    "Spec",
    "open_call",
    "unbound_call",
]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]  # the positional and keyword arguments the function is scored with
_NOTHING_SHARED = SharedValues({})  # a call without shared arguments to check (TRL's: only trainer_state and logs)


class Hooks(Protocol):
    """What the lifecycle asks of a call's mode (``_modes._base.Mode``: the contract, documented there)."""

    name: str
    shares_arguments: bool

    def prepare(self, call: Call) -> Payload: ...

    def route_inputs(self, call: Call, payload: Outcome[Payload]) -> Value[Any] | Error: ...

    def route_results(self, call: Call, scoring: Any, result: Outcome[Any]) -> Outcome[Any]: ...


@dataclass(frozen=True)
class Spec:
    """Everything about a decorated function that does not change between calls."""

    fn: Callable[..., Any]
    name: str
    identity: Identity  # the reward's name, configuration and ``__name__`` (``_identity``), alike on every rank
    options: Options
    binder: Binder
    impl: Hooks  # the mode object that runs the calls (a reward group's members share one)

    @property
    def key(self) -> str:
        """The reward's identity with the options that make calls differ (shown in messages, fingerprinted).

        Made again only when the identity's text changes (the synced function was renamed): the same
        string object otherwise, read at every call.
        """
        identity = self.identity.key()
        made = self.__dict__.get("_key")
        if made is not None and made[0] is identity:
            return made[1]  # type: ignore[no-any-return]
        o = self.options
        own = "".join(f", {k}={v!r}" for k, v in o.mode_options)  # the mode's own options given (``Mode.options``)
        pickle = ", allow_pickle=True" if o.allow_pickle else ""
        key = f"{identity}(mode={o.mode!r}{own}{pickle})"
        self.__dict__["_key"] = (identity, key)  # a frozen record's cache, as functools.cached_property keeps one
        return key


@dataclass(frozen=True)
class Payload:
    """What a call sends in its inbound exchange, made by ``Mode.prepare`` on the caller's thread."""

    frame: bytes | bytearray = b""  # the encoded columns (or what the mode sends first: shard's group keys)
    dropped: tuple[str, ...] = ()  # the ``**kwargs`` columns this rank leaves behind (non-plain data)


@dataclass(eq=False)  # never changed, but not frozen: a frozen __init__ costs a call per field, every call
class Call:
    """One synced call on this rank, as prepared before its turn: never changed afterwards.

    What the call's own preparation produced (its :class:`Payload`, or this rank's failure) is returned
    beside it by :func:`open_call`, not stored in it: the lifecycle hands that outcome to ``Mode.inbound``.
    """

    spec: Spec
    session: Session
    seq: int
    site: Site  # where the call comes from (``_identity.call_site``): its ``key`` is part of the fingerprint
    bound: Bound | None  # None: binding the arguments failed
    fp: int
    description: Description  # what a mismatch shows every rank (``_description``)
    shared: SharedValues  # the shared arguments every rank must pass alike (their digest is in the header)
    # (none in a mode where every rank scores with its own: ``Mode.shares_arguments``)
    deadline: Deadline  # when the call must be over on this rank (``timeout=`` from its opening): every wait's end

    @property
    def rank(self) -> int:
        return self.session.rank

    @property
    def world_size(self) -> int:
        return self.session.world_size

    @property
    def step(self) -> int:
        return self.bound.step if self.bound is not None else NO_STEP

    @cached_property
    def names(self) -> list[str]:
        return [c.name for c in self.bound.columns] if self.bound is not None else []

    @property
    def droppable(self) -> frozenset[str]:
        return self.bound.droppable if self.bound is not None else frozenset()


def open_call(
    spec: Spec,
    session: Session,
    seq: int,
    site: Site,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    problem: str | None,
    deadline: Deadline,
) -> tuple[Call, Value[Payload] | Error]:
    """Bind the arguments, fingerprint the call, let the mode prepare its payload (or fail: a ``LocalError``).

    A failure here is this rank's alone until the call's inputs turn sends it: a ``LocalError``, which the
    framework refuses from ``route_inputs`` unsent (``_modes._base.inputs_turn``), as any other local failure.
    """
    # A failure only this rank knows of -- it failed to read an earlier call's results (``lost``), or this
    # call cannot be ordered safely (``problem``) -- is this call's failure, which tells every rank. The call
    # is still bound, so that it takes the path the other ranks' calls take (a reward group's hit has no
    # inbound exchange: the failure then travels in its result exchange).
    lost = session.take_lost()
    mine = lost if lost is not None else MismatchError(problem) if problem is not None else None
    try:
        bound = spec.binder.bind(args, kwargs)
    except Exception as e:
        return unbound_call(spec, session, seq, site, deadline), LocalError(mine if mine is not None else e)
    call = _build(spec, session, seq, site, bound, deadline)
    if mine is not None:
        return call, LocalError(mine)
    try:  # before the turn: an interrupt is raised at once (the lifecycle finishes the call)
        return call, Value(spec.impl.prepare(call))
    except Exception as e:
        return call, LocalError(e)


def unbound_call(spec: Spec, session: Session, seq: int, site: Site, deadline: Deadline) -> Call:
    """A call whose arguments could not be bound (it can only fail, on every rank)."""
    return _build(spec, session, seq, site, None, deadline)


def _build(spec: Spec, session: Session, seq: int, site: Site, bound: Bound | None, deadline: Deadline) -> Call:
    columns = tuple([(c.name, CONTAINERS[c.container]) for c in bound.columns]) if bound is not None else None
    key, digest = spec.key, spec.identity.digest
    if bound is not None and spec.identity.method and "self" in bound.shared:  # @synced_reward on a method
        config, owner = owner_config(bound.shared["self"])
        key, digest = f"{key} of self{config}", f"{digest}/{owner}"
    step = bound.step if bound is not None else NO_STEP
    checked = None
    if bound is not None and spec.impl.shares_arguments:
        unchecked = spec.binder.unchecked
        if not bound.shared.keys() <= unchecked:  # TRL's calls: only unchecked ones, nothing to hash
            checked = {k: v for k, v in bound.shared.items() if k not in unchecked}
    shared = SharedValues(checked) if checked else _NOTHING_SHARED  # hashed here: before the call's turn
    fp = _fingerprint(key, digest, columns, site.key)
    description = Description(seq, step, key, digest, columns, site.shown)
    return Call(spec, session, seq, site, bound, fp, description, shared, deadline)


@lru_cache(maxsize=256)
def _fingerprint(key: str, digest: str, columns: Columns | None, site: str) -> int:
    """The call's fingerprint: what it calls (``key``, ``digest``), with which columns, from which site.

    The path-independent ``site`` key is compared; the user's file and line are shown (they may differ per
    rank). Cached: a place calls one reward with one schema call after call, and its hash never changes.
    """
    schema = "\1".join(map("\0".join, columns)) if columns is not None else "?"
    return fingerprint(f"{key}\0{digest}\0{schema}\0{site}")
