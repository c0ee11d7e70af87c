"""The threads that run async calls' steps: never daemons, and they keep nothing of a finished step.

A worker started from a daemon thread (TRL runs its async rewards on a daemon event-loop thread) would
be a daemon too and could outlive interpreter finalisation with a step's objects -- syncreward's gloo
groups among them -- which aborted the process at exit.
"""

from __future__ import annotations

import gc
import threading
import weakref

from syncreward._workers import POOL


class _Payload:
    pass


def test_a_worker_started_from_a_daemon_thread_is_not_a_daemon() -> None:
    seen: list[bool] = []
    done = threading.Event()

    def job() -> None:
        seen.append(threading.current_thread().daemon)
        done.set()

    starter = threading.Thread(target=lambda: POOL.submit(job), daemon=True)
    starter.start()
    starter.join(10)
    assert done.wait(10)
    assert seen == [False]


def test_a_finished_step_is_not_kept_by_its_worker() -> None:
    payload = _Payload()
    ref = weakref.ref(payload)
    done = threading.Event()
    POOL.submit(lambda p: done.set(), payload)
    assert done.wait(10)
    del payload
    for _ in range(50):  # the worker drops the job right after running it
        gc.collect()
        if ref() is None:
            break
        threading.Event().wait(0.02)
    assert ref() is None
