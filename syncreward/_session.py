"""A session: everything about one backend that outlives a single synced call, in one owner.

One :class:`Session` exists per backend object in a process (:func:`session_for`). It owns

* the **sequence numbers** that pair calls across ranks: the n-th synced call a rank makes is paired
  with the n-th call of every other rank. They count per session (per group), and they are the ``#N``
  every message names a call by: a count per process would differ between the members of a group
  (a member of a second group counts that group's calls too), so one call would go by two numbers;
* two **turnstiles** (``_turnstile``), one per channel, that run every call's collectives in sequence
  order -- the inbound exchange on channel 0, the outbound exchange on channel 1 -- so concurrent
  ``async`` calls issue their collectives in the same order on every rank while their function bodies
  overlap; async turns run on worker threads (``_workers``) that start at once, never queued;
* the **broken latch** (``_turnstile.Latch``): a transport failure (a dead peer, a timeout) inside any
  turn, or a turn that never comes, breaks the session. All waiting work and every later call then
  raises :class:`~syncreward.GroupBrokenError` at once instead of waiting for a group that can no longer
  agree. A turn's transport failure is reworded here, once, in the call's words (``_errors.call_words``);
* the **size predictions**: the inbound exchange's eager chunk sizes (:class:`~syncreward._wire.Predictor`,
  changed only from headers every rank saw) and ``mode="main"``'s result blocks
  (:class:`~syncreward._wire.ResultBlocks`: the size every rank's next block has, as the previous call's
  blocks announced it) and ``main``'s inbound blocks on a gathering backend
  (:class:`~syncreward._wire.InboundBlocks`: one size per call, as an earlier call's result block announced it);
* the **in-flight calls** and the thread each came from, to refuse orderings that cannot be the same
  on every rank (calls from two threads at once) or that would deadlock (a blocking call on the event
  loop thread while an async call on that loop is pending);
* the **process** it was created in: a forked child (a ``fork`` DataLoader worker) gets a clear error
  and never touches the parent's groups.

At interpreter exit (threading's exit hook, before the non-daemon workers are joined) every session of
this process is abandoned (:meth:`Session.abandon`): its latch breaks ("rank 0 is exiting"), every
waiting turn fails, and the backend's optional ``abandon(reason)`` makes the exchanges in progress return
(the peers then raise with that reason), so no exit waits on a peer.
"""

from __future__ import annotations

import contextlib
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ._deadline import Deadline
from ._errors import (
    BackendError,
    CommunicationError,
    SyncRewardError,
    SyncTimeoutError,
    call_words,
    forked_message,
    reason_of,
    reworded,
    text_of,
)
from ._outcome import Error, Outcome, Value
from ._turnstile import Latch, Turnstile
from ._wire import InboundBlocks, Predictor, ResultBlocks
from .backends import Backend
from .backends._cache import on_release
from .backends._protocol import abandons, aborts
from .backends._waiting import CALL, TIMEOUT

__all__ = ["Session", "live_sessions", "session_for"]

T = TypeVar("T")


_PHASES = ("sending its inputs", "waiting for its results")  # what a call does in its channel-0 / -1 turn


class Session:
    """Per-backend state of this process (see the module docstring)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.rank = backend.rank
        self.world_size = backend.world_size
        self.pid = os.getpid()
        self.latch = Latch()
        self.turns = (Turnstile(self.latch, self.break_), Turnstile(self.latch, self.break_))
        self.predictor = Predictor(self.world_size)
        self.result_blocks = ResultBlocks()
        self.inbound_blocks = InboundBlocks()  # ``main``'s inbound block size on a gathering backend
        self._seq = 0
        self._lock = threading.Lock()
        self._in_flight: dict[int, tuple[int, bool]] = {}  # seq -> (thread id, async)
        self._tasks: dict[
            int, tuple[Any, str, Any, Any]
        ] = {}  # unfinished async calls: seq -> (spec, site, task, turn)
        self._untold: dict[int, str] = {}  # unfinished async calls found ambiguous by a later call: seq -> why
        self._lost: SyncRewardError | None = None  # this rank failed to read a call's results; its next call says so

    # ------------------------------------------------------------------------------------------ lifecycle

    def check_usable(self, function: str) -> None:
        """Raise if a call of ``function`` cannot be made here (a forked child; a broken latch)."""
        if os.getpid() != self.pid:
            raise BackendError(
                forked_message(
                    f"a synced call of {function!r}", os.getpid(), self.pid, "the rank that owns syncreward's group"
                )
            )
        if self.latch.reason is not None:
            raise self.latch.error(f"a synced call of {function!r}")

    def open(self, is_async: bool, task: tuple[Any, str, Any, Any] | None = None) -> tuple[int, str | None]:
        """Take the next sequence number; say why this call cannot be ordered safely, if it cannot.

        ``task`` is an async call's ``(spec, site, task, turn)``: what it calls (the reward's spec, whose
        ``key`` is its identity) from where (the call site's key), the asyncio task it runs in and the event
        loop's turn it starts in. Two unfinished calls of one reward from one place, by two tasks that did
        not start them in one turn, started in an order that depends on timing, not on the program: the
        later call fails (on every rank) and the earlier one, once its exchanges are done, raises too
        (:meth:`finish`).
        """
        me = threading.get_ident()
        with self._lock:
            seq = self._seq
            self._seq += 1
            others = list(self._in_flight.values())
            self._in_flight[seq] = (me, is_async)
            twins = []
            if task is not None:
                spec, site, owner, turn = task
                twins = [
                    s
                    for s, (sp, si, o, t) in self._tasks.items()
                    if o is not owner and t is not turn and si == site and (sp is spec or sp.key == spec.key)
                ]
                self._tasks[seq] = task
                for s in twins:
                    self._untold.setdefault(s, _UNTOLD)
        problem = None
        if twins:
            problem = _UNTOLD
        elif any(tid != me for tid, _ in others):
            problem = (
                "synced calls were made from two threads at once on this rank; their order, which pairs them "
                "with the other ranks' calls, is then not the same on every rank. HINT: make synced calls from one "
                "thread, or as tasks of one event loop; a synced reward called from a thread pool *inside* another "
                "synced reward is a plain call only when the pool runs it in the reward's context "
                "(pool.submit(contextvars.copy_context().run, fn, ...))"
            )
        elif not is_async and any(a for _, a in others):
            problem = (
                "a blocking synced call was made on an event loop's thread while an async synced call on that loop "
                "is still pending; it would wait for that call, which cannot progress while the loop is blocked. "
                "HINT: await the async synced calls first, or make this function async too"
            )
        return seq, problem

    def busy(self) -> bool:
        """Whether a call of this session is in flight, or a turn of one (finishing in the background) is left."""
        with self._lock:
            if self._in_flight:
                return True
        return not all(t.idle() for t in self.turns)

    def close(self, seq: int) -> None:
        """The call no longer belongs to its thread (done, or finishing in the background)."""
        with self._lock:
            self._in_flight.pop(seq, None)

    def finish(self, seq: int) -> str | None:
        """An async call is over; why it cannot be trusted, if a later call found its order ambiguous."""
        with self._lock:
            self._tasks.pop(seq, None)
            return self._untold.pop(seq, None)

    def lose(self, seq: int, function: str, error: BaseException) -> None:
        """This rank failed after call ``seq``'s last exchange (reading its results): the others never learned.

        Its next synced call raises on every rank, naming it (:meth:`take_lost`): no round of its own per call.
        """
        lost = SyncRewardError(
            f"rank {self.rank} failed to read the results of {call_words(seq, function)}: {type(error).__name__}: "
            f"{reason_of(error)}. HINT: that call returned its results on the other ranks; this rank raised its "
            "own error then. Every rank raises this at the next synced call, so that no rank goes on as if that "
            "call had worked everywhere; the call after it works again."
        )
        lost.__cause__ = error
        with self._lock:
            if self._lost is None:
                self._lost = lost

    def take_lost(self) -> SyncRewardError | None:
        """The failure :meth:`lose` recorded, once: the next call sends it as this rank's failure."""
        with self._lock:
            lost, self._lost = self._lost, None
        return lost

    def break_(self, reason: str) -> None:
        """Break the latch (first reason wins) and fail all waiting work."""
        with self._lock:
            if self.latch.reason is None:
                self.latch.reason = reason
        for t in self.turns:
            t.wake_all()

    def abandon(self, reason: str) -> None:
        """This process is leaving: break the latch, and let no exchange in progress wait on a peer.

        A backend may offer ``abandon(reason)`` (``backends._protocol.Abandons``): every exchange in progress
        or started later raises at once (the torch backend tells the peers ``reason``; the thread backend
        aborts its group).
        """
        self.break_(reason)
        abandoning = abandons(self.backend)
        if abandoning is not None:
            with contextlib.suppress(Exception):  # at exit: one backend's failure must not keep the others
                abandoning.abandon(reason)

    def _tell_peers(self, reason: str) -> None:
        """This rank failed on its own inside its turn: the backend's ``abort`` (where it has one) tells the peers."""
        aborting = aborts(self.backend)
        if aborting is not None:
            with contextlib.suppress(Exception):  # best effort: this rank's own failure is raised either way
                aborting.abort(reason)

    # ------------------------------------------------------------------------------------------ turns

    def _guarded(
        self, call: str, work: Callable[[], Outcome[T]], channel: int, timeout: float
    ) -> Callable[[], Outcome[T]]:
        """``work`` as run in its turn: the one place a backend's failure becomes an ``Error`` of the call.

        A backend says what went wrong with the ranks (``rank(s) [1] did not arrive within timeout=2s``)
        but knows neither the function nor the call; here its error is rebuilt, of the same type and with
        the same attributes (``missing_ranks``), as ``synced call #3 of 'my_reward' timed out on rank 0
        while sending its inputs: ...``, and handed on as the turn's ``Error``. The session breaks (the first
        failure's words are the reason every later call gives). While the work runs, a long wait inside the
        backend names the call (``backends._waiting.CALL``), and the backend's timeout messages name the call's
        ``timeout`` as the user set it (``backends._waiting.TIMEOUT``), not the seconds its deadline had left.
        """
        words = f"{call} on rank {self.rank} while {_PHASES[channel]}"

        def run() -> Outcome[T]:
            named = CALL.set(words)  # what a long wait in the backend names (backends._waiting)
            timed = TIMEOUT.set(timeout)  # and the timeout= its messages name
            try:
                return work()
            except CommunicationError as e:
                verb = "timed out" if isinstance(e, SyncTimeoutError) else "failed"
                error = reworded(e, f"{call} {verb} on rank {self.rank} while {_PHASES[channel]}: {text_of(e)}")
                self.break_(reason_of(error))
                if error is not e:
                    error.__cause__, error.__suppress_context__ = e.__cause__, True
                    error.__traceback__ = e.__traceback__
                return Error(error)
            except BaseException as e:  # not collective: the ranks may now disagree about the sequence
                where = f"on rank {self.rank} while {_PHASES[channel]}"
                reason = f"{call} raised {type(e).__name__} {where}: {reason_of(e)}"
                self.break_(reason)
                self._tell_peers(reason)  # they wait in this turn's exchange: they raise now, not at timeout=
                return Error(e)
            finally:
                TIMEOUT.reset(timed)
                CALL.reset(named)

        return run

    def run_turn(
        self, channel: int, seq: int, work: Callable[[], Outcome[T]], deadline: Deadline, function: str
    ) -> Outcome[T]:
        """Run the work of call ``seq`` (of ``function``) in its turn, in this thread; its outcome.

        The wait for the turn ends at the call's ``deadline`` (its transfers are bounded by it too).

        The work's collective failure is its ``Error``; a transport failure is an ``Error`` too, in the
        call's words (and the session is broken). Nothing is raised: the lifecycle settles what it gets.
        """
        call = call_words(seq, function)  # the call's words, made once per turn
        try:
            return self.turns[channel].run(seq, self._guarded(call, work, channel, deadline.timeout), deadline, call)
        except BaseException as e:  # an interrupt while this thread waited for the turn
            # the turn is never taken now, so no later call of this rank can get its own: break at once
            self.break_(f"{call} raised {type(e).__name__} while waiting for its turn: {reason_of(e)}")
            return Error(e)

    def submit(
        self, channel: int, seq: int, work: Callable[[], Outcome[T]], deadline: Deadline, function: str
    ) -> Future[Outcome[T]]:
        """Run a turn's work on a worker thread (async calls, and turns finished in the background).

        Its transfers are bounded by the call's ``deadline`` (through the work's ``Link``); here it gives the
        ``timeout=`` the backend's messages name.
        """
        call = call_words(seq, function)
        return self.turns[channel].submit(seq, self._guarded(call, work, channel, deadline.timeout), call)

    def withdraw(self, channel: int, seq: int) -> bool:
        """Take back call ``seq``'s submitted work on ``channel`` if it has not started; whether it had not."""
        return self.turns[channel].withdraw(seq)

    def results_done(self, seq: int, deadline: Deadline, function: str) -> None:
        """Wait until call ``seq``'s results turn (channel 1) is over on this rank: what its result block said is known.

        For an inbound turn that needs what an earlier call's result block announced (``_exchange``); raises
        (breaking the session) where it does not come by the ``deadline``.
        """
        if self.turns[1].wait_past(seq, deadline):
            return
        if self.latch.reason is not None:
            raise self.latch.error(call_words(seq, function))
        raise SyncTimeoutError(
            f"{call_words(seq, function)} waited timeout={deadline.timeout:g}s for the results of call #{seq} on "
            "this rank. HINT: a synced call awaits another synced call's results inside its own function?",
            [],
        )

    def skip(self, channel: int, seq: int) -> None:
        """Give up ``seq``'s turn on ``channel`` without exchanging (every rank skips the same turns)."""
        self.turns[channel].submit(seq, _nothing, "")


_UNTOLD = (
    "two calls of this synced reward from the same place were unfinished at once on this rank, started by two "
    "asyncio tasks in different turns of the event loop: their order, which pairs them with the other ranks' "
    "calls, then depends on timing (a rate limiter, a semaphore, a network wait before the call), not on the "
    "program, so their batches may not be combined. HINT: call the synced reward once with the whole batch and "
    "split or rate-limit inside it, or await such calls one after another"
)


def _nothing() -> Value[None]:
    return Value(None)


# --------------------------------------------------------------------------------------------- registry

_sessions: weakref.WeakKeyDictionary[Any, Session] = weakref.WeakKeyDictionary()
_strong: dict[int, tuple[Any, Session]] = {}  # backends that cannot be weakly referenced
_registry_lock = threading.Lock()


@on_release
def _forget_session(backend: Any) -> None:
    """A released backend's session goes too (it references the backend, so the weak key would never go)."""
    with contextlib.suppress(TypeError):  # not weakly referenceable: kept in _strong
        _sessions.pop(backend, None)
    with _registry_lock:
        entry = _strong.get(id(backend))
        if entry is not None and entry[0] is backend:
            del _strong[id(backend)]


def _abandon_all() -> None:
    """Interpreter exit: abandon every session this process created (see the module docstring)."""
    for session in live_sessions():
        if session.pid == os.getpid():  # a forked child leaves its parent's groups alone
            session.abandon(f"rank {session.rank} is exiting")


threading._register_atexit(_abandon_all)  # type: ignore[attr-defined]  # runs before the workers are joined


def live_sessions() -> list[Session]:
    """Every session of this process (for :func:`syncreward._lifecycle.leave`)."""
    with _registry_lock:
        return [*_sessions.values(), *(session for _, session in _strong.values())]


def session_for(backend: Backend, function: str) -> Session:
    """The process-wide session of a backend, created on its first call (by a call of ``function``).

    Raises:
        BackendError: this is a forked child of the process that created the session.
        GroupBrokenError: the session's latch is broken.
    """
    try:
        session = _sessions.get(backend)
    except TypeError:
        entry = _strong.get(id(backend))
        session = entry[1] if entry is not None and entry[0] is backend else None
    if session is None:
        with _registry_lock:
            try:
                session = _sessions.get(backend)
                if session is None:
                    session = _sessions[backend] = Session(backend)
            except TypeError:
                entry = _strong.get(id(backend))
                if entry is None or entry[0] is not backend:
                    entry = _strong[id(backend)] = (backend, Session(backend))
                session = entry[1]
    session.check_usable(function)
    return session
