"""The exceptions syncreward raises.

Every error is raised on *every* rank of the group, so that no rank is left waiting in a collective
that the others have abandoned. The tree:

```text
SyncRewardError                       base of everything below
├── RemoteError                       the function (or its input) failed on another rank
├── MismatchError                     ranks called different synced functions / schemas / order
├── InputError (ValueError)           bad per-sample input: lengths disagree, unknown column, ...
│   └── ResultLengthError             the function returned the wrong number of results
├── UnsupportedTypeError (TypeError)  a value the wire format cannot carry without pickle
├── ColumnNotSyncedError (KeyError)   the function used a column that was not exchanged
├── CodecError                        a payload that is not valid syncreward wire data
├── BackendError (RuntimeError)       no usable backend / misconfigured distributed job
└── CommunicationError                the transport failed: a peer died or the group broke
    ├── SyncTimeoutError (TimeoutError) a rank did not arrive within timeout=
    └── GroupBrokenError              an earlier transport failure left the group unusable
```

Messages end with a ``HINT:`` saying what to do next where there is something to do.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

__all__ = [
    "BackendError",
    "CodecError",
    "ColumnNotSyncedError",
    "CommunicationError",
    "GroupBrokenError",
    "InputError",
    "MismatchError",
    "RemoteError",
    "ResultLengthError",
    "SyncRewardError",
    "SyncTimeoutError",
    "UnsupportedTypeError",
]


class SyncRewardError(Exception):
    """Base class of every error raised by syncreward."""


class RemoteError(SyncRewardError):
    """The synced function, or the preparation of its input, raised on another rank.

    The rank where the exception happened re-raises the original exception; every other rank raises
    this error, which names the origin rank, the exception type, its message and its traceback.

    Attributes:
        origin_rank: rank (within the synced group) where the exception was raised.
        exc_type: qualified name of the original exception type.
        exc_message: ``str()`` of the original exception.
        remote_traceback: the formatted traceback from the origin rank.
    """

    def __init__(
        self, origin_rank: int, exc_type: str, exc_message: str, remote_traceback: str, *, function: str
    ) -> None:
        self.origin_rank = origin_rank
        self.exc_type = exc_type
        self.exc_message = exc_message
        self.remote_traceback = remote_traceback
        self.function = function
        super().__init__(
            f"synced function {function!r} failed on rank {origin_rank}: {exc_type}: {exc_message}\n"
            f"--- traceback on rank {origin_rank} ---\n{remote_traceback.rstrip()}\n--- end of remote traceback ---"
        )

    def __reduce__(self) -> tuple[object, ...]:  # pickled by Ray, multiprocessing: rebuild from the fields
        fields = (self.origin_rank, self.exc_type, self.exc_message, self.remote_traceback)
        return (_rebuild_remote_error, (*fields, self.function), self.__dict__)


class MismatchError(SyncRewardError):
    """Ranks made different synced calls at the same point (different function, columns, mode or order)."""


class InputError(SyncRewardError, ValueError):
    """Per-sample input that cannot be synced, e.g. columns whose lengths disagree."""


class ResultLengthError(InputError):
    """The function returned a result whose length is not the number of samples it was given."""


class UnsupportedTypeError(SyncRewardError, TypeError):
    """A value the wire format cannot carry without pickle (e.g. a PIL image or a custom class)."""


class ColumnNotSyncedError(SyncRewardError, KeyError):
    """The function used a per-sample column not gathered from the other ranks (excluded, or not plain data)."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CodecError(SyncRewardError):
    """A buffer that is not valid syncreward wire data (truncated, corrupted or hostile)."""


class BackendError(SyncRewardError, RuntimeError):
    """No usable backend, or a distributed job configured in a way syncreward cannot work with."""


class CommunicationError(SyncRewardError):
    """The transport failed: a peer process died or the connection broke."""


class SyncTimeoutError(CommunicationError, TimeoutError):
    """Some ranks did not reach the synced call (or send their part of it) within ``timeout`` seconds.

    Attributes:
        missing_ranks: ranks that had not arrived when the timeout expired (best effort).
    """

    def __init__(self, message: str, missing_ranks: Sequence[int] = ()) -> None:
        self.missing_ranks = tuple(missing_ranks)
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (*self.args[:1], self.missing_ranks), self.__dict__)


class CollectiveMismatchError(MismatchError, CommunicationError):
    """Ranks met in different collectives at the same point (``main``'s gather beside another mode's all_to_all).

    A :class:`MismatchError` to the user; a transport failure to syncreward: the collectives cannot be taken
    back, so the group is lost (every later call raises :class:`GroupBrokenError` naming this).
    """


_COLLECTIVES = {
    "gather": "a gather (mode='main')",
    "all_to_all": "an all_to_all (mode='replicate' or 'shard', or a reward group's hit)",
    "scatter": "a scatter (mode='main''s results)",
}


def collective_mismatch_message(kinds: dict[int, str]) -> str:
    """What every rank raises when the ranks (``rank -> kind`` of collective, as far as known) met in different ones."""
    lines = [f"  rank {r}: in {_COLLECTIVES.get(k, k)}" for r, k in sorted(kinds.items())]
    return (
        "ranks made different synced calls at the same point, so their batches cannot be combined:\n"
        + "\n".join(lines)
        + "\nHINT: every rank must call the same synced functions in the same order (calls of different modes cannot "
        "be combined); the group is now unusable."
    )


class ModeContractError(SyncRewardError):
    """A mode broke the mode contract (``_modes._base``): a bug in the mode, not in the user's code.

    Not exported: only a mode author meets it. The step it is raised in breaks the group at once.
    """


def seconds(t: float) -> str:
    """Seconds as messages show them, to a tenth: ``timeout=2.0`` is ``2``, ``timeout=0.25`` is ``0.2``."""
    return f"{round(t, 1):g}"


def timeout_message(missing: Sequence[int], timeout: float, of: str = "") -> str:
    """What a timeout says, in every backend's words alike (the session adds which call, on which rank).

    ``of`` follows the missing ranks (`` of Ray group 'g'``).
    """
    if missing:
        what = (
            f"rank(s) {list(missing)}{of} did not arrive within timeout={seconds(timeout)}s (hung, still busy, dead, "
            "or they made fewer synced calls than this rank)"
        )
        who = f"rank(s) {list(missing)}"
    else:
        what = f"every rank arrived, but the data did not get through within timeout={seconds(timeout)}s"
        who = "a rank"
    return (
        f"{what}. HINT: raise timeout= if {who} legitimately take(s) longer to get here (a slow reward on the "
        "scoring rank, long work between synced calls); otherwise make every rank make the same synced calls. "
        "The group is now unusable."
    )


def forked_message(what: str, pid: int, parent: int, owner: str) -> str:
    """What a synced call made in a forked child says (``what``: the call; ``owner``: whose exchanges it joins)."""
    return (
        f"{what} was made in a process forked (pid {pid}) from {owner} (pid {parent}); the child cannot take part "
        "in its exchanges and must not touch its process groups. HINT: make synced calls in the training process "
        "itself, not in fork-started workers (a DataLoader's workers, multiprocessing with the fork start method)."
    )


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type's name when it has none, or ``str()`` fails)."""
    try:
        text = str(e).strip()
    except BaseException:
        text = ""
    return text.splitlines()[0] if text else type(e).__name__


def late_message(record: str) -> str:
    """What a rank says that arrives after the others gave up on it (``record``: who waited how long for whom).

    The seconds are the record's: the ``timeout=`` of the call of the rank that gave up (not this rank's).
    """
    return (
        f"the other ranks had given up waiting for this rank before it arrived ({record}). HINT: this rank was busy "
        "for longer than timeout= (a slow reward, long work between synced calls, or a synced call the others did "
        "not make); raise timeout=. The group is now unusable."
    )


def left_message(whys: Sequence[str], first: bool = False) -> str:
    """What the ranks waiting in a synced call raise when ranks left the job without making it.

    ``whys``: each leaver's own words ("rank 1 exited"); ``first``: the job's first synced call.
    """
    which = "its first synced call" if first else "this synced call"
    return (
        f"{'; '.join(whys)} without making {which}, so it will never arrive. HINT: every rank must make the same "
        "synced calls: a call made on some ranks only (a reward or an evaluation under `if rank == 0:`) leaves the "
        "others waiting for ranks that have finished; make it on every rank. The group is now unusable."
    )


_CONTAINER_WORDS = {"list": "a list", "tuple": "a tuple", "ndarray": "a numpy array", "tensor": "a tensor"}


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def column_differences(columns: Sequence[Sequence[tuple[str, str]] | None]) -> list[str]:
    """How the ranks' per-sample columns differ, one line per column, from each rank's ``(name, container)`` pairs.

    ``column 'scores' is a numpy array on rank 0 and a list on rank 1``; ``column 'solution' is passed on
    rank 0 but not on rank 1``. Empty where a rank's columns are unknown (``None``: its arguments did not bind).
    """
    if any(cols is None for cols in columns):
        return []
    passed = [dict(cols) for cols in columns if cols is not None]
    lines = []
    for name in dict.fromkeys(n for cols in passed for n in cols):
        by_kind: dict[str, list[int]] = {}
        for rank, cols in enumerate(passed):
            by_kind.setdefault(cols.get(name, ""), []).append(rank)
        if len(by_kind) == 1:
            continue
        missing = by_kind.pop("", [])
        kinds = [f"{_CONTAINER_WORDS.get(k, k)} on {_ranks(ranks)}" for k, ranks in by_kind.items()]
        if missing and len(kinds) == 1:
            lines.append(f"column {name!r} is passed on {_ranks(by_kind.popitem()[1])} but not on {_ranks(missing)}")
        else:
            absent = f", and not passed on {_ranks(missing)}" if missing else ""
            lines.append(f"column {name!r} is {' and '.join(kinds)}{absent}")
    return lines


def call_words(seq: int, function: str) -> str:
    """How every message names one call: ``synced call #3 of 'my_reward'``."""
    return f"synced call #{seq} of {function!r}"


def reason_of(e: BaseException) -> str:
    """What a later call says broke the group: the failure's message, without its hint."""
    return first_line(e).split(" HINT:")[0].rstrip(". ")


def stuck_error(call: str, timeout: float) -> SyncTimeoutError:
    """``call`` could not start by its deadline (``timeout`` from its start): earlier calls never finished."""
    return SyncTimeoutError(
        f"{call} could not start within its timeout={seconds(timeout)}s: earlier synced calls on this rank had "
        "not finished. HINT: an earlier synced call is "
        "stuck (a hung reward, or a call the other ranks never made); the group is now unusable."
    )


def reworded(e: CommunicationError, message: str) -> CommunicationError:
    """``e`` with ``message``: the same type, the same attributes (it is rebuilt as pickling rebuilds it)."""
    try:
        clone = copy.copy(e)
        clone.args = (message, *e.args[1:])
    except Exception:  # a third-party subclass that cannot be rebuilt: its own words, then
        return e
    return clone


def text_of(e: BaseException) -> str:
    """An exception's whole message, stripped (its type's name when it has none, or ``str()`` fails)."""
    try:
        text = str(e).strip()
    except BaseException:
        text = ""
    return text or type(e).__name__


def _rebuild_remote_error(
    origin_rank: int, exc_type: str, exc_message: str, remote_traceback: str, function: str
) -> RemoteError:
    return RemoteError(origin_rank, exc_type, exc_message, remote_traceback, function=function)


class GroupBrokenError(CommunicationError):
    """An earlier transport failure (timeout, dead peer) left syncreward's process group unusable."""


for _cls in (
    SyncRewardError,
    RemoteError,
    MismatchError,
    InputError,
    ResultLengthError,
    UnsupportedTypeError,
    ColumnNotSyncedError,
    CodecError,
    BackendError,
    CommunicationError,
    SyncTimeoutError,
    GroupBrokenError,
):
    _cls.__module__ = "syncreward"  # shown as syncreward.InputError in tracebacks and remote errors
