"""``@synced_reward``: the decorator, and the path of one call.

The path of a call, on every rank::

    resolve backend -> (one process? call the function directly)
    bind arguments into per-sample columns + shared values, encode   (_binding, _codec)
    pre:   header + payload exchange                                  (_modes, _exchange, backends)
    score: the function, on the rank(s) the mode says                 (your code)
    post:  results back to the ranks that own them                    (_modes)
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar, cast, overload

from typing_extensions import ParamSpec

from ._binding import Binder
from ._exchange import get_link
from ._modes import MODES, Call, Spec, make_call
from .backends import Backend, resolve_backend

__all__ = ["synced_reward"]

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
Mode = Literal["main", "replicate", "shard"]

DEFAULT_TIMEOUT = 1800.0
"""Seconds a rank waits for the others in one exchange step (torch.distributed's default, 30 minutes)."""

# Exchanges of async synced calls run here so they never block the event loop. Each waiting exchange
# holds a thread, so the pool is generous; threads are created on demand.
_EXECUTOR = ThreadPoolExecutor(max_workers=64, thread_name_prefix="syncreward")


def _run_sync(call: Call, fn: Callable[..., Any]) -> Any:
    call.pre()
    result: Any = None
    error: BaseException | None = call.score_error
    if call.scores and error is None:
        try:
            result = fn(*call.args, **call.kwargs)
        except BaseException as e:  # shipped to the other ranks, then re-raised here by post()
            error = e
    return call.post(result, error)


def _finish_in_background(call: Call, error: BaseException) -> None:
    """Complete an abandoned (cancelled) call's outbound exchange so the other ranks are not left waiting."""

    def finish() -> None:
        try:
            call.post(None, error)
        except BaseException:  # the caller is gone; the other ranks get the error
            log.debug("background completion of cancelled synced call #%d", call.seq, exc_info=True)

    _EXECUTOR.submit(finish)


async def _run_async(call: Call, fn: Callable[..., Awaitable[Any]]) -> Any:
    loop = asyncio.get_running_loop()
    # The continuation of a cancelled call hangs off the executor's future, not the event loop's: the
    # loop may be closed (asyncio.run returned) before pre() completes, and its callbacks would never run.
    pre = _EXECUTOR.submit(call.pre)
    try:
        await asyncio.shield(asyncio.wrap_future(pre))
    except asyncio.CancelledError:

        def after_pre(f: Future[None]) -> None:
            if not f.cancelled() and f.exception() is None:
                _finish_in_background(call, asyncio.CancelledError(f"synced call cancelled on rank {call.rank}"))

        pre.add_done_callback(after_pre)
        raise
    result: Any = None
    error: BaseException | None = call.score_error
    if call.scores and error is None:
        try:
            result = await fn(*call.args, **call.kwargs)
        except asyncio.CancelledError as e:
            _finish_in_background(call, e)
            raise
        except Exception as e:
            error = e
    post = loop.run_in_executor(_EXECUTOR, call.post, result, error)
    return await asyncio.shield(post)


@overload
def synced_reward(fn: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def synced_reward(
    *,
    mode: Mode = "main",
    backend: str | Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    group_size: int | None = None,
    group_by: str | None = None,
    include: Collection[str] | None = None,
    exclude: Collection[str] = (),
    shared: Collection[str] = (),
    allow_pickle: bool = False,
    process_group: Any = None,
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


def synced_reward(
    fn: Callable[P, R] | None = None,
    /,
    *,
    mode: Mode = "main",
    backend: str | Backend = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    group_size: int | None = None,
    group_by: str | None = None,
    include: Collection[str] | None = None,
    exclude: Collection[str] = (),
    shared: Collection[str] = (),
    allow_pickle: bool = False,
    process_group: Any = None,
) -> Callable[P, R] | Callable[[Callable[P, R]], Callable[P, R]]:
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
            or an object implementing [`Backend`][syncreward.Backend].
        timeout: seconds a rank waits for the others in one exchange step (including waiting for the
            scoring rank's results); default 1800 (30 minutes, torch.distributed's default). A rank that
            does not arrive in time is named in a [`SyncTimeoutError`][syncreward.SyncTimeoutError] on
            every rank that did.
        group_size: with ``mode="shard"``: consecutive global samples form groups of this size (TRL's
            ``num_generations``).
        group_by: with ``mode="shard"``: samples with equal values in this per-sample column form a group.
        include: the ``**kwargs`` per-sample columns to exchange (default: all that hold plain data).
            Parameters the function names are always exchanged.
        exclude: per-sample columns not to exchange; the function receives a
            [`NotSynced`][syncreward.NotSynced] placeholder for them.
        shared: sequence arguments that are not per-sample (passed through from the scoring rank).
        allow_pickle: also carry arbitrary objects, with pickle. Unpickling runs code chosen by the
            sender: use only on clusters where every rank is trusted.
        process_group: with the torch backend, the data-parallel group to sync over (default: all ranks).

    Returns:
        The wrapped function (or a decorator, when called with options only).

    Raises:
        ValueError: invalid options (at decoration time).

    Examples:
        In one process the wrapped function is simply called; on several ranks each rank passes its own
        completions and gets back its own rewards, computed over the global batch.

        >>> from syncreward import synced_reward
        >>> @synced_reward
        ... def rank_reward(completions, **kwargs):
        ...     order = sorted(range(len(completions)), key=lambda i: len(completions[i]))
        ...     ranks = {i: r for r, i in enumerate(order)}
        ...     return [ranks[i] / max(len(completions) - 1, 1) for i in range(len(completions))]
        >>> rank_reward(["a", "abc", "ab"])
        [0.0, 1.0, 0.5]
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    if mode == "shard":
        if (group_size is None) == (group_by is None):
            raise ValueError("mode='shard' needs exactly one of group_size=K or group_by='<column>'")
        if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
            raise ValueError(f"group_size must be a positive int, not {group_size!r}")
    elif group_size is not None or group_by is not None:
        raise ValueError("group_size/group_by only apply to mode='shard'")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, not {timeout!r}")
    if isinstance(backend, str) and backend not in ("auto", "local", "torch", "accelerate", "ray"):
        raise ValueError(
            f"unknown backend {backend!r}; expected 'auto', 'local', 'torch', 'accelerate', 'ray' or an object"
        )

    def decorate(func: Callable[P, R]) -> Callable[P, R]:
        binder = Binder(func, include=include, exclude=exclude, shared=shared)
        if group_by is not None and group_by in binder.shared:
            raise ValueError(f"group_by={group_by!r} names a shared argument; it must be a per-sample column")
        spec = Spec(
            fn=func,
            name=getattr(func, "__qualname__", getattr(func, "__name__", repr(func))),
            mode=mode,
            timeout=float(timeout),
            group_size=group_size,
            group_by=group_by,
            allow_pickle=allow_pickle,
            binder=binder,
        )

        if inspect.iscoroutinefunction(func):
            async_func = cast(Callable[..., Awaitable[Any]], func)

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                be = resolve_backend(backend, process_group)
                if be.world_size == 1:
                    return await async_func(*args, **kwargs)
                return await _run_async(make_call(spec, get_link(be), args, kwargs), async_func)

            wrapper: Callable[..., Any] = async_wrapper
        else:

            @functools.wraps(func)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                be = resolve_backend(backend, process_group)
                if be.world_size == 1:
                    return func(*args, **kwargs)
                return _run_sync(make_call(spec, get_link(be), args, kwargs), func)

            wrapper = sync_wrapper
        wrapper.__syncreward_spec__ = spec  # type: ignore[attr-defined]
        return cast(Callable[P, R], wrapper)

    if fn is not None:
        return decorate(fn)
    return decorate
