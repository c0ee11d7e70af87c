"""What each failed Ray exchange becomes: one test per row of ``ray._FAILURES``.

No Ray instance: the member talks to a stand-in coordinator, and ``ray.get`` is replaced by what the
lower layer would return or raise.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from ray.exceptions import GetTimeoutError, RayActorError, RayError  # noqa: E402

from syncreward import CommunicationError, GroupBrokenError, SyncTimeoutError  # noqa: E402
from syncreward.backends import _ray_coordinator  # noqa: E402
from syncreward.backends import ray as ray_backend  # noqa: E402
from syncreward.backends._ray_coordinator import BROKEN, ERROR, FAILED, TIMEOUT  # noqa: E402
from syncreward.backends._waiting import TIMEOUT as TIMEOUT_GIVEN  # noqa: E402
from syncreward.backends.ray import _FAILURES, _UNUSABLE, _WRONG_SIZE  # noqa: E402

GROUP = "g"


class _Coordinator:
    class exchange:  # stands in for an actor method
        @staticmethod
        def remote(*args: Any) -> str:
            return "ref"


def _member(monkeypatch: pytest.MonkeyPatch, reply: Any) -> ray_backend.RayBackend:
    """A member whose exchanges get ``reply`` (an exception is raised from ``ray.get``)."""

    def get(ref: Any, timeout: float | None = None) -> Any:
        if isinstance(reply, BaseException):
            raise reply
        return reply

    monkeypatch.setattr(ray_backend.ray, "get", get)
    return ray_backend.RayBackend(GROUP, 0, 2, _Coordinator(), "token", True)


def _fail(member: ray_backend.RayBackend, timeout: float = 5.0) -> BaseException:
    with pytest.raises(BaseException) as info:
        member.all_gather(np.zeros(2, dtype=np.int64), channel=0, timeout=timeout)
    return info.value


# what the lower layer gives, per row of the table (an exception ray.get raises, or the coordinator's reply)
CASES: dict[Any, Any] = {
    GetTimeoutError: GetTimeoutError("Get timed out"),
    RayActorError: RayActorError(),
    RayError: RayError("object lost\ndetails"),
    TIMEOUT: (TIMEOUT, ([1], "rank(s) [1] of Ray group 'g' did not arrive within timeout=5s")),
    BROKEN: (BROKEN, "rank 1 of group 'g' died (its actor died: x)"),
    FAILED: (FAILED, "the members' synced calls went out of step"),
    _WRONG_SIZE: ("ok", b"abc"),
    _UNUSABLE: (BROKEN, "rank 1 died"),  # the failure before; the row is what every later exchange raises
}


def test_every_row_has_a_case() -> None:
    assert set(CASES) == set(_FAILURES)


def test_ray_failure_get_timeout_maps_to_sync_timeout_error(monkeypatch: pytest.MonkeyPatch) -> None:
    member = _member(monkeypatch, CASES[GetTimeoutError])
    err = _fail(member, timeout=5.0)
    assert type(err) is SyncTimeoutError
    assert err.missing_ranks == ()
    assert str(err).startswith("the coordinator of Ray group 'g' did not reply within 35s. HINT:")
    assert isinstance(err.__cause__, GetTimeoutError)
    assert member._broken == "the group's coordinator did not reply"


def test_ray_failure_actor_died_maps_to_communication_error(monkeypatch: pytest.MonkeyPatch) -> None:
    member = _member(monkeypatch, CASES[RayActorError])
    err = _fail(member)
    assert type(err) is CommunicationError
    assert str(err).startswith("Ray group 'g': the coordinator actor died (")
    assert "ray.kill / destroy()" in str(err)
    assert member._broken == "the group's coordinator actor died"


def test_ray_failure_other_ray_error_maps_to_communication_error(monkeypatch: pytest.MonkeyPatch) -> None:
    member = _member(monkeypatch, CASES[RayError])
    err = _fail(member)
    assert type(err) is CommunicationError
    assert str(err) == "Ray failed for group 'g': object lost. The group is now unusable."
    assert member._broken == "Ray failed: object lost"


def test_ray_failure_that_is_no_ray_error_is_not_mapped(monkeypatch: pytest.MonkeyPatch) -> None:
    err = _fail(_member(monkeypatch, KeyError("not Ray's")))
    assert type(err) is KeyError


def test_ray_failure_coordinator_timeout_maps_to_sync_timeout_error_naming_missing_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    member = _member(monkeypatch, CASES[TIMEOUT])
    err = _fail(member, timeout=5.0)
    assert type(err) is SyncTimeoutError
    assert err.missing_ranks == (1,)
    assert str(err).startswith("rank(s) [1] of Ray group 'g' did not arrive within timeout=5s (hung, still busy")
    assert member._broken == CASES[TIMEOUT][1][1]


def test_ray_failure_coordinator_timeout_names_the_timeout_given_not_the_seconds_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Handed 5 s left of a call of ``timeout=30``, the member's message and the coordinator's words name 30 s."""
    sent: list[tuple[Any, ...]] = []

    class Coordinator:
        class exchange:
            @staticmethod
            def remote(*args: Any) -> str:
                sent.append(args)
                return "ref"

    monkeypatch.setattr(ray_backend.ray, "get", lambda ref, timeout=None: CASES[TIMEOUT])
    member = ray_backend.RayBackend(GROUP, 0, 2, Coordinator(), "token", True)
    given = TIMEOUT_GIVEN.set(30.0)  # the session sets the call's timeout= around every step
    try:
        err = _fail(member, timeout=5.0)
    finally:
        TIMEOUT_GIVEN.reset(given)
    assert str(err).startswith("rank(s) [1] of Ray group 'g' did not arrive within timeout=30s (hung"), str(err)
    (args,) = sent
    assert args[-2:] == (5.0, 30.0)  # the coordinator waits the seconds left and names timeout=30


def test_ray_coordinator_timeout_reply_names_the_timeout_given_not_the_seconds_left() -> None:
    """The coordinator itself (driven in this process, no Ray) waits the seconds left and names ``said``."""
    coordinator = _ray_coordinator._Coordinator(GROUP, 2, {})

    async def exchange() -> Any:
        await coordinator.register(0, 2, "token", None)
        return await coordinator.exchange(0, "token", 0, _ray_coordinator.GATHER, b"x", None, 0.2, 30.0)

    assert asyncio.run(exchange()) == (TIMEOUT, ([1], "rank(s) [1] of Ray group 'g' did not arrive within timeout=30s"))


def test_ray_failure_coordinator_broken_maps_to_group_broken_error(monkeypatch: pytest.MonkeyPatch) -> None:
    member = _member(monkeypatch, CASES[BROKEN])
    err = _fail(member)
    assert type(err) is GroupBrokenError
    assert str(err) == (
        "Ray group 'g' broke before this rank arrived (rank 1 of group 'g' died (its actor died: x)). HINT: restart "
        "the group's actors, or join a group with a new name."
    )


@pytest.mark.parametrize("status", [FAILED, ERROR, "a status no coordinator sends"])  # FAILED is their row
def test_ray_failure_coordinator_failed_maps_to_communication_error(
    monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    member = _member(monkeypatch, (status, CASES[FAILED][1]))
    err = _fail(member)
    assert type(err) is CommunicationError
    assert str(err).startswith("Ray group 'g' failed: the members' synced calls went out of step. HINT: see the")
    assert member._broken == "the members' synced calls went out of step"


def test_ray_failure_wrong_size_reply_maps_to_communication_error(monkeypatch: pytest.MonkeyPatch) -> None:
    member = _member(monkeypatch, CASES[_WRONG_SIZE])
    err = _fail(member)
    assert type(err) is CommunicationError
    assert str(err).startswith("this member of Ray group 'g' received 3 bytes where it expected 32. HINT:")
    assert member._broken == "a member received 3 bytes where it expected 32"


def test_ray_member_after_a_failure_maps_to_group_broken_error(monkeypatch: pytest.MonkeyPatch) -> None:
    member = _member(monkeypatch, CASES[_UNUSABLE])
    _fail(member)
    monkeypatch.setattr(ray_backend.ray, "get", lambda *a, **k: ("ok", b"\0" * 32))  # would succeed now
    err = _fail(member)
    assert type(err) is GroupBrokenError
    assert str(err) == (
        "Ray group 'g' is unusable after an earlier failure (rank 1 died). HINT: restart the group's actors, or join "
        "a group with a new name."
    )
    assert member._broken == "rank 1 died"
