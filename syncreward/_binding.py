"""Argument binding: split a call's arguments into per-sample columns and shared values.

A *per-sample column* holds one entry per local sample: a list, a tuple, a numpy array or a tensor
whose first dimension is the local batch size. Everything else -- TRL's ``trainer_state``,
``log_extra`` and ``log_metric``, scalars, strings, dicts, callables -- is *shared* and passed through
as it is (in ``mode="main"`` the scoring rank's own shared values are used).

Which per-sample columns travel:

* parameters the function names (``def f(completions, solution, **kwargs)``) always travel; one holding
  objects the wire cannot carry is an error (unless ``allow_pickle=True``);
* a column that only reaches ``**kwargs`` (TRL passes every dataset column) does not travel at all when
  the function provably never reads its ``**kwargs`` (``_reads.readable_in``, decided from the code
  that runs, again when a function's ``__code__`` is replaced; in a reward group, when no member can read
  it): it is not encoded, not sent, not checked across ranks, and in the function's ``**kwargs`` it is a
  :class:`NotSynced` placeholder;
* the other ``**kwargs`` columns travel when they hold plain data; ones holding other objects -- a VLM
  dataset's PIL ``image`` column, TRL's ``environments`` -- are left behind and the function receives a
  :class:`NotSynced` placeholder that raises a clear error when used, so it can never silently see a
  local-only column next to a global batch;
* ``include=[...]`` limits the ``**kwargs`` columns to the ones named (and makes them travel, read or
  not), ``exclude=[...]`` leaves columns behind, ``shared=[...]`` marks sequence arguments that are not
  per-sample (e.g. a list of weights).

An iterator (a generator, ``map``, ``zip``), a set or a dict view is neither: an iterator can be read
only once (it could be neither sent nor checked), and a set has no order to match its entries with the
samples. Unless ``shared=`` names it, such an argument is refused with a hint to pass a list.

Shared values are one value for the whole batch, which is scored with one rank's value, so every rank
must pass the same ones: the plain ones are checked across ranks (``_shared.SharedValues``), except TRL's
(``TRL_SHARED``: objects) and the ``exclude=``d names -- a value that differs between ranks on purpose
(a device, a rank index), of which the scoring rank then uses its own.
"""

from __future__ import annotations

import inspect
import operator
import types
from collections.abc import Callable, Collection, Iterator, Sequence, Set, ValuesView
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._codec import C_TENSOR, Column, container_of
from ._errors import ColumnNotSyncedError, InputError
from ._reads import readable_in, running_function
from ._wire import NO_STEP

__all__ = ["TRL_SHARED", "Binder", "Bound", "NotSynced"]

_VAR_KEYWORD = inspect.Parameter.VAR_KEYWORD
_VAR_POSITIONAL = inspect.Parameter.VAR_POSITIONAL
_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_POSITIONAL_ONLY = inspect.Parameter.POSITIONAL_ONLY
_POSITIONAL_OR_KEYWORD = inspect.Parameter.POSITIONAL_OR_KEYWORD
_NAME = operator.attrgetter("name")  # a column's sort key (sorted in C, no Python call per column)

#: Arguments TRL's GRPOTrainer passes that are shared by the whole batch.
TRL_SHARED = frozenset({"trainer_state", "log_extra", "log_metric"})


# why a column that only reaches a **kwargs the function never reads is a NotSynced placeholder there: code the
# analysis cannot see (a helper reading the caller's frame) gets a clear error instead of a KeyError or a default
_UNREAD = "the function never reads its **kwargs, so a column that only reaches them stays on its rank"


class NotSynced:
    """Stands in for a per-sample column that was not gathered from the other ranks.

    Any use -- ``len()``, iteration, indexing, truth value -- raises :class:`ColumnNotSyncedError` naming
    the column and how to include it. ``repr()`` is safe, so logging ``kwargs`` does not fail.
    """

    __slots__ = ("_name", "_reason")

    def __init__(self, name: str, reason: str) -> None:
        self._name = name
        self._reason = reason

    def _fail(self, *_: object, **__: object) -> Any:
        raise ColumnNotSyncedError(
            f"column {self._name!r} was not exchanged between ranks ({self._reason}), so the synced function "
            f"cannot use it. HINT: name it as a parameter of the function or pass include=[{self._name!r}] "
            f"(and allow_pickle=True if it holds objects other than plain data)."
        )

    __len__ = __iter__ = __getitem__ = __bool__ = __contains__ = _fail
    __array__ = _fail

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._fail()

    def __repr__(self) -> str:
        return f"<NotSynced column {self._name!r}: {self._reason}>"


@dataclass
class Bound:
    """One call's arguments, split into per-sample columns and everything else."""

    arguments: dict[str, Any]
    """The call's arguments by parameter name (``**kwargs`` as one dict), as ``inspect`` binds them."""
    columns: list[Column]
    """Per-sample columns to exchange, sorted by name."""
    droppable: frozenset[str]
    """Columns that are left behind (not an error) if they hold non-plain data."""
    excluded: dict[str, str] = field(default_factory=dict)
    """Per-sample columns that do not travel, with the reason."""
    n: int = 0
    """Local batch size."""
    step: int = NO_STEP
    """The training step the call belongs to (see :func:`call_step`), part of the call's header."""
    shared: dict[str, Any] = field(default_factory=dict)
    """The arguments that are not per-sample columns, by name (``**kwargs`` ones by their key)."""
    kinds: dict[str, inspect._ParameterKind] = field(default_factory=dict)
    """Each parameter's kind (looked up once per function, not per call)."""
    signature: inspect.Signature | None = None
    """Set when the call passed positional arguments: they are passed positionally again."""
    unread_tensor: Any = None
    """A tensor column that did not travel (never read): its device is where tensor results go if no column is one."""

    def shared_value(self, name: str) -> Any:
        """A named argument, or one that reached ``**kwargs`` (``None`` if the call has none)."""
        args = self.arguments
        if name in args and self.kinds.get(name) is not _VAR_KEYWORD:
            return args[name]
        for pname, kind in self.kinds.items():
            if kind is _VAR_KEYWORD and pname in args:
                return args[pname].get(name)
        return None

    def call_args(
        self, values: dict[str, Any], dropped: Collection[str] = ()
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Positional and keyword arguments for calling the function with ``values`` as its columns."""
        reasons = dict(self.excluded)
        for name in dropped:
            reasons[name] = "it holds objects other than plain data on at least one rank"
        arguments: dict[str, Any] = {}
        for pname, value in self.arguments.items():
            kind = self.kinds[pname]
            if kind is _VAR_KEYWORD:
                arguments[pname] = {k: _pick(k, v, values, reasons) for k, v in value.items()}
            elif kind is _VAR_POSITIONAL:
                arguments[pname] = tuple(_pick(f"*{pname}[{i}]", v, values, reasons) for i, v in enumerate(value))
            else:
                arguments[pname] = _pick(pname, value, values, reasons)
        if self.signature is not None:  # called with positional arguments: keep them positional
            ba = inspect.BoundArguments(self.signature, arguments)  # type: ignore[arg-type]
            return ba.args, ba.kwargs
        kwargs: dict[str, Any] = {}
        for pname, value in arguments.items():
            if self.kinds[pname] is _VAR_KEYWORD:
                kwargs.update(value)
            else:
                kwargs[pname] = value
        return (), kwargs


def _pick(name: str, original: Any, values: dict[str, Any], reasons: dict[str, str]) -> Any:
    if name in values:
        return values[name]
    if name in reasons:
        return NotSynced(name, reasons[name])
    return original


def _readable_by(
    functions: Sequence[types.FunctionType | None], forced: frozenset[str]
) -> tuple[frozenset[str] | None, tuple[tuple[types.FunctionType, types.CodeType], ...]]:
    """The keyword names any of ``functions`` can read, with the ``forced`` ones (``None``: any name).

    Also the ``(function, code)`` pairs it was decided from; a ``None`` function is code that cannot be seen.
    """
    codes = tuple((f, f.__code__) for f in functions if f is not None)
    if len(codes) < len(functions):
        return None, codes
    names: set[str] = set(forced)
    for _, code in codes:
        got = readable_in(code)
        if got is None:
            return None, codes
        names |= got
    return frozenset(names), codes


def _names(option: str, value: Collection[str] | str | None) -> frozenset[str] | None:
    """An ``include``/``exclude``/``shared`` option as a set of names (one string is one name)."""
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset((value,))
    names = frozenset(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise TypeError(f"{option}= takes column names (str), got {bad!r}")
    return names


def _not_a_column(value: Any) -> str | None:
    """Why ``value`` (not a per-sample column) cannot be a shared value either, or ``None`` if it can."""
    if isinstance(value, Iterator):
        return "an iterator can be read only once, so it can be neither sent to the other ranks nor checked"
    if isinstance(value, (Set, ValuesView)):
        return "a set or a dict view has no order, so its entries cannot be matched with the samples"
    return None


def call_step(shared: dict[str, Any]) -> int:
    """The training step a call belongs to, from its shared arguments, or ``NO_STEP``.

    TRL passes ``trainer_state`` (its ``global_step``); a plain loop may pass ``global_step=`` or ``step=``
    as an int. Ranks whose calls carry different steps are not making the same call.
    """
    state = shared.get("trainer_state")
    step = getattr(state, "global_step", None) if state is not None else None
    if step is None:
        step = shared.get("global_step", shared.get("step"))
    if isinstance(step, (int, np.integer)) and not isinstance(step, bool) and 0 <= int(step) < 1 << 62:
        return int(step)
    return NO_STEP


class Binder:
    """Splits the arguments of calls to one function; built once per decorated function."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        include: Collection[str] | str | None,
        exclude: Collection[str] | str,
        shared: Collection[str] | str,
        function: str = "",
        readers: Sequence[Callable[..., Any]] = (),
        needed: Collection[str] = (),
    ) -> None:
        # readers: the functions whose readable keywords decide which **kwargs columns travel (a reward
        # group's members: what any member can read); fn alone by default. needed: the columns the library
        # itself reads (shard's group_by=), which travel whether the function reads them or not
        self.function = function or getattr(fn, "__qualname__", type(fn).__qualname__)
        self.signature = inspect.signature(fn)
        self.kinds = {name: p.kind for name, p in self.signature.parameters.items()}
        params = self.signature.parameters.values()
        self._var_keyword = next((p.name for p in params if p.kind is _VAR_KEYWORD), None)
        self._required = [p.name for p in params if p.default is p.empty and p.kind in _BY_NAME]
        self._positional = [p.name for p in params if p.kind in (_POSITIONAL_ONLY, _POSITIONAL_OR_KEYWORD)]
        # keyword-only calls (TRL's) bind without inspect when no parameter is positional-only or *args
        self._fast = all(p.kind in _BY_NAME or p.kind is _VAR_KEYWORD for p in params)
        self.include = _names("include", include)
        self.exclude = _names("exclude", exclude) or frozenset()
        user_shared = _names("shared", shared) or frozenset()
        self.shared = user_shared | (TRL_SHARED - (self.include or frozenset()))
        # the parameters a keyword column counts for by name (local_count): declared, and not shared
        self._named = frozenset(k for k, kind in self.kinds.items() if kind in _BY_NAME) - self.shared
        clash = self.shared & (self.include or frozenset())
        if clash:
            raise ValueError(f"columns {sorted(clash)} are both shared and included; pick one")
        # shared values never checked across ranks: TRL's objects, and what the user excluded on purpose
        self.unchecked = TRL_SHARED | self.exclude
        self._readers = tuple(readers or (fn,))
        self._forced = (self.include or frozenset()) | frozenset(needed)
        self._read_from: tuple[tuple[types.FunctionType, types.CodeType], ...] = ()
        self._readable: frozenset[str] | None = None
        self._analyse()

    def _analyse(self) -> frozenset[str] | None:
        readable, self._read_from = _readable_by([running_function(r) for r in self._readers], self._forced)
        self._readable = readable
        return readable

    @property
    def readable(self) -> frozenset[str] | None:
        """The ``**kwargs`` names that may travel (``None``: any); the others are never read, so never sent.

        Decided from the code that runs, and again when a function's ``__code__`` was replaced since
        (IPython's autoreload edits a function in place): the columns follow the code that runs.
        """
        for function, code in self._read_from:
            if function.__code__ is not code:
                return self._analyse()
        return self._readable

    def __getstate__(self) -> dict[str, Any]:
        # pickled (a synced reward shipped by value): what was decided travels, not the functions it was
        # decided from (a reward group's other members, which need not pickle); no re-analysis there
        state = dict(self.__dict__)
        state["_readers"] = state["_read_from"] = ()
        return state

    def _bind_keywords(self, kwargs: dict[str, Any]) -> dict[str, Any] | None:
        """``inspect``'s binding of a keyword-only call, or ``None`` to let ``inspect`` do it (and raise)."""
        if not self._fast:
            return None
        kinds, arguments = self.kinds, {}
        extra: dict[str, Any] = {}
        for k, v in kwargs.items():
            kind = kinds.get(k)
            if kind is not None and kind is not _VAR_KEYWORD:
                arguments[k] = v
            elif self._var_keyword is not None:
                extra[k] = v
            else:
                return None
        if any(name not in arguments for name in self._required):
            return None
        if extra:
            arguments[self._var_keyword] = extra  # type: ignore[index]
        return arguments

    def local_count(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
        """The local batch size :meth:`bind` would find (the first per-sample argument's length), cheaply.

        For checking a result in a single process, where nothing is bound; ``None`` without a per-sample
        argument. As :meth:`bind`: a column only a never-read ``**kwargs`` receives counts only when the call
        has no other.
        """
        shared = self.shared
        if args:
            positional = self._positional
            for i, v in enumerate(args):
                if (i >= len(positional) or positional[i] not in shared) and container_of(v) is not None:
                    return len(v)
        named = self._named
        for k, v in kwargs.items():  # TRL's calls: the first keyword is a named parameter's list
            if k in named:
                if type(v) is list or container_of(v) is not None:
                    return len(v)
                continue
            break
        else:
            return None
        readable, unread = self.readable, None
        for k, v in kwargs.items():
            if k not in shared and (type(v) is list or container_of(v) is not None):
                if k in named or readable is None or k in readable:
                    return len(v)
                unread = len(v) if unread is None else unread
        return unread

    def _slots(self, arguments: dict[str, Any]) -> Iterator[tuple[str, Any, bool]]:
        """Yield ``(name, value, named_by_function)`` for every argument of the call."""
        kinds = self.kinds
        for pname, value in arguments.items():
            kind = kinds[pname]
            if kind is _VAR_KEYWORD:
                for k, v in value.items():
                    yield k, v, False
            elif kind is _VAR_POSITIONAL:
                for i, v in enumerate(value):
                    yield f"*{pname}[{i}]", v, True
            else:
                yield pname, value, True

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
        """Bind a call's arguments and classify them.

        Raises:
            TypeError: the arguments do not fit the function's signature.
            InputError: per-sample columns of different lengths, or an ``include``d column that is not one.
        """
        arguments = None if args else self._bind_keywords(kwargs)
        positional = None
        if arguments is None:
            try:
                arguments = dict(self.signature.bind(*args, **kwargs).arguments)
            except TypeError as e:
                raise TypeError(self._misfit(e)) from None  # inspect's words alone name no function
            positional = self.signature if args else None
        columns: list[Column] = []
        droppable: set[str] = set()
        excluded: dict[str, str] = {}
        lengths: dict[str, int] = {}
        shared: dict[str, Any] = {}
        unread: dict[str, int] = {}  # **kwargs columns the function cannot read -> their lengths
        unread_tensor = None
        readable = self.readable
        for name, value, named in self._slots(arguments):
            if name in self.shared:
                shared[name] = value
                continue
            container = container_of(value)
            if not named and readable is not None and name not in readable:
                if container is not None:
                    unread[name] = len(value)
                    if container == C_TENSOR and unread_tensor is None:
                        unread_tensor = value
                    continue
                if _not_a_column(value) is not None:  # unreadable: neither refused nor checked
                    unread[name] = -1
                    continue
            if container is None:
                if (why := _not_a_column(value)) is not None:
                    raise InputError(
                        f"argument {name!r} of synced function {self.function!r} is a {type(value).__name__}, which "
                        f"is not a per-sample column: {why}. HINT: pass a list with one entry per sample "
                        f"(list(...)); if it is one value for the whole batch, pass shared=[{name!r}]."
                    )
                shared[name] = value
                if self.include is not None and name in self.include:
                    raise InputError(
                        f"include names {name!r}, but its value is a {type(value).__name__}, not a per-sample "
                        "column (a list, tuple, numpy array or tensor with one entry per sample)."
                    )
                continue
            lengths[name] = len(value)
            if name in self.exclude:
                excluded[name] = "it is in exclude"
                continue
            if not named and self.include is not None and name not in self.include:
                excluded[name] = "it is not in include"
                continue
            if not named and self.include is None:
                droppable.add(name)
            columns.append(Column(name, container, value))
        missing = self.include - {name for name, _, _ in self._slots(arguments)} if self.include else None
        if missing:
            raise InputError(f"include names {sorted(missing)}, but the call has no such argument")
        if unread:
            vk = self._var_keyword
            arguments[vk] = {  # type: ignore[index]
                k: NotSynced(k, _UNREAD) if k in unread else v
                for k, v in arguments[vk].items()  # type: ignore[index]
            }
            if not lengths:  # no column the function can read: the unread ones still say the batch size
                lengths = {k: v for k, v in unread.items() if v >= 0}
        if not lengths:
            raise InputError(
                "the synced function was called without any per-sample argument (a list, tuple, numpy array or "
                "tensor with one entry per sample), so there is no batch to gather. HINT: pass the batch as "
                "lists, e.g. f(completions=[...], ...)."
            )
        if len(set(lengths.values())) > 1:
            raise InputError(self._lengths_differ(lengths))
        columns.sort(key=_NAME)
        n = next(iter(lengths.values()))
        step = call_step(shared)
        return Bound(
            arguments, columns, frozenset(droppable), excluded, n, step, shared, self.kinds, positional, unread_tensor
        )

    def _misfit(self, e: TypeError) -> str:
        """What a call whose arguments do not fit the function's signature says (``e``: inspect's words)."""
        if str(e).startswith("missing"):
            hint = (
                "pass it on every rank (TRL passes each dataset column as a keyword argument: check that every "
                "rank's batch has that column), or give the parameter a default"
            )
        else:
            hint = "call it as its signature says (a **kwargs parameter takes the columns it does not name)"
        bare = self.signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in self.signature.parameters.values()],
            return_annotation=inspect.Signature.empty,
        )
        return (
            f"synced function {self.function!r} was called with arguments that do not fit its signature "
            f"{bare}: {e}. HINT: {hint}."
        )

    def _lengths_differ(self, lengths: dict[str, int]) -> str:
        """What per-sample columns of different lengths say; the hint names the odd ones out.

        The batch size is the length of TRL's own columns where the call has them, else the most common one.
        """
        listing = ", ".join(f"{k}={v}" for k, v in lengths.items())
        trl = [lengths[k] for k in ("completions", "prompts", "completion_ids") if k in lengths]
        counts = list(lengths.values())
        n = trl[0] if trl else max(counts, key=counts.count)
        odd = [k for k, v in lengths.items() if v != n]
        return (
            f"per-sample arguments of {self.function!r} have different lengths on this rank: {listing}. Every "
            f"per-sample column needs one entry per local sample ({n} here). HINT: if {', '.join(map(repr, odd))} "
            f"{'is' if len(odd) == 1 else 'are'} shared by all samples rather than per-sample, pass shared={odd!r} "
            f"to the synced_reward of {self.function!r}; otherwise pass one entry per sample."
        )
