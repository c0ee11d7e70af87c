"""The one way a failure travels inside syncreward: an outcome, :class:`Value` or :class:`Error`.

Modelled on trio's ``outcome``. Every step of a call -- a mode's hooks, the collective procedures of
``_exchange``, the function itself -- returns an outcome instead of raising for a reason the ranks
share, because a step must finish its turn (and let the other ranks finish theirs) before anything is
raised. Whoever holds the outcome at the end of the step calls :meth:`~Value.unwrap`: the value, or the
error raised.

An exception that *escapes* a step is different: it is a transport failure, and it breaks the session
(``_session``), which hands it on as an :class:`Error` too. Where a call meets several failures, one rule
(:func:`settle`) says which the caller sees: **this rank's own exception, then a peer's failure, then the
transport** -- the others go in as notes (PEP 678) on the one raised, never instead of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, NoReturn, TypeVar

from ._errors import CommunicationError, SyncRewardError, first_line

__all__ = ["Error", "LocalError", "Outcome", "Value", "add_note", "capture", "local", "settle"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Value(Generic[T_co]):
    """A step that succeeded, with what it produced."""

    __slots__ = ("value",)

    def __init__(self, value: T_co) -> None:
        self.value = value

    def unwrap(self) -> T_co:
        return self.value

    def __repr__(self) -> str:
        return f"Value({self.value!r})"


class Error:
    """A step that failed: ``unwrap`` raises the error (on every rank, where the error is collective)."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def unwrap(self) -> NoReturn:
        raise self.error

    def __repr__(self) -> str:
        return f"Error({self.error!r})"


class LocalError(Error):
    """This rank's own work failed and no other rank knows yet (``_modes._base.local``).

    It must travel in the call's next transfer (which returns a plain :class:`Error`, every rank's),
    or, after the call's last transfer, it is this rank's alone (told at its next call).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"LocalError({self.error!r})"


Outcome = Value[T] | Error
"""What a step returns: ``Value(result)`` or ``Error(exception)``."""


def capture(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Value[T] | Error:
    """Run ``fn(*args, **kwargs)``; its result as a :class:`Value`, or what it raised as an :class:`Error`.

    ``BaseException`` is captured too (a ``KeyboardInterrupt`` in a reward travels to the other ranks
    before it is raised here).
    """
    try:
        return Value(fn(*args, **kwargs))
    except BaseException as e:
        return Error(e)


def local(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Value[T] | LocalError:
    """Run this rank's own work inside a mode's hook: its result, or what it raised as a :class:`LocalError`.

    ``BaseException`` is captured too: a ``KeyboardInterrupt`` while decoding travels like any failure.
    """
    try:
        return Value(fn(*args, **kwargs))
    except BaseException as e:
        return LocalError(e)


def add_note(error: BaseException, note: str) -> None:
    """PEP 678's ``error.add_note(note)``; on Python 3.10, the same ``__notes__`` list (shown from 3.11 on)."""
    add = getattr(error, "add_note", None)
    if add is not None:
        add(note)
        return
    try:
        notes = error.__dict__.setdefault("__notes__", [])
        notes.append(note)
    except (AttributeError, TypeError):  # an exception type without a __dict__
        pass


def settle(mine: BaseException | None, got: Outcome[T]) -> Outcome[T]:
    """A call's outcome on this rank, from its own failure ``mine`` (if any) and what its last step ``got``.

    The one precedence rule of syncreward's failures:

    1. **this rank's own exception**: what its function, its preparation or its decoding raised (``mine``),
       or an exception that is no syncreward error (a ``KeyboardInterrupt`` while this rank waited);
    2. **a peer's failure**: an error the ranks decided together (``RemoteError``, ``MismatchError``, ...);
    3. **the transport**: a :class:`~syncreward.CommunicationError` (a peer left, a timeout, a broken group).

    The error raised is the first of these that happened, as the very object raised (so a user's
    ``except KeyboardInterrupt:`` matches); a later one is attached to it as a note, never raised instead.
    """
    if mine is None or (isinstance(got, Error) and got.error is mine):
        return got
    if isinstance(got, Value):
        return Error(mine)  # (no step succeeds for a rank that failed; kept for the rule's sake)
    other = got.error
    if not isinstance(other, SyncRewardError):  # this rank's own, newer: it wins, and says what came first
        add_note(other, f"syncreward: this call had already failed on this rank: {_words(mine)}")
        return got
    if isinstance(other, CommunicationError):
        add_note(mine, f"syncreward: the transport failed while this rank reported this exception: {_words(other)}")
    else:
        add_note(mine, f"syncreward: the ranks also raised {_words(other)}")
    return Error(mine)


def _words(e: BaseException) -> str:
    return f"{type(e).__name__}: {first_line(e)}"
