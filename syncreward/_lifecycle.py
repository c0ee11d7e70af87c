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
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from ._modes._base import Call, Scoring, Spec
from ._session import Raise, call_words, reason_of, session_for, stuck_error
from ._wire import error_blob
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
    spec: Spec, backend: Backend, args: tuple[Any, ...], kwargs: dict[str, Any], site: str, is_async: bool
) -> Call:
    session = session_for(backend, spec.name)
    seq, problem = session.open(is_async)
    call = Call(spec, session, seq, site)
    try:
        call.prepare(spec.impl, args, kwargs, problem)
    except BaseException:  # KeyboardInterrupt while binding: the sequence number is taken, so finish the call
        _abandon(call, None, KeyboardInterrupt("synced call interrupted while preparing"))
        raise
    return call


def call_sync(spec: Spec, backend: Backend, args: tuple[Any, ...], kwargs: dict[str, Any], site: str) -> Any:
    """Make one synced call of a plain function (called from ``site``) and return this rank's results."""
    call = _open(spec, backend, args, kwargs, site, is_async=False)
    session, mode, seq, name = call.session, spec.impl, call.seq, spec.name
    try:
        try:
            scoring: Scoring = session.step(0, seq, lambda: mode.inbound(call), call.timeout, name)
        except BaseException:
            session.skip(1, seq)
            raise
        result, error = None, scoring.error
        if scoring.scores and error is None:
            try:
                with _scoring():
                    result = spec.fn(*scoring.args, **scoring.kwargs)
            except BaseException as e:  # travels to the other ranks, then re-raised here by outbound
                error = e
        return session.step(1, seq, lambda: mode.outbound(call, scoring, result, error), call.timeout, name)
    finally:
        session.close(seq)


async def call_async(
    spec: Spec, backend: Backend, args: tuple[Any, ...], kwargs: dict[str, Any], site: str
) -> Any:
    """Make one synced call of an ``async`` function (from ``site``); its exchanges never block the event loop."""
    call = _open(spec, backend, args, kwargs, site, is_async=True)
    session, mode, seq, name = call.session, spec.impl, call.seq, spec.name
    fn: Callable[..., Awaitable[Any]] = spec.fn
    inbound = session.submit(0, seq, lambda: mode.inbound(call), name)
    try:
        scoring: Scoring = _unwrap(await _wait(inbound, call, 0))
    except asyncio.CancelledError as e:
        _abandon(call, inbound, e)
        raise
    except BaseException:
        session.skip(1, seq)
        session.close(seq)
        raise
    result, error = None, scoring.error
    if scoring.scores and error is None:
        try:
            with _scoring():
                result = await fn(*scoring.args, **scoring.kwargs)
        except asyncio.CancelledError as e:
            _abandon(call, inbound, e)
            raise
        except BaseException as e:  # travels to the other ranks, then re-raised here by outbound
            error = e
    outbound = session.submit(1, seq, lambda: mode.outbound(call, scoring, result, error), name)
    session.close(seq)
    return _unwrap(await _wait(outbound, call, 1))


async def _wait(fut: Future[Any], call: Call, channel: int) -> Any:
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


def _unwrap(out: Any) -> Any:
    if isinstance(out, Raise):
        raise out.error
    return out


def _abandon(call: Call, inbound: Future[Any] | None, error: BaseException) -> None:
    """Finish an abandoned call's exchanges in the background, with ``error`` as its outcome.

    The other ranks then raise (a ``RemoteError`` naming the cancellation) instead of waiting for this
    rank. Nothing here blocks: each remaining step runs when its turn comes.
    """
    session, mode, seq, name = call.session, call.spec.impl, call.seq, call.spec.name
    session.close(seq)
    if inbound is None:
        call.error, call.blob = error, error_blob(error)
        inbound = session.submit(0, seq, lambda: mode.inbound(call), name)

    def after_inbound(f: Future[Any]) -> None:
        out = None if f.cancelled() or f.exception() is not None else f.result()
        if isinstance(out, Scoring):
            session.submit(1, seq, lambda: mode.outbound(call, out, None, error), name)
        else:
            session.skip(1, seq)

    inbound.add_done_callback(after_inbound)
