"""``@synced_reward``: the decorator.

It checks the options once, at decoration time, and names the function the same way on every rank;
each call then goes to the lifecycle (``_lifecycle``), which reads top to bottom::

    decorator (this module) -> lifecycle (_lifecycle) -> mode (_modes/<mode>.py) -> wire (_wire, _exchange)
    -> backend (backends/)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Generic, Protocol, TypeVar, cast, overload

from typing_extensions import ParamSpec

from ._batch import check_result
from ._binding import Binder
from ._call import Spec
from ._identity import Identity, call_site, innermost, reward_target
from ._lifecycle import call_async, call_sync, nested
from ._modes import MODES
from ._modes._base import GatherMode
from ._modes._base import Mode as ModeImpl
from ._modes.group import GroupMode, reward_group
from ._options import DEFAULT_TIMEOUT, MAX_TIMEOUT, GatherModeName, ModeName, Options
from .backends import Backend
from .backends._cache import note_job
from .backends._resolve import BACKEND_NAMES, resolver, unknown_backend_message

__all__ = ["SyncedReward", "synced_reward", "synced_rewards"]

P = ParamSpec("P")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)


class SyncedReward(Protocol, Generic[P, R_co]):
    """The type of a synced reward: called as the function it wraps, which ``__wrapped__`` is.

    ``reward.__wrapped__(...)`` is the plain function, not synced: on one rank's samples alone it gives
    what that rank would compute without ``@synced_reward``.
    """

    __name__: str
    __qualname__: str

    @property
    def __wrapped__(self) -> Callable[P, R_co]: ...

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R_co: ...


def _stable_name(fn: Any) -> str:
    """The qualified name of the function or class behind ``fn``: the same in every process."""
    target = reward_target(fn)[0]
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return name if isinstance(name, str) else type(target).__qualname__


def _display_name(fn: Any) -> str:
    """The ``__name__`` TRL logs rewards by: the function's, or the callable instance's class's."""
    own = getattr(fn, "__name__", None)
    if isinstance(own, str):
        return own
    inner = innermost(fn)
    own = getattr(inner, "__name__", None)
    if isinstance(own, str):
        return own
    return type(inner).__name__


def _is_async(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine (as TRL's ``is_async_callable`` decides)."""
    inner = innermost(fn)
    return (
        inspect.iscoroutinefunction(inner)
        or inspect.iscoroutinefunction(vars(type(inner)).get("__call__"))
        or any(inspect.iscoroutinefunction(vars(k).get("__call__")) for k in type(inner).__mro__)
    )


def _check_options(options: Options, group: bool, given: dict[str, Any]) -> None:
    """Raise ``ValueError`` for options no call could run with: the one place options are checked.

    ``group``: the options of ``synced_rewards``, whose mode must gather the whole batch. ``given``: the
    mode options given (not their defaults); each is checked against the declaration of the chosen mode
    (``Mode.options``), which then checks them together (``Mode.check``).
    """
    mode, backend, timeout = options.mode, options.backend, options.timeout
    if group:
        gathering = tuple(name for name, m in MODES.items() if isinstance(m, GatherMode))
        if mode not in gathering:
            raise ValueError(f"synced_rewards() takes mode={' or '.join(map(repr, gathering))}, not {mode!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {tuple(MODES)}, not {mode!r}")
    chosen = MODES[mode]
    own = {o.name: o for o in chosen.options}
    for name, value in given.items():
        if name not in own:
            owners = [repr(m) for m, impl in MODES.items() if any(o.name == name for o in impl.options)]
            raise ValueError(f"{name}= only applies to mode={' or '.join(owners)}, not mode={mode!r}")
        check = own[name].check
        why = check(value) if check is not None else None
        if why is not None:
            raise ValueError(why)
    chosen.check({o.name: given.get(o.name, o.default) for o in chosen.options})
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_TIMEOUT:
        raise ValueError(
            f"timeout must be a number of seconds, more than 0 and at most {MAX_TIMEOUT:.0e} (about 115 days), "
            f"not {timeout!r}"
        )
    if isinstance(backend, str) and backend not in BACKEND_NAMES:
        raise ValueError(unknown_backend_message(backend))


def _mode_option_defaults() -> dict[str, Any]:
    """Every registered mode's declared options, with their defaults (read at decoration time: modes register)."""
    return {o.name: o.default for impl in MODES.values() for o in impl.options}


def _is_default(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def _not_a_function(decorator: str, value: object, params: dict[str, Any] | None = None) -> str:
    """What a positional argument that is not a reward function says (``@synced_reward("replicate")``).

    ``params``: the decorator's parameters; the options given as keywords beside it stay in the example
    (``@synced_reward("shard", group_size=4)`` -> ``@synced_reward(mode='shard', group_size=4)``).
    """
    if isinstance(value, str) and value in MODES:
        keyword = f"mode={value!r}"
    elif isinstance(value, str) and value in BACKEND_NAMES:
        keyword = f"backend={value!r}"
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        keyword = f"timeout={value!r}"
    else:
        keyword = ""
    eg = "" if keyword else "e.g. "
    keyword = keyword or "mode='replicate'"
    given = [f"{k}={v!r}" for k, v in _keywords_given(params or {}).items() if not keyword.startswith(f"{k}=")]
    keyword = ", ".join([keyword, *given])
    if decorator == "synced_reward":
        what, example = "the reward function as its only positional argument", f"@synced_reward({keyword})"
    else:
        what, example = "reward functions as its positional arguments", f"synced_rewards(f, g, {keyword})"
    return (
        f"{decorator}() takes {what}, not {value!r} (a {type(value).__name__}). HINT: pass options as "
        f"keywords: {eg}{example}."
    )


_FIELDS = tuple(f.name for f in dataclasses.fields(Options) if f.name != "mode_options")
_DEFAULTS = {name: f.default for f in dataclasses.fields(Options) if (name := f.name) in _FIELDS}


def _keywords_given(params: dict[str, Any]) -> dict[str, Any]:
    """The options among a decorator call's parameters that differ from their defaults, in signature order."""
    defaults = {**_DEFAULTS, **_mode_option_defaults()}
    return {
        name: value for name, value in params.items() if name in defaults and not _is_default(value, defaults[name])
    }


def _given(params: dict[str, Any], group: bool = False) -> Options:
    """The checked ``Options`` of a decorator call, from its parameters (its ``locals()`` before anything else).

    The signatures name exactly ``Options``' fields and the modes' declared options, with their types and
    defaults (``tests/test_decorator.py`` checks it), so no option is passed on by hand.
    """
    general = {name: params[name] for name in _FIELDS if name in params}
    defaults = _mode_option_defaults()
    given = {k: params[k] for k in defaults if k in params and not _is_default(params[k], defaults[k])}
    options = Options(**general, mode_options=tuple(given.items()))
    _check_options(options, group, given)
    note_job()  # a rank that leaves without making a synced call can then say so (docs/reliability.md, "Leaving")
    return options


@overload
def synced_reward(fn: Callable[P, R], /) -> SyncedReward[P, R]: ...


@overload
def synced_reward(
    *,
    mode: ModeName = "main",
    backend: str | Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    group_size: int | None = None,
    group_by: str | None = None,
    include: Collection[str] | str | None = None,
    exclude: Collection[str] | str = (),
    shared: Collection[str] | str = (),
    allow_pickle: bool = False,
    process_group: Any = None,
) -> Callable[[Callable[P, R]], SyncedReward[P, R]]: ...


def synced_reward(
    fn: Callable[P, R] | None = None,
    /,
    *,
    mode: ModeName = "main",
    backend: str | Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    group_size: int | None = None,
    group_by: str | None = None,
    include: Collection[str] | str | None = None,
    exclude: Collection[str] | str = (),
    shared: Collection[str] | str = (),
    allow_pickle: bool = False,
    process_group: Any = None,
) -> SyncedReward[P, R] | Callable[[Callable[P, R]], SyncedReward[P, R]]:
    """Make a reward function see the global batch on every rank, and return each rank its own slice.

    On every rank the wrapped function is called, as usual, with that rank's local samples. The
    per-sample arguments of all ranks are concatenated in rank order (the order of TRL's ``gather``),
    the function is scored on that global batch, and each rank gets back exactly the results of its own
    samples, in the container the function returned (list, tuple, numpy array, tensor on the caller's
    device, or a dict of those). Works on plain and ``async def`` functions; the wrapper keeps the
    function's name, docstring, signature and coroutine-ness.

    Args:
        fn: the reward function (when used bare, ``@synced_reward``).
        mode: ``"main"`` scores once on rank 0 while the others wait; ``"replicate"`` scores on every
            rank (for cheap deterministic functions; saves sending results back); ``"shard"`` spreads
            whole groups over the ranks (needs ``group_size`` or ``group_by``) for expensive functions
            that only compare samples within a group.
        backend: ``"auto"`` (resolved at call time: a joined Ray group, then accelerate, then
            torch.distributed, else one process), ``"local"``, ``"torch"``, ``"accelerate"``, ``"ray"``,
            or an object implementing ``Backend``.
        timeout: seconds one call may take on a rank, from the moment it is called to its results: one
            deadline per call, which every wait of the call (its turn, the others' inputs, the scoring
            rank's work and results) shares; default 1800 (30 minutes, torch.distributed's default). A
            rank that does not arrive in time is named in a ``SyncTimeoutError`` on every rank that did.
        group_size: with ``mode="shard"``: consecutive global samples form groups of this size (TRL's
            ``num_generations``).
        group_by: with ``mode="shard"``: samples with equal values in this per-sample column form a group,
            compared by content (any plain value: ``group_by="prompts"`` groups TRL's completions by prompt,
            plain-string or conversational).
        include: the ``**kwargs`` per-sample columns to gather from every rank (default: all that hold plain
            data). Parameters the function names are always gathered.
        exclude: per-sample columns not to gather; the function receives a
            ``NotSynced`` placeholder for them. A shared argument named here is not checked across
            ranks: for a value that differs between ranks on purpose (a device, a rank index).
        shared: sequence arguments that are not per-sample (passed through from the scoring rank).
            Every shared argument is one value for the whole batch: ranks that pass different plain
            values raise ``MismatchError`` on every rank (docs: Concepts, per-sample and shared arguments).
        allow_pickle: also carry arbitrary objects, with pickle. Unpickling runs code chosen by the
            sender: use only on clusters where every rank is trusted.
        process_group: with the torch backend, the data-parallel group to sync over (default: all ranks).

    Returns:
        The wrapped function (or a decorator, when called with options only).

    Raises:
        ValueError: invalid options (at decoration time).

    Examples:
        In one process the wrapped function is simply called (its result checked as on several ranks); on
        several ranks each rank passes its own completions and gets back its own rewards, computed over the
        global batch.

        >>> from syncreward import synced_reward
        >>> @synced_reward
        ... def rank_reward(completions, **kwargs):
        ...     order = sorted(range(len(completions)), key=lambda i: len(completions[i]))
        ...     ranks = {i: r for r, i in enumerate(order)}
        ...     return [ranks[i] / max(len(completions) - 1, 1) for i in range(len(completions))]
        >>> rank_reward(["a", "abc", "ab"])
        [0.0, 1.0, 0.5]
    """
    if fn is not None and not callable(fn):  # before the options: "shard" may be why they look wrong
        raise TypeError(_not_a_function("synced_reward", fn, locals()))
    options = _given(locals())

    def decorate(func: Callable[P, R]) -> SyncedReward[P, R]:
        return cast(SyncedReward[P, R], wrap(func, MODES[mode], options))

    if fn is not None:
        return decorate(fn)
    return decorate


def synced_rewards(
    *fns: Callable[..., Any],
    mode: GatherModeName = "main",
    backend: str | Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    include: Collection[str] | str | None = None,
    exclude: Collection[str] | str = (),
    shared: Collection[str] | str = (),
    allow_pickle: bool = False,
    process_group: Any = None,
) -> tuple[SyncedReward[..., Any], ...]:
    """Sync several reward functions as a group: the columns they all receive travel once per step.

    Each function becomes a synced reward exactly as with ``synced_reward``
    (same name, signature, coroutine-ness, results, errors). In addition, a call whose per-sample
    arguments are the very objects an earlier call of the group sent (TRL passes every reward of a step
    the same lists), at the same training step, does not gather them again: it is scored on the global
    columns that call gathered, and only its results travel. A call with other inputs gathers them as
    usual. Pass new list objects for new data rather than refilling a list in place.

    Args:
        *fns: the reward functions, plain or ``async def``, in any order.
        mode: ``"main"`` or ``"replicate"`` (see ``synced_reward``); shard mode has no group form.
        backend: as for ``synced_reward``.
        timeout: as for ``synced_reward``.
        include: as for ``synced_reward``, for every member.
        exclude: as for ``synced_reward``, for every member.
        shared: as for ``synced_reward``, for every member.
        allow_pickle: as for ``synced_reward``.
        process_group: as for ``synced_reward``.

    Returns:
        The synced functions, in the order given.

    Raises:
        ValueError: invalid options, or no function given.

    Examples:
        Two rewards of a step; in a job the second is scored on what the first gathered (in one
        process, as here, both are plain calls):

        >>> from syncreward import synced_rewards
        >>> def accuracy(completions, solution, **kwargs):
        ...     return [float(c.strip() == s) for c, s in zip(completions, solution)]
        >>> def brevity(completions, **kwargs):
        ...     longest = max(len(c) for c in completions)
        ...     return [1 - len(c) / longest for c in completions]
        >>> accuracy, brevity = synced_rewards(accuracy, brevity)
        >>> accuracy(["4", "5"], solution=["4", "4"]), brevity(["4", "55"])
        ([1.0, 0.0], [0.5, 0.0])
    """
    if not fns:
        raise ValueError("synced_rewards() needs at least one reward function")
    for fn in fns:
        if not callable(fn):
            raise TypeError(_not_a_function("synced_rewards", fn))
    options = _given(locals(), group=True)
    base = MODES[mode]
    assert isinstance(base, GatherMode)
    impl = GroupMode(base, reward_group())
    return tuple(wrap(fn, impl, options, readers=fns) for fn in fns)  # the group carries what any member reads


def wrap(func: Any, impl: ModeImpl[Any], options: Options, readers: Sequence[Any] = ()) -> Any:
    """The synced wrapper of one function; ``impl`` is the mode object that runs its calls.

    ``readers``: the functions whose readable ``**kwargs`` columns travel (a reward group's members), else ``func``.
    """
    if isinstance(func, (staticmethod, classmethod)):  # @synced_reward above @staticmethod / @classmethod
        return type(func)(wrap(func.__func__, impl, options, readers))
    backend, process_group = options.backend, options.process_group
    include, exclude, shared = options.include, options.exclude, options.shared
    display, name = _display_name(func), _stable_name(func)
    columns = {o.name: impl.option(options, o.name) for o in impl.options if o.column}  # the mode reads them itself
    needed = tuple(c for c in columns.values() if c is not None)
    binder = Binder(
        func, include=include, exclude=exclude, shared=shared, function=name, readers=readers, needed=needed
    )
    for option, column in columns.items():
        if column is not None and column in binder.shared:
            raise ValueError(f"{option}={column!r} names a shared argument; it must be a per-sample column")
    spec = Spec(
        fn=func,
        name=name,
        identity=Identity(func, display),
        options=dataclasses.replace(options, timeout=float(options.timeout)),
        binder=binder,
        impl=impl,
    )
    # made once: every call resolves its backend through it (a module function, and a partial of one: a
    # synced function shipped by value, cloudpickled, still pickles)
    resolve = resolver(backend, process_group)
    if _is_async(func):
        async_func = cast(Callable[..., Awaitable[Any]], func)

        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            if nested():  # inside a synced call the data is already global
                return await async_func(*args, **kwargs)
            be = resolve()
            if be.world_size == 1:  # checked as on several ranks, so a wrong result fails here too
                return check_result(await async_func(*args, **kwargs), binder.local_count(args, kwargs), name)
            return await call_async(spec, be, args, kwargs, call_site(sys._getframe(1)))

        wrapper: Callable[..., Any] = async_wrapper
    else:

        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            if nested():  # inside a synced call the data is already global
                return func(*args, **kwargs)
            be = resolve()
            if be.world_size == 1:  # checked as on several ranks, so a wrong result fails here too
                return check_result(func(*args, **kwargs), binder.local_count(args, kwargs), name)
            return call_sync(spec, be, args, kwargs, call_site(sys._getframe(1)))

        wrapper = sync_wrapper
    if inspect.isfunction(innermost(func)) or inspect.ismethod(innermost(func)):
        functools.update_wrapper(wrapper, func)
    else:  # a callable instance: its attributes stay on it, not on the wrapper
        functools.update_wrapper(wrapper, func, assigned=("__module__", "__doc__"), updated=())
    wrapper.__name__ = display
    if not isinstance(getattr(func, "__qualname__", None), str):
        wrapper.__qualname__ = wrapper.__name__
    spec.identity.named_by(wrapper)  # a name given to the synced function later is read at each call
    wrapper.__syncreward_spec__ = spec  # type: ignore[attr-defined]
    return wrapper
