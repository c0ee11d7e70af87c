"""``mode="main"``: the whole batch goes to rank 0, which scores it once and sends every rank its slice.

Two collectives per call in the steady state: the inbound exchange (every header, with each rank's
payload riding to rank 0 in its eager chunk) and the result exchange (``_exchange.exchange_results``:
one block per rank from rank 0, sized by the previous call). One more exchange each way when a payload
or a result outgrows its prediction (always on a function's first call).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from .._batch import split_result
from .._call import Call, Payload
from .._exchange import Inbound
from .._logs import Logs
from .._outcome import Error, Outcome, Value
from .._transfers import encodable_here, encode
from ._base import GatherMode, GatherScoring, local

__all__ = ["MainMode"]

ROOT = 0


@lru_cache(maxsize=8)
def _to_root(world_size: int) -> np.ndarray:
    out = np.zeros((world_size, world_size), dtype=bool)
    out[:, ROOT] = True
    out[ROOT, ROOT] = False
    out.flags.writeable = False
    return out


class MainMode(GatherMode):
    name = "main"
    root = ROOT

    def prepare(self, call: Call) -> Payload:
        # Rank 0 scores its own columns as passed and sends nothing: it skips encoding, but refuses what the
        # other ranks refuse (a named column of non-plain data) and leaves behind what they leave behind.
        return encode(call) if call.rank != ROOT else encodable_here(call)

    def route(self, world_size: int) -> np.ndarray:
        return _to_root(world_size)

    def scores_here(self, call: Call) -> bool:
        return call.rank == ROOT

    def proxies(self, call: Call, logs: Logs, inbound: Inbound) -> dict[str, Any]:
        return logs.recording()

    def route_results(self, call: Call, scoring: GatherScoring, result: Outcome[Any]) -> Outcome[Any]:
        if call.rank != ROOT:
            got = self.send_results(call, scoring, None, ROOT)
            return got if isinstance(got, Error) else self.read_results(call, scoring.inbound, got.value, ROOT)
        logs = scoring.logs
        if logs is None:  # a gathered inbound's verdict (a rank failed, the calls differ): it goes to every rank
            return self.send_results(call, scoring, None, ROOT)
        split = (
            split_result(
                result.value,
                scoring.inbound.offsets,
                call.spec.name,
                logs=logs,
                here=ROOT,
                send=[r for r in range(call.world_size) if r != ROOT],
                allow_pickle=call.spec.options.allow_pickle,
            )
            if isinstance(result, Value)
            else result
        )
        got = self.send_results(call, scoring, split.value.frames if isinstance(split, Value) else split.error, ROOT)
        if isinstance(got, Error) or isinstance(split, Error):
            return got
        replayed = local(logs.replay, split.value.logs[ROOT])  # after the last transfer: a LocalError is told later
        return replayed if isinstance(replayed, Error) else Value(split.value.result)
