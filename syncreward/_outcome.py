"""The one way a failure travels inside syncreward: an outcome, :class:`Value` or :class:`Error`.

Modelled on trio's ``outcome``. Every step of a call -- a mode's hooks, the collective procedures of
``_exchange``, the function itself -- returns an outcome instead of raising for a reason the ranks
share, because a step must finish its turn (and let the other ranks finish theirs) before anything is
raised. Whoever holds the outcome at the end of the step calls :meth:`~Value.unwrap`: the value, or the
error raised.

An exception that *escapes* a step is different: it is a transport failure, and it breaks the session
(``_session``). Only errors that every rank knows about (decided from data every rank received) travel
as :class:`Error`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, NoReturn, TypeVar

__all__ = ["Error", "Outcome", "Value", "capture"]

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
