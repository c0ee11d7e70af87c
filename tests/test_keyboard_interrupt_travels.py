"""A KeyboardInterrupt while a rank encodes or decodes a call's data travels as that rank's failure.

The interrupted rank raises it, the others a RemoteError naming it, at once (never at ``timeout=``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from syncreward import RemoteError, synced_reward, synced_rewards
from syncreward.testing import run_threads


class InterruptsWhenSent:
    """A value whose encoding is interrupted (as a Ctrl-C arriving while a rank encodes its batch)."""

    def __reduce__(self) -> Any:
        raise KeyboardInterrupt("interrupted while encoding")


def test_a_keyboard_interrupt_while_a_reward_group_member_encodes_raises_on_every_rank_at_once() -> None:
    """A reward group's miss encodes its columns in its inbound turn (a hit sends nothing).

    A KeyboardInterrupt there must travel like one while an ordinary call prepares: the interrupted rank
    raises it, the others a RemoteError naming it, at once, and the next call works. It escaped the
    hook otherwise: the interrupted rank would break its session, the others wait for it until
    ``timeout=`` and every later call raise GroupBrokenError.
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
    ranks 1 and 2 a RemoteError, at once: it must not escape the hook (decoding that catches ``Exception``
    only would let it), break rank 0's session and hold the others until ``timeout=``.
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
