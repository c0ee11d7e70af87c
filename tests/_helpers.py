"""Helpers shared by the multi-rank test modules (importable from spawned ranks: tests/ is on sys.path)."""

from __future__ import annotations

import time
from typing import Any

import syncreward


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any, float]:
    """Call ``fn`` and describe what happened: ``(kind, info, seconds)``.

    ``kind`` is ``"ok"`` or the exception's class name; ``info`` the return value, ``(origin_rank,
    exc_type, exc_message)`` for a RemoteError, the missing ranks for a SyncTimeoutError, else the message.
    """
    t0 = time.perf_counter()
    try:
        value = fn(*args, **kwargs)
    except Exception as e:
        info: Any = str(e)
        if isinstance(e, syncreward.RemoteError):
            info = (e.origin_rank, e.exc_type, e.exc_message)
        elif isinstance(e, syncreward.SyncTimeoutError):
            info = e.missing_ranks
        return type(e).__name__, info, time.perf_counter() - t0
    return "ok", value, time.perf_counter() - t0
