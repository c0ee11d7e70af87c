"""The lifecycle of one synced call, written once: one sequence, a sync and an async driver.

::

    nested inside a synced call?      -> a plain call: the data is already global
    resolve backend; one process?     -> a plain call
    session: usable here? (not a forked child, latch not broken); take a sequence number
    prepare  (caller's thread)        bind arguments, encode            -> failures become a status
    inbound  (channel-0 turn)         headers + payloads                -> Scoring, or every rank raises
    score    (caller's thread/loop)   the function, where the mode says -> result or error
    outbound (channel-1 turn)         results (or the error) back       -> this rank's results, or raise

:func:`_sequence` is that list, as a generator: it yields what it needs next -- an exchange in the
call's turn (:class:`_Exchange`) or the function's turn (:class:`_Score`) -- and is sent back its
outcome. The drivers only say *how* a request is met: :func:`call_sync` runs each in the caller's thread;
:func:`call_async` hands exchanges to worker threads and awaits the function on the event loop. An
**abandoned** call (cancelled, or interrupted while preparing) is the same sequence driven in the
background by :func:`_abandon`, with the interruption as the function's outcome, so the other ranks
raise (a ``RemoteError`` naming it) instead of waiting for this rank.

The invariant, held by the sequence and nowhere else: once ``inbound`` has been entered, ``outbound``
runs exactly once -- or, when ``inbound`` failed (it then failed on every rank, or the session broke),
the channel-1 turn is skipped. Any exception from the function, ``BaseException`` included, travels to
the other ranks before it is re-raised here. **Leaving** (the process exits with calls in flight) is the
last state: :func:`leave` marks their groups broken, so no step of theirs waits for a turn any more.

Below the drivers a failure travels one way, as an ``Error`` outcome (``_outcome``): the mode's
collective decisions, this rank's own failures and the transport failures the session catches. Which
one the caller sees is decided in one place, :func:`~syncreward._outcome.settle`: this rank's own
exception, then a peer's failure, then the transport.
"""

from __future__ import annotations

import asyncio
import contextvars
import weakref
from collections.abc import Awaitable, Callable, Generator, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, NamedTuple

from ._call import Call, Inputs, Payload, Spec, open_call, unbound_call
from ._deadline import Deadline
from ._errors import MismatchError, call_words, reason_of, stuck_error
from ._identity import NO_CALLER, Site
from ._modes._base import Scoring, inputs_turn, results_turn
from ._outcome import Error, Outcome, Value, capture, settle
from ._session import live_sessions, session_for
from ._wire import INBOUND, OUTBOUND
from .backends import Backend

__all__ = ["call_async", "call_sync", "leave", "nested"]

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


class _Exchange(NamedTuple):
    """What the sequence asks for: run ``work`` in the call's turn on ``channel``; send back its outcome."""

    channel: int
    work: Callable[[], Outcome[Any]]


class _Score(NamedTuple):
    """What the sequence asks for: the function's outcome on this rank (its turn comes on every rank).

    Where this rank does not score (``inputs`` is ``None``) the outcome is ``Value(None)``; where its
    inputs failed here (an ``Error``), that failure -- except in an abandoned call, whose outcome is its
    interruption either way.
    """

    inputs: Value[Inputs] | Error | None

    def settled(self) -> Outcome[Any] | None:
        """The outcome without calling the function (``None``: call it)."""
        if self.inputs is None:
            return Value(None)
        return self.inputs if isinstance(self.inputs, Error) else None


_Sequence = Generator["_Exchange | _Score", Outcome[Any], Outcome[Any]]


def _sequence(call: Call, payload: Outcome[Payload]) -> _Sequence:
    """One call, start to end, for every driver; returns the call's outcome on this rank."""
    mode, session = call.spec.impl, call.session
    mine = payload.error if isinstance(payload, Error) else None  # this rank's own failure, once it has one
    got = yield _Exchange(INBOUND, lambda: inputs_turn(mode, call, payload))
    if isinstance(got, Error):  # failed on every rank (or the session broke): no rank takes its channel-1 turn
        session.skip(OUTBOUND, call.seq)
        return settle(mine, got)
    scoring: Scoring = got.value
    result = yield _Score(scoring.inputs)
    if isinstance(result, Error):
        mine = result.error  # the function's exception, or this rank's inputs' failure: it travels, then wins here
    got = yield _Exchange(OUTBOUND, lambda: results_turn(mode, call, scoring, result))
    return settle(mine, got)


def _open(
    spec: Spec,
    backend: Backend,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    site: Site,
    is_async: bool,
    task: tuple[Any, str, Any, Any] | None = None,
) -> tuple[Call, _Sequence]:
    deadline = Deadline(spec.options.timeout)  # the call's one clock: every wait of it ends by then
    session = session_for(backend, spec.name)
    seq, problem = session.open(is_async, task)
    try:
        call, payload = open_call(spec, session, seq, site, args, kwargs, problem, deadline)
    except BaseException:  # KeyboardInterrupt while binding: the sequence number is taken, so finish the call
        session.finish(seq)
        unbound = unbound_call(spec, session, seq, site, deadline)
        interrupted = KeyboardInterrupt("synced call interrupted while preparing")
        _abandon(unbound, _sequence(unbound, Error(interrupted)), None, interrupted)
        raise
    sequence = _sequence(call, payload)
    if problem is not None and not is_async and isinstance(payload, Error):
        # A blocking call the session refused (made where its order cannot be the same on every rank, or on an
        # event loop's thread while an async call on that loop is pending): it raises here at once, and the rest
        # of its exchanges runs in the background, so that the others raise too. Waiting for them here could
        # wait for an earlier call that cannot progress while this thread is blocked (in ``main`` over a
        # gathering backend, rank 0's verdict comes in the results turn, after the earlier calls' results).
        _abandon(call, sequence, None, payload.error)
        raise payload.error
    return call, sequence


def _score(fn: Callable[..., Any], request: _Score) -> Outcome[Any]:
    """The function's outcome, called in this thread; any exception is captured (it travels to the others)."""
    settled = request.settled()
    if settled is not None:
        return settled
    assert isinstance(request.inputs, Value)
    args, kwargs = request.inputs.value
    with _scoring():
        return capture(fn, *args, **kwargs)


async def _score_async(fn: Callable[..., Awaitable[Any]], request: _Score) -> Outcome[Any]:
    """The ``async`` function's outcome, awaited here; a cancellation is raised (the call is then abandoned)."""
    settled = request.settled()
    if settled is not None:
        return settled
    assert isinstance(request.inputs, Value)
    args, kwargs = request.inputs.value
    try:
        with _scoring():
            return Value(await fn(*args, **kwargs))
    except asyncio.CancelledError:
        raise
    except BaseException as e:  # travels to the other ranks, then re-raised here
        return Error(e)


def call_sync(spec: Spec, backend: Backend, args: tuple[Any, ...], kwargs: dict[str, Any], site: Site) -> Any:
    """Make one synced call of a plain function (called from ``site``) and return this rank's results."""
    call, sequence = _open(spec, backend, args, kwargs, site, is_async=False)
    session, seq, name = call.session, call.seq, spec.name
    try:
        request = next(sequence)
        while True:
            if isinstance(request, _Score):
                got = _score(spec.fn, request)
            else:
                got = session.run_turn(request.channel, seq, request.work, call.deadline, name)
            request = sequence.send(got)
    except StopIteration as done:
        outcome: Outcome[Any] = done.value
    finally:
        session.close(seq)
    return outcome.unwrap()


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
    call, sequence = _open(spec, backend, args, kwargs, site, True, task)
    try:
        value = await _steps_async(spec, call, sequence)
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


async def _steps_async(spec: Spec, call: Call, sequence: _Sequence) -> Any:
    session, seq, name = call.session, call.seq, spec.name
    fn: Callable[..., Awaitable[Any]] = spec.fn
    got: Outcome[Any]
    try:
        request = next(sequence)
        while True:
            if isinstance(request, _Score):
                try:
                    got = await _score_async(fn, request)
                except asyncio.CancelledError as e:
                    _abandon(call, sequence, None, e, scored=True)
                    raise
            else:
                pending = session.submit(request.channel, seq, request.work, call.deadline, name)
                if request.channel == OUTBOUND:
                    session.close(seq)  # what is left runs on its own: a later call on this thread may start
                try:
                    got = await _wait(pending, call, request.channel)
                except asyncio.CancelledError as e:
                    _abandon(call, sequence, pending, e)
                    raise
            request = sequence.send(got)
    except StopIteration as done:
        outcome: Outcome[Any] = done.value
    finally:
        session.close(seq)
    return outcome.unwrap()


async def _wait(fut: Future[Outcome[Any]], call: Call, channel: int) -> Outcome[Any]:
    """Await submitted work; work whose turn does not come by the call's deadline breaks the session."""
    wrapped = asyncio.wrap_future(fut)
    try:
        return await asyncio.wait_for(asyncio.shield(wrapped), call.deadline.left())
    except asyncio.TimeoutError:
        if not call.session.withdraw(channel, call.seq):
            # it is exchanging: the backend bounds that by the call's deadline. Shielded: a cancelled caller
            # must not cancel the exchange itself (a future whose job has not started yet would be skipped on
            # this rank alone); _abandon drives the rest
            return await asyncio.shield(wrapped)
    error = stuck_error(call_words(call.seq, call.spec.name), call.deadline.timeout)
    call.session.break_(reason_of(error))
    return Error(error)


def _abandon(
    call: Call, sequence: _Sequence, pending: Future[Outcome[Any]] | None, error: BaseException, scored: bool = False
) -> None:
    """Drive the rest of an abandoned call's ``sequence`` in the background, with ``error`` as its function's outcome.

    ``pending`` is the exchange already submitted (its outcome is what the sequence gets next); without
    one, the sequence is at its start, or (``scored``) waits for the function's outcome. The other ranks
    then raise (a ``RemoteError`` naming the interruption) instead of waiting for this rank. Nothing
    here blocks: each remaining exchange runs when its turn comes, on a worker thread.
    """
    session, seq, name = call.session, call.seq, call.spec.name
    session.close(seq)

    def done(f: Future[Outcome[Any]]) -> None:
        advance(Error(error) if f.cancelled() else f.result())  # (cancelled: its work never ran)

    def advance(got: Outcome[Any] | None) -> None:
        try:
            request = next(sequence) if got is None else sequence.send(got)
            while isinstance(request, _Score):  # the function's turn, on every rank: its outcome is the interruption
                request = sequence.send(Error(error))
        except StopIteration:
            return  # the call is over; its outcome was raised in the caller already
        submitted = session.submit(request.channel, seq, request.work, call.deadline, name)
        submitted.add_done_callback(done)

    if pending is not None:
        pending.add_done_callback(done)
    else:
        advance(Error(error) if scored else None)


def leave(reason: str) -> int:
    """This process is leaving: abandon every synced call still in flight, marking its group broken.

    Each session with a call in flight is abandoned with ``reason`` (``"the process is exiting"``,
    :meth:`Session.abandon`): its latch breaks, so every step still waiting for its turn fails at once and
    no later call starts, and its backend, where it can, ends every exchange in progress at once and tells
    the peers why. Interpreter exit does the same for every session (``_session._abandon_all``); returns
    how many sessions were busy.
    """
    busy = [session for session in live_sessions() if session.busy()]
    for session in busy:
        session.abandon(reason)
    return len(busy)
