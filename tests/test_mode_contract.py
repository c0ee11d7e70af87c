"""The mode contract (``syncreward/_modes/_base.py``): every mode keeps the same promises.

Run over the built-in modes and two modes written here, outside the package, each registered with one
line (``_modes.register``): ``own_slice`` (every rank scores its own samples only: a plain ``Mode``)
and ``last_rank`` (rank W-1 scores the whole batch: a ``GatherMode``). For each, on 3 thread-ranks
with uneven batches and on 2 gloo processes:

* each rank gets exactly its own slice of the results;
* a failure on one rank -- in the reward, or preparing the call (a column that cannot be encoded) --
  raises on every rank, within seconds;
* ranks that call different functions raise ``MismatchError`` on every rank;
* the group stays usable: the next call returns every rank its slice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _helpers import outcome

from syncreward import synced_reward
from syncreward._batch import split_result
from syncreward._call import Call, Payload
from syncreward._exchange import OUTBOUND, Inbound
from syncreward._logs import Logs
from syncreward._modes import MODES, register
from syncreward._modes._base import GatherMode, GatherScoring, Mode, ModeOption, Scoring
from syncreward._outcome import Error, Outcome, Value, local
from syncreward._transfers import encodable_here, exchange, inputs, link, merge
from syncreward.testing import run_ranks, run_threads

# ------------------------------------------------------------------------------------ modes written here


class OwnSlice(Mode[Scoring]):
    """Every rank scores its own samples (only headers travel); a status round makes a failure everyone's."""

    name = "own_slice"
    shares_arguments = False

    def prepare(self, call: Call) -> Payload:
        return encodable_here(call)

    def route_inputs(self, call: Call, payload: Outcome[Payload]) -> Value[Scoring] | Error:
        got = exchange(call, payload, None)
        if isinstance(got, Error):
            return got
        n = got.value.counts[call.rank]
        values = local(merge, call, got.value, {}, {call.rank: n}, lambda v, c: v)
        if isinstance(values, Error):
            return Value(Scoring(values, None))
        return Value(Scoring(inputs(call, got.value, values.value, lambda: {}), None))

    def route_results(self, call: Call, scoring: Scoring, result: Outcome[Any]) -> Outcome[Any]:
        n = call.bound.n if call.bound is not None else 0
        split = split_result(result.value, [0, n], call.spec.name, here=0) if isinstance(result, Value) else result
        done = link(call, OUTBOUND).status_round(split.error if isinstance(split, Error) else None)
        if isinstance(done, Error):
            return done
        assert isinstance(split, Value)
        return Value(split.value.result)


class LastRank(GatherMode):
    """Rank W-1 gathers the whole batch, scores it and sends every rank its slice."""

    name = "last_rank"

    def route(self, world_size: int) -> np.ndarray:
        out = np.zeros((world_size, world_size), dtype=bool)
        out[: world_size - 1, world_size - 1] = True
        return out

    def scores_here(self, call: Call) -> bool:
        return call.rank == call.world_size - 1

    def proxies(self, call: Call, logs: Logs, inbound: Inbound) -> dict[str, Any]:
        return logs.recording()

    def route_results(self, call: Call, scoring: GatherScoring, result: Outcome[Any]) -> Outcome[Any]:
        root = call.world_size - 1
        if call.rank != root:
            got = self.send_results(call, scoring, None, root)
            return got if isinstance(got, Error) else self.read_results(call, scoring.inbound, got.value, root)
        assert scoring.logs is not None
        others = [r for r in range(call.world_size) if r != root]
        split = (
            split_result(
                result.value, scoring.inbound.offsets, call.spec.name, logs=scoring.logs, here=root, send=others
            )
            if isinstance(result, Value)
            else result
        )
        got = self.send_results(call, scoring, split.value.frames if isinstance(split, Value) else split.error, root)
        if isinstance(got, Error) or isinstance(split, Error):
            return got
        return Value(split.value.result)


EXTERNAL = (OwnSlice, LastRank)


def _register_external() -> list[str]:
    """Register the modes written here (one line each); return the names it added."""
    added = []
    for kind in EXTERNAL:
        if kind.name not in MODES:
            register(kind())
            added.append(kind.name)
    return added


@pytest.fixture
def external_modes() -> Iterator[None]:
    added = _register_external()
    try:
        yield
    finally:
        for name in added:
            MODES.pop(name)


# ------------------------------------------------------------------------------------ one body, every mode

OPTIONS: dict[str, dict[str, Any]] = {
    "main": {},
    "replicate": {},
    "shard": {"group_size": 3},
    "own_slice": {},
    "last_rank": {},
}


def _batch(rank: int) -> list[str]:
    """Rank r has 2(r + 1) samples, named by their global index: uneven slices catch off-by-one cuts (and
    shard's groups of 3 span two ranks)."""
    start = rank * (rank + 1)
    return [f"s{start + i}" for i in range(2 * (rank + 1))]


def _score(completions: list[str], **kwargs: Any) -> list[float]:
    if "boom" in completions:
        raise ValueError("boom in the batch")
    return [float(c[1:]) * 0.5 for c in completions]


def _other(completions: list[str], **kwargs: Any) -> list[float]:
    return [0.0] * len(completions)


def _body(rank: int, world_size: int, mode: str) -> dict[str, Any]:
    options = {"mode": mode, "timeout": 30.0, **OPTIONS[mode]}
    f = synced_reward(**options)(_score)
    g = synced_reward(**options)(_other)
    mine = _batch(rank)
    out = {"slice": outcome(f, mine)}
    out["fails_in_reward"] = outcome(f, ["boom"] * len(mine) if rank == 1 else mine)
    out["fails_preparing"] = outcome(f, [object()] * len(mine) if rank == 1 else mine)
    out["mismatch"] = outcome(g if rank == 1 else f, mine)
    out["after"] = outcome(f, mine)
    return out


def _check(got: list[dict[str, Any]], world_size: int) -> None:
    for r, o in enumerate(got):
        want = [float(c[1:]) * 0.5 for c in _batch(r)]
        assert o["slice"][:2] == ("ok", want), (r, o["slice"])
        assert o["after"][:2] == ("ok", want), (r, o["after"])
        assert o["mismatch"][0] == "MismatchError", (r, o["mismatch"])
    for case, origin_type in (("fails_in_reward", "ValueError"), ("fails_preparing", "UnsupportedTypeError")):
        kinds = {r: o[case][0] for r, o in enumerate(got)}
        assert "ok" not in kinds.values(), (case, [o[case] for o in got])
        assert origin_type in kinds.values(), (case, [o[case] for o in got])  # the rank it happened on
        for r, o in enumerate(got):
            kind, info, seconds = o[case]
            assert kind in (origin_type, "RemoteError"), (case, r, o[case])
            if kind == "RemoteError":
                assert info[1].rsplit(".", 1)[-1] == origin_type, (case, r, info)
            assert seconds < 15, (case, r, o[case])  # within seconds, not at timeout=30
    assert got[1]["fails_preparing"][0] == "UnsupportedTypeError"


ALL_MODES = ("main", "replicate", "shard", "own_slice", "last_rank")


def test_mode_contract_names_every_built_in_mode() -> None:
    """The contract is run over every built-in mode: a new one is added to ``ALL_MODES`` here."""
    assert set(MODES) <= set(ALL_MODES), set(MODES) - set(ALL_MODES)


@pytest.mark.parametrize("mode", ALL_MODES)
@pytest.mark.usefixtures("external_modes")
def test_mode_contract_on_thread_ranks(mode: str) -> None:
    _check(run_threads(_body, 3, mode, timeout=120), 3)


def _gloo_body(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    _register_external()  # a fresh process: the modes written here are registered again
    return {mode: _body(rank, world_size, mode) for mode in ALL_MODES}


def test_mode_contract_on_gloo_ranks() -> None:
    got = run_ranks(_gloo_body, 2, timeout=300)
    for mode in ALL_MODES:
        _check([g[mode] for g in got], 2)


def test_mode_contract_a_local_failure_returned_unsent_breaks_the_group_loudly() -> None:
    """A mode that returns its own failure from route_inputs without sending it is refused on every rank."""

    class Unsent(OwnSlice):
        name = "unsent"

        def route_inputs(self, call: Call, payload: Outcome[Payload]) -> Value[Scoring] | Error:
            got = super().route_inputs(call, payload)
            if call.rank == 1:
                return local(_raise, "rank 1's own planning failed")  # returned, never sent
            return got

    register(Unsent())
    try:
        f = synced_reward(mode="unsent", timeout=30)(_score)  # type: ignore[call-overload]
        got = run_threads(lambda rank, w: outcome(f, _batch(rank)), 2, timeout=60)
    finally:
        MODES.pop("unsent")
    assert got[1][0] == "ModeContractError", got
    assert got[0][0] == "CommunicationError", got
    assert "raised ModeContractError on rank 1" in got[0][1], got
    assert max(seconds for _, _, seconds in got) < 15, got  # at once, not at timeout=30
    assert "mode 'unsent' returned this rank's own failure from route_inputs without sending it" in got[1][1], got


def _raise(message: str) -> None:
    raise RuntimeError(message)


def test_mode_contract_a_prepare_failure_returned_unsent_breaks_the_group_loudly() -> None:
    """A mode that returns its payload's failure (``prepare`` raised on this rank) from route_inputs unsent is
    refused as any local failure returned unsent is: the peers raise at once, not at ``timeout=``.

    The failing rank raises its own exception (the precedence rule: this rank's own exception wins), with
    the contract breach attached as a note; the peers' error names the ``ModeContractError``.
    """

    class Unsent(OwnSlice):
        name = "unsent_payload"

        def route_inputs(self, call: Call, payload: Outcome[Payload]) -> Value[Scoring] | Error:
            if isinstance(payload, Error):
                return payload  # this rank's own failure, returned, never sent
            return super().route_inputs(call, payload)

    done = threading.Event()

    def body(rank: int, world_size: int) -> tuple[str, str, float]:
        t0 = time.monotonic()
        try:
            f([object()] * 2 if rank == 1 else _batch(rank))  # rank 1 cannot encode its column
            return "ok", "", time.monotonic() - t0
        except Exception as e:
            return type(e).__name__, "\n".join([str(e), *getattr(e, "__notes__", ())]), time.monotonic() - t0
        finally:
            if rank == 0:
                done.set()
            else:
                done.wait(30)  # rank 1 goes on (a training loop would): it has not left the job

    register(Unsent())
    try:
        f = synced_reward(mode="unsent_payload", timeout=20)(_score)  # type: ignore[call-overload]
        got = run_threads(body, 2, timeout=90)
    finally:
        MODES.pop("unsent_payload")
    assert got[1][0] == "UnsupportedTypeError", got  # its own exception, the very one
    assert "mode 'unsent_payload' returned this rank's own failure from route_inputs without sending it" in got[1][1]
    assert got[0][0] == "CommunicationError", got
    assert "ModeContractError" in got[0][1], got
    assert max(seconds for _, _, seconds in got) < 10, got  # at once, not at timeout=20


@pytest.mark.parametrize("option", ["timeout", "mode", "backend", "shared", "process_group", "mode_options", "", "a b"])
def test_register_refuses_a_mode_option_named_like_an_option_every_mode_takes_or_not_a_keyword(option: str) -> None:
    """A mode's own option must be a keyword of its own: one named ``timeout`` would make ``timeout=`` "only apply
    to" that mode, and every other mode's decoration with it fail."""

    class Clashing(LastRank):
        name = "clashing"
        options = (ModeOption(option, "float", 1800.0),)

    try:
        with pytest.raises(ValueError, match=f"mode 'clashing' declares an option named {option!r}"):
            register(Clashing())
        assert "clashing" not in MODES
        assert synced_reward(timeout=5.0)(_score).__name__ == "_score"  # every other mode still decorates
    finally:
        MODES.pop("clashing", None)
