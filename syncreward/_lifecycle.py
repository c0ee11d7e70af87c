"""The lifecycle of one synced call, the same for plain and ``async`` functions.

::

    nested inside a synced call?      -> a plain call: the data is already global
    resolve backend; one process?     -> a plain call
    session: usable here? (not a forked child, latch not broken); take a sequence number
    prepare  (caller's thread)        bind arguments, encode            -> failures become a status
    inbound  (channel-0 turn)         headers + payloads                -> Scoring, or every rank raises
    score    (caller's thread/loop)   the function, where the mode says -> result or error
    outbound (channel-1 turn)         results (or the error) back       -> this rank's results, or raise

The invariant, held here and nowhere else: once ``inbound`` has been entered, ``outbound`` runs exactly
once -- or, when ``inbound`` raised (it then raised on every rank), the channel-1 turn is skipped. A
cancelled ``async`` call still completes its exchanges in the background (with the cancellation as its
error), so the other ranks raise instead of waiting. Any exception from the function, ``BaseException``
included, travels to the other ranks before it is re-raised here.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from ._errors import MismatchError
from ._identity import NO_CALLER, Site
from ._modes._base import Call, Payload, Scoring, Spec
from ._outcome import Error, Outcome, Value, capture
from ._session import call_words, reason_of, session_for, stuck_error
from ._wire import INBOUND, OUTBOUND
from .backends import Backend

__all__ = ["call_async", "call_sync", "nested"]

_SCORING: contextvars.ContextVar[bool] = contextvars.ContextVar("syncreward_scoring", default=False)


def nested() -> bool:
    """Whether this code runs inside the body of a synced call (on the rank scoring it)."""
    return _SCORING.get()


@contextmanager
def _scoring() -> Iterator[None]:
    token = _SCORING.set(True)
    try:
        yield
    finally:
        _SCORING.reset(token)


def _open(
    spec: Spec,
    backend: Backend,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    site: Site,
    is_async: bool,
    task: tuple[Any, str, Any, Any] | None = None,
) -> tuple[Call, Outcome[Payload]]:
    session = session_for(backend, spec.name)
    seq, problem = session.open(is_async, task)
    try:
        return Call.open(spec, session, seq, site, args, kwargs, problem)
    except BaseException:  # KeyboardInterrupt while binding: the sequence number is taken, so finish the call
        session.finish(seq)
        _abandon(
            Call.unbound(spec, session, seq, site), None, KeyboardInterrupt("synced call interrupted while preparing")
        )
        raise


def _score(fn: Callable[..., Any], scoring: Scoring) -> Outcome[Any]:
    """The function's outcome where this rank scores (``Value(None)`` elsewhere; its inputs' failure as is)."""
    if scoring.inputs is None:
        return Value(None)
    if isinstance(scoring.inputs, Error):
        return scoring.inputs
    args, kwargs = scoring.inputs.value
    with _scoring():
        return capture(fn, *args, **kwargs)  # any exception travels to the other ranks, then is raised here


def call_sync(spec: Spec, backend: Backend, args: tuple[Any, ...], kwargs: dict[str, Any], site: Site) -> Any:
    """Make one synced call of a plain function (called from ``site``) and return this rank's results."""
    call, own = _open(spec, backend, args, kwargs, site, is_async=False)
    session, mode, seq, name = call.session, spec.impl, call.seq, spec.name
    try:
        try:
            scoring = session.step(INBOUND, seq, lambda: mode.inbound(call, own), call.timeout, name)
        except BaseException:
            session.skip(OUTBOUND, seq)
            raise
        result = _score(spec.fn, scoring)
        return session.step(OUTBOUND, seq, lambda: mode.outbound(call, scoring, result), call.timeout, name)
    finally:
        session.close(seq)


async def call_async(spec: Spec, backend: Backend, args: tuple[Any, ...], kwargs: dict[str, Any], site: Site) -> Any:
    """Make one synced call of an ``async`` function (from ``site``); its exchanges never block the event loop.

    The session learns which task makes the call from which coroutine, and in which turn of the event loop
    (``Session.open``): a call whose order with another call of the same place depends on timing raises
    ``MismatchError``. A task that runs the synced coroutine itself (``NO_CALLER``) starts the call in its
    first step, in the order the tasks were created: nothing can have been awaited before it.
    """
    task = None
    if site is not NO_CALLER:
        task = (spec, site.key, asyncio.current_task(), _turn(asyncio.get_running_loop()))
    call, own = _open(spec, backend, args, kwargs, site, True, task)
    try:
        value = await _steps_async(spec, call, own)
    finally:
        untold = call.session.finish(call.seq)
    if untold is not None:  # a later call of the same place showed that this one's order was timing's
        raise MismatchError(untold)
    return value


_turns: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, object] = weakref.WeakKeyDictionary()


def _turn(loop: asyncio.AbstractEventLoop) -> object:
    """A token of the event loop's current turn (its run of ready callbacks): tasks started in it share it."""
    turn = _turns.get(loop)
    if turn is None:
        turn = _turns[loop] = object()
        loop.call_soon(_turns.pop, loop, None)  # runs in the loop's next turn
    return turn


async def _steps_async(spec: Spec, call: Call, own: Outcome[Payload]) -> Any:
    session, mode, seq, name = call.session, spec.impl, call.seq, spec.name
    fn: Callable[..., Awaitable[Any]] = spec.fn
    inbound = session.submit(INBOUND, seq, lambda: mode.inbound(call, own), name)
    try:
        scoring: Scoring = (await _wait(inbound, call, INBOUND)).unwrap()
    except asyncio.CancelledError as e:
        _abandon(call, inbound, e)
        raise
    except BaseException:
        session.skip(OUTBOUND, seq)
        session.close(seq)
        raise
    result: Outcome[Any] = Value(None)
    if isinstance(scoring.inputs, Error):
        result = scoring.inputs
    elif scoring.inputs is not None:
        args_, kwargs_ = scoring.inputs.value
        try:
            with _scoring():
                result = Value(await fn(*args_, **kwargs_))
        except asyncio.CancelledError as e:
            _abandon(call, inbound, e)
            raise
        except BaseException as e:  # travels to the other ranks, then re-raised here by outbound
            result = Error(e)
    outbound = session.submit(OUTBOUND, seq, lambda: mode.outbound(call, scoring, result), name)
    session.close(seq)
    return (await _wait(outbound, call, OUTBOUND)).unwrap()


async def _wait(fut: Future[Outcome[Any]], call: Call, channel: int) -> Outcome[Any]:
    """Await a submitted step; a step whose turn does not come within the timeout breaks the session."""
    wrapped = asyncio.wrap_future(fut)
    try:
        return await asyncio.wait_for(asyncio.shield(wrapped), call.timeout)
    except asyncio.TimeoutError:
        if not call.session.turns[channel].withdraw(call.seq):
            return await wrapped  # it is exchanging: the backend bounds that by the timeout
    error = stuck_error(call_words(call.seq, call.spec.name), call.timeout)
    call.session.break_(reason_of(error))
    raise error


def _abandon(call: Call, inbound: Future[Outcome[Any]] | None, error: BaseException) -> None:
    """Finish an abandoned call's exchanges in the background, with ``error`` as its outcome.

    The other ranks then raise (a ``RemoteError`` naming the cancellation) instead of waiting for this
    rank. Nothing here blocks: each remaining step runs when its turn comes.
    """
    session, mode, seq, name = call.session, call.spec.impl, call.seq, call.spec.name
    session.close(seq)
    if inbound is None:
        inbound = session.submit(INBOUND, seq, lambda: mode.inbound(call, Error(error)), name)

    def after_inbound(f: Future[Outcome[Any]]) -> None:
        out = None if f.cancelled() or f.exception() is not None else f.result()
        if isinstance(out, Value):
            scoring = out.value
            session.submit(OUTBOUND, seq, lambda: mode.outbound(call, scoring, Error(error)), name)
        else:
            session.skip(OUTBOUND, seq)

    inbound.add_done_callback(after_inbound)
