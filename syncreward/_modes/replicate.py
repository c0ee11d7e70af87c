"""``mode="replicate"``: every rank gets the whole batch, scores it, and keeps its own slice.

For cheap, deterministic rewards: no results travel. Two collectives per call in the steady state: the
inbound exchange (every payload to every rank in the eager chunks) and a status exchange, so a
function that fails on any rank raises on every rank.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .._batch import rebuild_result, result_columns, take
from .._codec import Column
from .._errors import MismatchError
from .._exchange import Inbound, all_gather, report_failures
from .._logs import Logs
from .._session import Raise
from .._wire import FAILED, OK, error_blob
from ._base import Call, GatherMode, Scoring

__all__ = ["ReplicateMode"]


@lru_cache(maxsize=8)
def _to_all(world_size: int) -> np.ndarray:
    out = ~np.eye(world_size, dtype=bool)
    out.flags.writeable = False
    return out


class ReplicateMode(GatherMode):
    name = "replicate"

    def route(self, world_size: int) -> np.ndarray:
        return _to_all(world_size)

    def scores_here(self, call: Call) -> bool:
        return True

    def proxies(self, call: Call, logs: Logs, inbound: Inbound) -> dict[str, Any]:
        lo, hi = inbound.offsets[call.rank], inbound.offsets[call.rank + 1]
        return logs.forwarding(lo, hi, inbound.total)

    def outbound(self, call: Call, scoring: Scoring, result: Any, error: BaseException | None) -> Any:
        got = scoring.state
        own: Any = None
        if error is None:
            try:
                keys, cols = result_columns(result, got.total, call.spec.name)
                rows = slice(got.offsets[call.rank], got.offsets[call.rank + 1])
                own = rebuild_result(
                    keys, [Column(c.name, c.container, take(c.values, c.container, rows)) for c in cols], None
                )
            except Exception as e:
                error = e
        blob = error_blob(error) if error is not None else b""
        s = all_gather(call.session, [OK if error is None else FAILED, len(blob), call.fp, call.seq], 1, call.timeout)
        statuses = [int(x) for x in s[:, 0]]
        if len({(int(a), int(b)) for a, b in s[:, 2:4]}) > 1:  # a reward group's call skips the header check
            return Raise(
                MismatchError(
                    f"ranks made different synced calls at the same point (this rank: {call.description}). "
                    "HINT: every rank must call the same synced functions in the same order."
                )
            )
        if any(statuses):
            return report_failures(
                call.session, statuses, s[:, 1].tolist(), error, blob, 1, call.timeout, call.spec.name
            )
        return own
