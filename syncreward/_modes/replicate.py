"""``mode="replicate"``: every rank gets the whole batch, scores it, and keeps its own slice.

For cheap, deterministic rewards: no results travel. Two collectives per call in the steady state: the
inbound exchange (every payload to every rank in the eager chunks) and a status exchange, so a
function that fails on any rank raises on every rank.
"""

from __future__ import annotations

from typing import Any

from .._batch import rebuild_result, result_columns, take
from .._codec import Column
from .._exchange import all_gather, exchange_inbound, report_failures
from .._logs import Logs
from .._session import Raise
from .._wire import FAILED, OK, error_blob
from ._base import Call, Mode, Scoring

__all__ = ["ReplicateMode"]


class ReplicateMode(Mode):
    name = "replicate"

    def inbound(self, call: Call) -> Scoring | Raise:
        w = call.world_size

        def others(src: int) -> list[int]:
            return [d for d in range(w) if d != src]

        payload = call.frame if call.error is None else b""
        got = exchange_inbound(
            call.session,
            header=call.header(len(payload)),
            payload=payload,
            dests=others,
            error=call.error,
            blob=call.blob,
            description=call.description,
            names=call.names,
            droppable=call.droppable,
            timeout=call.timeout,
            function=call.spec.name,
        )
        if isinstance(got, Raise):
            return got
        call.dropped = got.dropped
        logs = Logs(call.bound, call.spec.name)
        scoring = Scoring(scores=True, logs=logs, state=got)
        try:
            values = call.merge(got.frames, dict(enumerate(got.counts)), lambda v, c: v)
            lo, hi = got.offsets[call.rank], got.offsets[call.rank + 1]
            self.set_inputs(call, scoring, values, logs.forwarding(lo, hi, got.total))
        except Exception as e:
            scoring.error = e
        return scoring

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
        s = all_gather(call.session, [OK if error is None else FAILED, len(blob)], 1, call.timeout)
        statuses = [int(x) for x in s[:, 0]]
        if any(statuses):
            return report_failures(
                call.session, statuses, s[:, 1].tolist(), error, blob, 1, call.timeout, call.spec.name
            )
        return own
