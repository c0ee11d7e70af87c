"""Review of the issue-17 refactor (outcomes, frozen Call, status_round): behaviour it had to keep.

Each test names the behaviour; the docstring says whether it held at 8ced485 (the commit before the
refactor) or was already missing there.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import pytest

import syncreward
from syncreward import MismatchError, RemoteError, synced_reward, synced_rewards
from syncreward.testing import run_threads

# --------------------------------------------------------------------------------------------- wire version

OLD_WIRE_VERSION = 0x5352_0002  # the wire version 8ced485 speaks
OLD_REPLICATE_STATUS_WORDS = 4  # 8ced485's replicate status row: status, error bytes, fingerprint, sequence number


class SpeaksOldWire:
    """Wraps a rank's backend so that the rank speaks 8ced485's wire: its header's version word, its
    replicate status row (the only collective whose layout the refactor changed)."""

    def __init__(self, inner: syncreward.Backend) -> None:
        self.inner = inner
        self.headers_sent = False

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def world_size(self) -> int:
        return self.inner.world_size

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        if channel == 1:  # replicate's status round (the only channel-1 all_gather of this test)
            row = row[:OLD_REPLICATE_STATUS_WORDS]
        return self.inner.all_gather(row, channel=channel, timeout=timeout)

    def all_to_all(
        self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], *, channel: int, timeout: float
    ) -> np.ndarray:
        if channel == 0 and not self.headers_sent:  # the first inbound collective: one header per destination
            self.headers_sent = True
            send = send.copy()
            for at in np.cumsum([0, *send_counts[:-1]]).tolist():
                send[at : at + 8] = np.frombuffer(np.int64(OLD_WIRE_VERSION).tobytes(), dtype=np.uint8)
        return self.inner.all_to_all(send, send_counts, recv_counts, channel=channel, timeout=timeout)


def test_a_rank_on_the_previous_wire_either_pairs_or_every_rank_is_told_the_versions_differ() -> None:
    """A rank running 8ced485 next to one running this version (one node not yet updated).

    The refactor grew replicate's status row from 4 to 6 words (it now carries the call's check record)
    without changing the wire version, so the header check passes and the two ranks then run a
    collective of different sizes: with gloo the 8ced485 rank aborts (``op.preamble.length <= op.nbytes.
    48 vs 32``), here the thread backend reports a protocol violation. Either the ranks still pair (as
    8ced485 with itself does) or every rank raises the MismatchError that names the wire versions.
    Passes at 8ced485 (it pairs); failed at 3426514.
    """

    def reward(completions: Any, **kwargs: Any) -> list[float]:
        return [float(len(completions))] * len(completions)

    def body(rank: int, world_size: int) -> tuple[str, Any]:
        backend = syncreward.resolve_backend("auto")
        if rank == 1:
            backend = SpeaksOldWire(backend)
        f = synced_reward(mode="replicate", backend=backend, timeout=5)(reward)
        try:
            return "ok", f([f"c{rank}"] * (rank + 1))
        except MismatchError as e:
            return "mismatch", str(e)

    outcomes = run_threads(body, 2, timeout=30)
    kinds = {kind for kind, _ in outcomes}
    assert kinds in ({"ok"}, {"mismatch"}), outcomes
    if kinds == {"mismatch"}:
        assert all("different syncreward wire versions" in text for _, text in outcomes), outcomes
    else:
        assert [v for _, v in outcomes] == [[3.0], [3.0, 3.0]]


# --------------------------------------------------------------------------------------------- reward groups


class InterruptsWhenSent:
    """A value whose encoding is interrupted (as a Ctrl-C arriving while a rank encodes its batch)."""

    def __reduce__(self) -> Any:
        raise KeyboardInterrupt("interrupted while encoding")


def test_a_keyboard_interrupt_while_a_reward_group_member_encodes_raises_on_every_rank_at_once() -> None:
    """A reward group's miss encodes its columns in its inbound turn (a hit sends nothing).

    A KeyboardInterrupt there must travel like one while an ordinary call prepares: the interrupted rank
    raises it, the others a RemoteError naming it, at once, and the next call works. It escaped the
    hook instead: the interrupted rank broke its session, the others waited for it until ``timeout=``
    and every later call raised GroupBrokenError. Already so at 8ced485 (not a regression of the refactor).
    """
    timeout = 6.0

    def a(completions: Any, obj: Any, **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)

    def b(completions: Any, **kwargs: Any) -> list[float]:
        return [2.0] * len(completions)

    def body(rank: int, world_size: int) -> list[Any]:
        A, B = synced_rewards(a, b, mode="main", timeout=timeout, allow_pickle=True)
        n = rank + 1
        obj = [InterruptsWhenSent()] * n if rank == 1 else list(range(n))
        out: list[Any] = []
        t0 = time.monotonic()
        try:
            A(completions=["c"] * n, obj=obj)
            out.append("ok")
        except KeyboardInterrupt:
            out.append("KeyboardInterrupt")
        except RemoteError as e:
            out.append(("RemoteError", e.origin_rank, e.exc_type))
        except Exception as e:
            out.append(type(e).__name__)
        out.append(time.monotonic() - t0)
        try:
            out.append(B(completions=["d"] * n))
        except Exception as e:
            out.append(type(e).__name__)
        return out

    results = run_threads(body, 3, timeout=60)
    assert [r[0] for r in results] == [
        ("RemoteError", 1, "KeyboardInterrupt"),
        "KeyboardInterrupt",
        ("RemoteError", 1, "KeyboardInterrupt"),
    ], results
    assert all(r[1] < timeout / 2 for r in results), results
    assert [r[2] for r in results] == [[2.0], [2.0, 2.0], [2.0, 2.0, 2.0]], results


# ----------------------------------------------------------------------------------- known gaps (not regressions)


@pytest.mark.xfail(
    strict=True,
    reason="already so at 8ced485: a hit has no inbound exchange, so a miss on one rank and a hit on another "
    "wait on different channels until timeout=",
)
@pytest.mark.parametrize("mode", ["main", "replicate"])
def test_reward_group_members_in_another_order_where_one_rank_misses_raise_mismatch_on_every_rank_at_once(
    mode: Literal["main", "replicate"],
) -> None:
    """The module docstring of ``_group``: members called in a different order raise MismatchError on every
    rank. When the member one rank calls needs a column the earlier call did not gather (a miss) while the
    other rank's member is a hit, the ranks meet in no collective: both raise SyncTimeoutError at ``timeout=``
    (30 minutes by default) and the session is broken. Fails at 8ced485 too.
    """
    timeout = 2.0

    def a(completions: Any) -> list[float]:
        return [1.0] * len(completions)

    def b(completions: Any, solution: Any) -> list[float]:
        return [2.0] * len(completions)

    def c(completions: Any) -> list[float]:
        return [3.0] * len(completions)

    def body(rank: int, world_size: int) -> tuple[str, float]:
        A, B, C = synced_rewards(a, b, c, mode=mode, timeout=timeout)
        completions, solution = [f"c{rank}"] * (rank + 1), [f"s{rank}"] * (rank + 1)
        A(completions)  # a miss on every rank; it gathers `completions` only
        t0 = time.monotonic()
        try:
            B(completions, solution) if rank == 0 else C(completions)  # rank 0: a miss (solution); rank 1: a hit
        except Exception as e:
            return type(e).__name__, time.monotonic() - t0
        return "ok", time.monotonic() - t0

    results = run_threads(body, 2, timeout=30)
    assert [kind for kind, _ in results] == ["MismatchError", "MismatchError"], results
    assert all(t < timeout / 2 for _, t in results), results


def _interrupt_on_rank_0() -> int:
    import threading

    if threading.current_thread().name.endswith("rank0"):
        raise KeyboardInterrupt("interrupted while decoding")
    return 1


class InterruptsWhenReceivedOnRank0:
    def __reduce__(self) -> Any:
        return (_interrupt_on_rank_0, ())


@pytest.mark.parametrize(
    "options", [{"mode": "main"}, {"mode": "replicate"}, {"mode": "shard", "group_size": 1}], ids=lambda o: o["mode"]
)
def test_a_keyboard_interrupt_while_the_scoring_rank_decodes_raises_on_every_rank_at_once(
    options: dict[str, Any],
) -> None:
    """A KeyboardInterrupt while rank 0 decodes the gathered inputs travels as its failure: rank 0 raises it,
    ranks 1 and 2 a RemoteError, at once. At 8ced485 it escaped the hook (decoding caught ``Exception`` only),
    broke rank 0's session and held the others until ``timeout=``.
    """
    timeout = 2.0

    @synced_reward(**options, timeout=timeout, allow_pickle=True)
    def reward(completions: Any, obj: Any) -> list[float]:
        return [1.0] * len(completions)

    def body(rank: int, world_size: int) -> tuple[str, float]:
        t0 = time.monotonic()
        try:
            reward(["c"] * (rank + 1), [InterruptsWhenReceivedOnRank0() for _ in range(rank + 1)])
        except KeyboardInterrupt:
            return "KeyboardInterrupt", time.monotonic() - t0
        except Exception as e:
            return type(e).__name__, time.monotonic() - t0
        return "ok", time.monotonic() - t0

    results = run_threads(body, 3, timeout=30)
    assert [kind for kind, _ in results] == ["KeyboardInterrupt", "RemoteError", "RemoteError"], results
    assert all(t < timeout / 2 for _, t in results), results
