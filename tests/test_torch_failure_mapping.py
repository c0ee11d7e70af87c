"""What each torch.distributed / gloo failure becomes: one test per row of ``torch_distributed._FAILURES``.

No ranks: ``_translate`` is a pure function of the lower layer's exception.
"""

from __future__ import annotations

import pytest

from syncreward import CommunicationError, SyncTimeoutError
from syncreward.backends import torch_distributed
from syncreward.backends.torch_distributed import _FAILURES, _is_timeout, _translate

# one failure the lower layer really raises per row, in the table's order (test_every_row_has_a_case)
ROW_CASES = [
    RuntimeError("[enforce fail at gloo/transport/tcp/pair.cc:123] Too many open files (24)"),
    RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:41234"),
    RuntimeError("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 30000ms"),
    RuntimeError("[enforce fail at gloo/transport/tcp/address.cc:88] getsockname: Bad file descriptor"),
]


def _row(e: BaseException) -> int:
    lowered = str(e).lower()
    return next(i for i, row in enumerate(_FAILURES) if row.matches(e, lowered))


def test_every_row_has_a_case() -> None:
    assert [_row(e) for e in ROW_CASES] == list(range(len(_FAILURES)))


def test_torch_failure_too_many_open_files_maps_to_communication_error_with_ulimit_hint() -> None:
    err = _translate(ROW_CASES[0])
    assert type(err) is CommunicationError
    assert str(err).startswith(
        "the process ran out of file descriptors ([enforce fail at gloo/transport/tcp/pair.cc:123] Too many open "
        "files (24)). HINT:"
    )
    assert "`ulimit -n`" in str(err)
    assert str(err).endswith("The group is now unusable.")


def test_torch_failure_connection_closed_maps_to_communication_error() -> None:
    err = _translate(ROW_CASES[1])
    assert type(err) is CommunicationError
    assert str(err).startswith("another rank closed its connection to this one: it exited, crashed or was killed.")
    assert "10.0.0.2" not in str(err)  # the words are about ranks, not sockets


def test_torch_failure_connection_reset_maps_to_communication_error() -> None:
    err = _translate(RuntimeError("Connection reset by peer"))
    assert type(err) is CommunicationError
    assert str(err) == str(_translate(ROW_CASES[1]))


@pytest.mark.parametrize("text", ["Timed out waiting 30000ms", "Socket Timeout", "op TIMED OUT"])
def test_torch_failure_timeout_text_maps_to_sync_timeout_error(text: str) -> None:
    err = _translate(RuntimeError(text))
    assert type(err) is SyncTimeoutError
    assert err.missing_ranks == ()
    assert str(err).startswith(f"the ranks did not finish within timeout= ({text}). HINT:")


def test_torch_failure_timeout_error_type_maps_to_sync_timeout_error() -> None:
    err = _translate(TimeoutError())
    assert type(err) is SyncTimeoutError
    assert "(TimeoutError)" in str(err)  # an empty message is named by its type


def test_torch_failure_anything_else_maps_to_communication_error_naming_its_first_line() -> None:
    err = _translate(ValueError("first line {with braces}\nsecond line"))
    assert type(err) is CommunicationError
    assert str(err).startswith("the connection to the other ranks failed (first line {with braces}). HINT:")
    assert "second line" not in str(err)


def test_torch_failure_rows_are_tried_in_order() -> None:
    # a reset connection that also mentions a timeout is a dead peer, not a slow one
    assert type(_translate(RuntimeError("Connection reset by peer after timeout"))) is CommunicationError
    assert "file descriptors" in str(_translate(RuntimeError("too many open files; timed out")))


def test_torch_is_timeout_is_the_timeout_row_alone() -> None:
    assert _is_timeout(RuntimeError("Connection reset by peer after timeout"))  # the setup names missing ranks
    assert _is_timeout(TimeoutError())
    assert not _is_timeout(ROW_CASES[1])
    assert torch_distributed._TIMEOUT in _FAILURES
