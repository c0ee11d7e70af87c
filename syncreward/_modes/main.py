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

from .._batch import read_frame, rebuild_result, split_result
from .._call import Call, Payload, device, encodable_here, encode, link, record
from .._errors import CodecError
from .._exchange import OUTBOUND, Inbound, exchange_results
from .._logs import Logs
from .._outcome import Error, Outcome, Value
from ._base import GatherMode, GatherScoring

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

    def outbound(self, call: Call, scoring: GatherScoring, result: Outcome[Any]) -> Outcome[Any]:
        inbound, w = scoring.inbound, call.world_size
        rec = record(call) if scoring.reused else None  # a reward group's hit: no inbound header checked it
        if call.rank != ROOT:
            got = exchange_results(link(call, OUTBOUND), call.fp, call.seq, inbound.counts, None, record=rec)
            return got if isinstance(got, Error) else self._read(call, inbound, got.value)
        logs = scoring.logs
        assert logs is not None
        split = (
            split_result(
                result.value,
                inbound.offsets,
                call.spec.name,
                logs=logs,
                here=ROOT,
                send=[r for r in range(w) if r != ROOT],
                allow_pickle=call.spec.options.allow_pickle,
            )
            if isinstance(result, Value)
            else result
        )
        bodies = split.value.frames if isinstance(split, Value) else split.error
        got = exchange_results(link(call, OUTBOUND), call.fp, call.seq, inbound.counts, bodies, record=rec)
        if isinstance(got, Error) or isinstance(split, Error):
            return got
        try:
            logs.replay(split.value.logs[ROOT])
        except BaseException as e:
            return Error(e)
        return Value(split.value.result)

    def _read(self, call: Call, inbound: Inbound, body: bytes) -> Outcome[Any]:
        """This rank's results, from the body rank 0 sent it."""
        try:
            nrows, cols, meta = read_frame(body, call.spec.options.allow_pickle)
            if nrows != inbound.counts[call.rank]:
                raise CodecError(f"rank {ROOT} sent {nrows} results for {inbound.counts[call.rank]} samples")
            Logs(call.bound, call.spec.name).replay(meta.get("logs", ()))
            return Value(rebuild_result(meta.get("keys"), cols, device(call)))
        except BaseException as e:  # everything was exchanged: a local failure, the session stays usable
            return Error(e)
