"""A Ctrl-C that lands while a synced call waits for its turn (an abandoned call still exchanging ahead of it).

The call's turn is then never taken: no later call of this rank can get its own. The rank must say so at
once (the group is broken), not wait ``timeout=`` for a turn that never comes.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import ThreadGroup


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
