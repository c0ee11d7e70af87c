"""Ctrl-C during a synced call: it travels, and it never leaves a rank waiting for ``timeout=``.

A KeyboardInterrupt while a rank encodes or decodes a call's data travels as that rank's failure: the
interrupted rank raises it, the others a RemoteError naming it, at once (never at ``timeout=``). Below, in
its own section: a Ctrl-C while a call waits for its turn.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import syncreward
from syncreward import RemoteError, synced_reward, synced_rewards
from syncreward.testing import ThreadGroup, run_threads


class InterruptsWhenSent:
    """A value whose encoding is interrupted (as a Ctrl-C arriving while a rank encodes its batch)."""

    def __reduce__(self) -> Any:
        raise KeyboardInterrupt("interrupted while encoding")


@pytest.fixture(autouse=True)
def _ctrl_c_raises() -> Iterator[None]:
    """A Ctrl-C raises ``KeyboardInterrupt`` here, as in a terminal, even where the runner started with SIGINT ignored.

    (A shell starts a background job with SIGINT ignored, and Python then leaves it ignored: the interrupts these
    tests send would never arrive.)
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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


# ---------------------------------------------------------------------------------------------
# A Ctrl-C that lands while a synced call waits for its turn (an abandoned call still exchanging ahead of it).
#
# The call's turn is then never taken: no later call of this rank can get its own. The rank must say so at
# once (the group is broken), not wait ``timeout=`` for a turn that never comes.


def plain(completions: list[str], **kwargs: Any) -> list[float]:
    return [float(len(completions))] * len(completions)


async def judged(completions: list[str], **kwargs: Any) -> list[float]:
    return [float(len(completions))] * len(completions)


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
def test_interrupt_while_waiting_for_the_turn_breaks_the_session_at_once() -> None:
    assert threading.current_thread() is threading.main_thread()
    backend = ThreadGroup(2).backends()[0]  # rank 1 never comes: call #0 waits for it in the background
    first = synced_reward(judged, backend=backend, timeout=60)
    second = synced_reward(plain, backend=backend, timeout=60)

    async def abandon_first() -> None:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(first(completions=["a"]), 0.2)  # abandoned: still exchanging

    asyncio.run(abandon_first())
    timer = threading.Timer(1.0, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            second(completions=["a"])  # waits for call #0's turn; Ctrl-C there
    finally:
        timer.cancel()
    t0 = time.monotonic()
    with pytest.raises(syncreward.GroupBrokenError) as info:
        second(completions=["a"])
    waited = time.monotonic() - t0
    assert waited < 30, (waited, info.value)  # a turn that never comes would be waited for timeout=60
    assert "KeyboardInterrupt" in str(info.value), info.value


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs signal.pthread_kill")
def test_interrupt_while_a_waiting_turn_retakes_its_lock_leaves_another_threads_hold_alone() -> None:
    """A Ctrl-C that lands while a step, its wait over, re-takes the turnstile's lock from another thread.

    The interrupt is raised once the lock is this thread's again: the other thread's critical section
    (finishing a turn, handing the next step to a worker) is never cut short by a release from here,
    and the turnstile keeps its order afterwards.
    """
    from syncreward._deadline import Deadline
    from syncreward._outcome import Value
    from syncreward._turnstile import Latch, Turnstile

    assert threading.current_thread() is threading.main_thread()
    turns = Turnstile(Latch(), lambda reason: None)
    main = threading.main_thread().ident
    assert main is not None
    holder: list[str] = []

    def hold() -> None:
        time.sleep(0.2)
        try:
            with turns._lock:  # held across the end of the main thread's wait (its timeout: 0.5 s)
                time.sleep(0.6)  # the main thread now blocks re-taking the lock
                signal.pthread_kill(main, signal.SIGINT)  # the Ctrl-C lands there
                time.sleep(0.5)
            holder.append("released")
        except BaseException as e:  # a release from the interrupted thread makes this one's fail
            holder.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            turns.run(1, lambda: Value("late"), Deadline(0.5), "synced call #1 of 'f'")  # not its turn: #0 comes first
    finally:
        thread.join(10)
    assert not thread.is_alive()
    assert holder == ["released"]
    for seq, what in ((0, "first"), (1, "second")):  # the turns still come in order
        got = turns.run(seq, lambda what=what: Value(what), Deadline(5), f"synced call #{seq} of 'f'")
        assert isinstance(got, Value), got
        assert got.value == what
