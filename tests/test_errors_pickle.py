"""Every public exception survives pickling (Ray, multiprocessing and pytest-xdist ship exceptions so)."""

from __future__ import annotations

import pickle

import pytest

import syncreward
from syncreward import (
    BackendError,
    CodecError,
    ColumnNotSyncedError,
    CommunicationError,
    GroupBrokenError,
    InputError,
    MismatchError,
    RemoteError,
    ResultLengthError,
    SyncRewardError,
    SyncTimeoutError,
    UnsupportedTypeError,
)

CASES = {
    "RemoteError": (
        RemoteError(3, "builtins.ValueError", "bad sample", "Traceback ...\nValueError: bad sample\n", function="f"),
        ("origin_rank", "exc_type", "exc_message", "remote_traceback", "function"),
    ),
    "SyncTimeoutError": (
        SyncTimeoutError("rank(s) [1, 2] did not reach the exchange", missing_ranks=(1, 2)),
        ("missing_ranks",),
    ),
    "SyncTimeoutError-positional": (SyncTimeoutError("timed out", [4]), ("missing_ranks",)),
    "SyncRewardError": (SyncRewardError("base"), ()),
    "MismatchError": (MismatchError("ranks made different synced calls"), ()),
    "InputError": (InputError("lengths differ"), ()),
    "ResultLengthError": (ResultLengthError("3 results for 4 samples"), ()),
    "UnsupportedTypeError": (UnsupportedTypeError("cannot send a Foo"), ()),
    "ColumnNotSyncedError": (ColumnNotSyncedError("column 'image' was not exchanged"), ()),
    "CodecError": (CodecError("truncated frame"), ()),
    "BackendError": (BackendError("no backend"), ()),
    "CommunicationError": (CommunicationError("peer died"), ()),
    "GroupBrokenError": (GroupBrokenError("group unusable"), ()),
}


def test_errors_pickle_cases_cover_every_public_exception() -> None:
    public = {
        name
        for name in syncreward.__all__
        if isinstance(getattr(syncreward, name), type) and issubclass(getattr(syncreward, name), BaseException)
    }
    assert public <= {name.split("-")[0] for name in CASES}


@pytest.mark.parametrize("name", sorted(CASES))
def test_errors_pickle_round_trip(name: str) -> None:
    error, attributes = CASES[name]
    try:
        clone = pickle.loads(pickle.dumps(error))
    except Exception as e:  # report the failure as a test failure, not a crash of the round trip
        pytest.fail(f"pickle round trip of {name} raised {type(e).__name__}: {e}")
    assert type(clone) is type(error)
    assert str(clone) == str(error)
    assert clone.args == error.args
    for attr in attributes:
        assert getattr(clone, attr) == getattr(error, attr), f"{name}.{attr} lost in the round trip"
