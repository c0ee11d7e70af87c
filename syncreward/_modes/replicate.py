"""``mode="replicate"``: every rank gets the whole batch, scores it, and keeps its own slice.

For cheap, deterministic rewards: no results travel. Two collectives per call in the steady state: the
inbound exchange (every payload to every rank in the eager chunks) and a status exchange, so a
function that fails on any rank raises on every rank. Each rank scores with its own shared arguments
and keeps the results of its own samples, so shared arguments are not compared across ranks.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .._batch import split_result
from .._call import Call
from .._exchange import OUTBOUND, Inbound
from .._logs import Logs
from .._outcome import Error, Outcome, Value
from .._transfers import link, record
from ._base import GatherMode, GatherScoring

__all__ = ["ReplicateMode"]


@lru_cache(maxsize=8)
def _to_all(world_size: int) -> np.ndarray:
    out = ~np.eye(world_size, dtype=bool)
    out.flags.writeable = False
    return out


class ReplicateMode(GatherMode):
    name = "replicate"
    shares_arguments = False  # every rank scores the whole batch with its own shared arguments, keeps its slice

    def route(self, world_size: int) -> np.ndarray:
        return _to_all(world_size)

    def scores_here(self, call: Call) -> bool:
        return True

    def proxies(self, call: Call, logs: Logs, inbound: Inbound) -> dict[str, Any]:
        lo, hi = inbound.offsets[call.rank], inbound.offsets[call.rank + 1]
        return logs.forwarding(lo, hi, inbound.total)

    def route_results(self, call: Call, scoring: GatherScoring, result: Outcome[Any]) -> Outcome[Any]:
        got = scoring.inbound
        split = (
            split_result(result.value, got.offsets, call.spec.name, here=call.rank)
            if isinstance(result, Value)
            else result
        )
        # every call's status round carries its check record: a reward group's hit had no inbound header check
        mine = split.error if isinstance(split, Error) else None
        done = link(call, OUTBOUND).status_round(mine, record=record(call))
        return done if isinstance(done, Error) else Value(split.value.result if isinstance(split, Value) else None)
