"""The fault matrix on real local gloo ranks: every live rank raises a clear error within seconds.

Modes (main, replicate, shard) x backends (torch, accelerate) x world sizes 2-4. Process launches are
expensive, so one launch runs every recoverable failure of every mode in sequence, and checks after
each one that the next synced call works; the unrecoverable ones (a timeout, a dead peer) come last in
a launch, or have a small launch of their own.

Every case records each rank's time-to-error. The table is printed at the end of the module (see it
with ``pytest -s``) and written to ``$SYNCREWARD_RELIABILITY_JSON`` (default
``/tmp/syncreward-reliability.json``); docs/reliability.md quotes it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import syncreward
from syncreward import synced_reward
from syncreward.testing import RanksFailed, run_ranks

pytestmark = pytest.mark.multiprocess

MODES = ("main", "replicate", "shard")
TIGHT = 2.0  # timeout= of the "a rank never makes the call" case
REPORT = Path(os.environ.get("SYNCREWARD_RELIABILITY_JSON", "/tmp/syncreward-reliability.json"))

# --------------------------------------------------------------------------------------------- reward functions


def plain(completions: Any, **kwargs: Any) -> list[float]:
    """Depends on the batch it sees: len(c) + batch size."""
    return [float(len(c) + len(completions)) for c in completions]


def other(completions: Any, **kwargs: Any) -> list[float]:
    return [0.0] * len(completions)


def raising(completions: Any, fail_rank: int = -1, **kwargs: Any) -> list[float]:
    if int(os.environ["RANK"]) == fail_rank:
        raise ValueError(f"boom on rank {fail_rank}")
    return [1.0] * len(completions)


def two_columns(completions: Any, solution: Any, **kwargs: Any) -> list[float]:
    return [float(len(s)) for s in solution]


def tensor_column(completions: Any, feats: Any, **kwargs: Any) -> list[float]:
    return feats.sum(dim=1).tolist()


def wrong_length(completions: Any, **kwargs: Any) -> list[float]:
    return [1.0] * (len(completions) + 1)


def non_finite(completions: Any, values: Any, **kwargs: Any) -> dict[str, Any]:
    """Non-finite outputs, computed and echoed: they must arrive unchanged."""
    pattern = [math.nan, math.inf, -math.inf, -0.0]
    return {
        "computed": [pattern[i % 4] for i in range(len(completions))],
        "echo": list(values),
        "tensor": torch.tensor(list(values), dtype=torch.float32),
    }


def dying(completions: Any, die_rank: int = -1, **kwargs: Any) -> list[float]:
    if int(os.environ["RANK"]) == die_rank:
        os._exit(3)  # no cleanup, no exception: a segfault or an OOM kill looks the same to the peers
    return [1.0] * len(completions)


def uses_payload(completions: Any, payload: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def ignores_kwargs(completions: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


async def aslow(completions: Any, delay: float = 0.0, **kwargs: Any) -> list[float]:
    if delay:
        await asyncio.sleep(delay)
    return [float(len(c) + len(completions)) for c in completions]


def _touch(path: str) -> str:
    Path(path).write_text("unpickled")
    return path


class Exploit:
    """Unpickling this writes a marker file: the shape of every pickle-based remote code execution."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        Path(self.marker + ".reduced").write_text("reduced")  # even serializing it would leave a trace
        return (_touch, (self.marker,))


class Opaque:
    pass


def synced(fn: Callable[..., Any], mode: str, backend: str, **options: Any) -> Callable[..., Any]:
    if mode == "shard":
        options.setdefault("group_size", 1)
    return synced_reward(mode=mode, backend=backend, **options)(fn)  # type: ignore[call-overload, no-any-return]


# --------------------------------------------------------------------------------------------- outcomes


def outcome(call: Callable[[], Any]) -> dict[str, Any]:
    """Run ``call``; return what happened and how long it took."""
    t0 = time.perf_counter()
    try:
        value = call()
    except BaseException as e:  # asyncio.CancelledError is a BaseException
        info: dict[str, Any] = {"kind": type(e).__name__, "msg": str(e)[:3000], "s": time.perf_counter() - t0}
        if isinstance(e, syncreward.RemoteError):
            info.update(origin=e.origin_rank, exc_type=e.exc_type)
        if isinstance(e, syncreward.SyncTimeoutError):
            info["missing"] = list(e.missing_ranks)
        info["syncreward"] = isinstance(e, syncreward.SyncRewardError)
        return info
    return {"kind": "ok", "value": value, "s": time.perf_counter() - t0}


def comps_of(rank: int) -> list[str]:
    return [f"r{rank}s{i}" for i in range(rank + 1)]  # rank r holds r + 1 samples


def recoverable_cases(rank: int, world_size: int, backend: str, marker_dir: str) -> dict[str, Any]:
    """Every recoverable failure, per mode, each followed by a plain call that must work."""
    out: dict[str, Any] = {}
    for mode in MODES:
        out |= mode_cases(mode, rank, world_size, backend, marker_dir)
    return out


def mode_cases(mode: str, rank: int, world_size: int, backend: str, marker_dir: str) -> dict[str, Any]:
    last = world_size - 1
    comps = comps_of(rank)
    out: dict[str, Any] = {}

    def case(name: str, call: Callable[[], Any], late: float = 0.0) -> None:
        time.sleep(late)  # arrive late on purpose, outside the measured time
        out[f"{mode}/{name}"] = outcome(call)
        after = synced(plain, mode, backend)
        out[f"{mode}/{name}/after"] = outcome(lambda: after(comps))

    f_plain = synced(plain, mode, backend)
    f_other = synced(other, mode, backend)
    f_raise = synced(raising, mode, backend)
    f_payload = synced(uses_payload, mode, backend)
    f_async = synced(aslow, mode, backend)
    f_plain_other_mode = synced(plain, "replicate" if mode != "replicate" else "main", backend)

    out[f"{mode}/warmup"] = outcome(lambda: f_plain(comps))
    case("raises_on_rank0", lambda: f_raise(comps, fail_rank=0))
    if mode != "main":  # in main only rank 0 runs the function
        case("raises_on_last_rank", lambda: f_raise(comps, fail_rank=last))
        case("raises_on_every_rank", lambda: f_raise(comps, fail_rank=rank))
    bad = comps[:-1] if rank == last else comps
    case("lengths_disagree", lambda: synced(two_columns, mode, backend)(comps, bad))
    opaque: list[Any] = [Opaque() for _ in comps] if rank == 1 else ["x" for _ in comps]
    case("unsupported_object", lambda: f_payload(comps, opaque))
    marker = os.path.join(marker_dir, f"{mode}-rank{rank}")
    exploit: list[Any] = [Exploit(marker) for _ in comps] if rank == 1 else ["x" for _ in comps]
    case("custom_reduce_named", lambda: f_payload(comps, exploit))
    case("custom_reduce_in_kwargs", lambda: synced(ignores_kwargs, mode, backend)(comps, extra=exploit))
    case("wrong_output_length", lambda: synced(wrong_length, mode, backend)(comps))
    case("different_functions", lambda: (f_plain if rank == 0 else f_other)(comps))
    extra = {"solution": comps} if rank == 1 else {}
    case("different_columns", lambda: f_plain(comps, **extra))
    container = tuple(comps) if rank == 1 else comps
    case("different_containers", lambda: f_plain(container))
    case("different_modes", lambda: (f_plain if rank == 0 else f_plain_other_mode)(comps))

    def different_order() -> Any:
        first, second = (f_plain, f_other) if rank == 0 else (f_other, f_plain)
        return [outcome(lambda: first(comps)), outcome(lambda: second(comps))]

    case("different_order", different_order)
    feats = torch.ones(len(comps), 2, dtype=torch.float64 if rank == 1 else torch.float32)
    case("tensor_dtypes_disagree", lambda: synced(tensor_column, mode, backend)(comps, feats))
    values = [[math.nan, math.inf, -math.inf, 1.5][(rank + i) % 4] for i in range(len(comps))]
    case("non_finite", lambda: synced(non_finite, mode, backend)(comps, values))

    # async: a rank's call cancelled while it waits for the others (who arrive late) ...
    def cancel_waiting() -> Any:
        if rank == last:
            return asyncio.run(asyncio.wait_for(f_async(comps), 0.1))
        return asyncio.run(f_async(comps))

    case("async_cancelled_while_waiting_on_last_rank", cancel_waiting, late=0.0 if rank == last else 0.6)

    # ... and rank 0's call cancelled while its reward runs (rank 0 scores in every mode here)
    def cancel_scoring() -> Any:
        if rank == 0:
            return asyncio.run(asyncio.wait_for(f_async(comps, delay=2.0), 0.3))
        return asyncio.run(f_async(comps))

    case("async_cancelled_in_reward_on_rank0", cancel_scoring)
    out[f"{mode}/async_after"] = outcome(lambda: asyncio.run(f_async(comps)))
    return out


def matrix_body(rank: int, world_size: int, backend: str, marker_dir: str) -> dict[str, Any]:
    early: dict[str, Any] = {}
    if backend == "accelerate":
        from accelerate import PartialState

        # On a CPU-only machine a plain PartialState() sees one process: syncing over it would score every
        # rank alone, so the accelerate backend refuses (it used to hand back a local backend silently).
        assert PartialState().num_processes == 1
        early["accelerate_state_of_one_process"] = outcome(lambda: synced(plain, "main", backend)(comps_of(rank)))
        PartialState._reset_state()
        state = PartialState(cpu=True)
        assert state.num_processes == world_size
        assert type(syncreward.resolve_backend("accelerate")).__name__ == "AccelerateBackend"
    out = early | recoverable_cases(rank, world_size, backend, marker_dir)
    # Unrecoverable: the last rank never makes this call. The others time out naming it; the group is then
    # unusable on every rank, and the late rank, when it finally calls, learns so at once.
    last = world_size - 1
    tight = synced(plain, "main", backend, timeout=TIGHT)
    comps = comps_of(rank)
    if rank != last:
        out["skipped_call/timeout"] = outcome(lambda: tight(comps))
        out["skipped_call/after"] = outcome(lambda: tight(comps))
    else:
        time.sleep(TIGHT + 1.5)  # past the others' timeout and their 0.25 s grace period
        out["skipped_call/late_rank"] = outcome(lambda: tight(comps))
    import torch.distributed as dist

    dist.barrier()  # keep every process alive until the late rank is done
    return out


# --------------------------------------------------------------------------------------------- the table

ROWS: list[dict[str, Any]] = []


@pytest.fixture(scope="module", autouse=True)
def _report() -> Iterator[None]:
    yield
    if not ROWS:
        return
    REPORT.write_text(json.dumps(ROWS, indent=1, default=str))
    errors = [r for r in ROWS if r["kind"] != "ok"]
    print(f"\n\ntime-to-error per case (slowest rank), {len(errors)} rank-outcomes; full table in {REPORT}")
    worst: dict[tuple[str, int, str], dict[str, Any]] = {}
    for r in errors:
        key = (r["backend"], r["world_size"], r["case"])
        if key not in worst or r["s"] > worst[key]["s"]:
            worst[key] = r
    print(f"{'backend':<11} {'W':>2} {'case':<58} {'slowest':>8}  what the ranks raised")
    for (backend, w, name), r in sorted(worst.items(), key=lambda kv: -kv[1]["s"]):
        kinds = sorted({x["kind"] for x in errors if (x["backend"], x["world_size"], x["case"]) == (backend, w, name)})
        print(f"{backend:<11} {w:>2} {name:<58} {r['s']:>7.3f}s  {', '.join(kinds)}")


def record(backend: str, world_size: int, results: list[dict[str, Any]]) -> None:
    def add(rank: int, name: str, o: dict[str, Any]) -> None:
        detail = o.get("exc_type") or o.get("msg", "")[:160]
        ROWS.append(
            {"backend": backend, "world_size": world_size, "case": name, "rank": rank, "kind": o["kind"],
             "s": round(o["s"], 4), "detail": detail}
        )  # fmt: skip

    for rank, res in enumerate(results):
        for name, o in res.items():
            if isinstance(o, dict) and "kind" in o:
                add(rank, name, o)
                if isinstance(o.get("value"), list) and all(isinstance(x, dict) and "kind" in x for x in o["value"]):
                    for i, inner in enumerate(o["value"]):  # different_order: the two calls inside
                        add(rank, f"{name}#{i + 1}", inner)


# --------------------------------------------------------------------------------------------- assertions


def expected_plain(mode: str, world_size: int, rank: int) -> list[float]:
    """``plain`` adds the size of the batch it sees: the global batch, or in shard the scoring rank's share."""
    total = sum(range(1, world_size + 1))
    start = sum(range(1, rank + 1))
    if mode != "shard":
        return [float(len(c) + total) for c in comps_of(rank)]
    dest = [i * world_size // total for i in range(total)]  # group_size=1: contiguous blocks of ~total/W samples
    return [float(len(c) + dest.count(dest[start + i])) for i, c in enumerate(comps_of(rank))]


def check_matrix(results: list[dict[str, Any]], world_size: int, marker_dir: str) -> None:
    last = world_size - 1
    ranks = range(world_size)

    def at(name: str) -> list[dict[str, Any]]:
        return [results[r][name] for r in ranks]

    def remote(o: dict[str, Any], origin: int, exc_type: str) -> bool:
        return o["kind"] == "RemoteError" and o["origin"] == origin and o["exc_type"] == exc_type

    for mode in MODES:
        for name in results[0]:
            if name.startswith(f"{mode}/") and name.endswith("/after"):
                for r in ranks:
                    got = results[r][name]
                    assert got["kind"] == "ok", (name, r, got)
                    assert got["value"] == expected_plain(mode, world_size, r), (name, r, got)
        # raises on rank 0 (the scoring rank in main): the original there, RemoteError naming it elsewhere
        got = at(f"{mode}/raises_on_rank0")
        assert got[0]["kind"] == "ValueError", got[0]
        assert all(remote(got[r], 0, "ValueError") for r in ranks if r != 0), got
        if mode != "main":
            got = at(f"{mode}/raises_on_last_rank")
            assert got[last]["kind"] == "ValueError"
            assert all(remote(got[r], last, "ValueError") for r in ranks if r != last), got
            got = at(f"{mode}/raises_on_every_rank")  # each rank raises its own (shard: every rank scores)
            assert [o["kind"] for o in got] == ["ValueError"] * world_size, got
            assert [o["msg"] for o in got] == [f"boom on rank {r}" for r in ranks], got
        got = at(f"{mode}/lengths_disagree")
        assert got[last]["kind"] == "InputError"
        assert "different lengths" in got[last]["msg"]
        assert all(remote(got[r], last, "syncreward.InputError") for r in ranks if r != last), got
        for name in ("unsupported_object", "custom_reduce_named"):
            got = at(f"{mode}/{name}")
            assert got[1]["kind"] == "UnsupportedTypeError", got[1]
            assert "allow_pickle=True" in got[1]["msg"]
            assert "trusted clusters only" in got[1]["msg"]
            assert all(remote(got[r], 1, "syncreward.UnsupportedTypeError") for r in ranks if r != 1), got
        got = at(f"{mode}/custom_reduce_in_kwargs")  # left behind (NotSynced), never serialized
        assert all(o["kind"] == "ok" for o in got), got
        got = at(f"{mode}/wrong_output_length")
        if mode == "main":
            assert got[0]["kind"] == "ResultLengthError"
            assert all(remote(got[r], 0, "syncreward.ResultLengthError") for r in ranks if r != 0), got
        else:  # every rank scores (shard: group_size=1 spreads the samples over every rank)
            assert all(o["kind"] == "ResultLengthError" for o in got), got
        for name in ("different_functions", "different_columns", "different_containers", "different_modes"):
            got = at(f"{mode}/{name}")
            assert all(o["kind"] == "MismatchError" for o in got), (name, got)
            assert all(f"rank {r}:" in o["msg"] for o in got for r in ranks), got
        assert "solution:list" in results[0][f"{mode}/different_columns"]["msg"]
        assert "completions:tuple" in results[0][f"{mode}/different_containers"]["msg"]
        for r in ranks:
            pair = results[r][f"{mode}/different_order"]["value"]
            assert [o["kind"] for o in pair] == ["MismatchError", "MismatchError"], pair
        got = at(f"{mode}/tensor_dtypes_disagree")
        for o in got:
            assert o["kind"] == "InputError" or remote(o, o.get("origin", -1), "syncreward.InputError"), got
        assert any(o["kind"] == "InputError" and "different dtypes" in o["msg"] for o in got), got
        # non-finite outputs and inputs pass through unchanged
        for r in ranks:
            o = results[r][f"{mode}/non_finite"]
            assert o["kind"] == "ok", o
            n, start = r + 1, sum(range(1, r + 1))
            values = [[math.nan, math.inf, -math.inf, 1.5][(r + i) % 4] for i in range(n)]
            pattern = [math.nan, math.inf, -math.inf, -0.0]
            computed = [pattern[i % 4] for i in range(start, start + n)] if mode != "shard" else None
            v = o["value"]
            for got_x, want in zip(v["echo"], values, strict=True):
                assert (math.isnan(got_x) and math.isnan(want)) or got_x == want
            assert torch.equal(v["tensor"].isnan(), torch.tensor(values, dtype=torch.float32).isnan())
            if computed is not None:
                for got_x, want in zip(v["computed"], computed, strict=True):
                    assert (math.isnan(got_x) and math.isnan(want)) or (
                        got_x == want and math.copysign(1, got_x) == math.copysign(1, want)
                    )
        # async cancelled while waiting (last rank): it raises there; in main the others still get their
        # results (a non-scoring rank only receives), in replicate/shard its cancellation travels
        got = at(f"{mode}/async_cancelled_while_waiting_on_last_rank")
        assert got[last]["kind"] == "TimeoutError", got[last]
        for r in ranks:
            if r == last:
                continue
            if mode == "main":
                assert got[r]["kind"] == "ok", got[r]
                assert got[r]["value"] == expected_plain(mode, world_size, r)
            else:
                assert remote(got[r], last, "asyncio.exceptions.CancelledError"), got[r]
        got = at(f"{mode}/async_cancelled_in_reward_on_rank0")
        assert got[0]["kind"] == "TimeoutError", got[0]
        assert all(remote(got[r], 0, "asyncio.exceptions.CancelledError") for r in ranks if r != 0), got
        for r in ranks:
            o = results[r][f"{mode}/async_after"]
            assert o["kind"] == "ok", o
            assert o["value"] == expected_plain(mode, world_size, r)
    if "accelerate_state_of_one_process" in results[0]:
        for r in ranks:
            o = results[r]["accelerate_state_of_one_process"]
            assert o["kind"] == "BackendError", o
            assert "cpu=True" in o["msg"]
    # nothing was unpickled, nor even pickled, on any rank
    assert sorted(os.listdir(marker_dir)) == []
    # every failure above is a syncreward error (or the caller's own) and came within seconds
    for r in ranks:
        for name, o in results[r].items():
            if isinstance(o, dict) and o.get("kind") not in (None, "ok") and not name.startswith("skipped_call"):
                assert o["s"] < 5.0, (name, r, o)
    # the unrecoverable one: the last rank skipped a call
    for r in ranks:
        if r == last:
            o = results[r]["skipped_call/late_rank"]
            assert o["kind"] == "CommunicationError", o
            assert "the other ranks had given up waiting for this rank" in o["msg"]
            assert f"for rank(s) [{last}]" in o["msg"]
            assert "'plain'" in o["msg"]
            assert o["s"] < 2.0, o
        else:
            o = results[r]["skipped_call/timeout"]
            assert o["kind"] == "SyncTimeoutError", o
            assert o["missing"] == [last], o
            assert f"rank(s) [{last}] did not arrive within timeout=" in o["msg"]
            assert "of 'plain' timed out" in o["msg"]
            assert TIGHT - 0.1 < o["s"] < TIGHT + 1.5, o  # the timeout, plus a 0.25 s grace to name the missing
            after = results[r]["skipped_call/after"]
            assert after["kind"] == "GroupBrokenError", after
            assert after["s"] < 0.5
            assert "unusable" in after["msg"]


@pytest.mark.parametrize(
    ("backend", "world_size"),
    [("torch", 2), ("accelerate", 3), ("torch", 4)],
    ids=["torch-W2", "accelerate-W3", "torch-W4"],
)
def test_fault_matrix(backend: str, world_size: int, tmp_path: Path) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    results = run_ranks(matrix_body, world_size, backend, str(markers), timeout=240)
    record(backend, world_size, results)
    check_matrix(results, world_size, str(markers))


# --------------------------------------------------------------------------------------------- dead peers


def death_body(rank: int, world_size: int, backend: str, mode: str, die_rank: int, where: str, path: str) -> None:
    """One rank's process dies; the survivors write what they saw to ``path.<rank>`` (run_ranks reports the death)."""
    if backend == "accelerate":
        from accelerate import PartialState

        PartialState(cpu=True)
    f = synced(dying, mode, backend, timeout=60.0)
    comps = comps_of(rank)
    out: dict[str, Any] = {}
    if where != "before_first_call":
        out["warmup"] = outcome(lambda: f(comps))
    else:
        f = synced(dying, mode, backend, timeout=TIGHT)
    if where != "inside" and rank == die_rank:
        os._exit(3)
    out["call"] = outcome(lambda: f(comps, die_rank=die_rank if where == "inside" else -1))
    out["after"] = outcome(lambda: f(comps))
    Path(f"{path}.{rank}").write_text(json.dumps(out, default=str))


DEATHS = [
    # (backend, world size, mode, dying rank, where)
    ("torch", 2, "main", 0, "inside"),  # the scoring rank, which also hosts the rendezvous store
    ("accelerate", 3, "replicate", 1, "inside"),
    ("torch", 4, "shard", 2, "before_call"),
    ("torch", 2, "main", 1, "before_first_call"),  # before syncreward's gloo groups exist
]


@pytest.mark.parametrize(
    ("backend", "world_size", "mode", "die_rank", "where"),
    DEATHS,
    ids=[f"{d[0]}-W{d[1]}-{d[2]}-rank{d[3]}-{d[4]}" for d in DEATHS],
)
def test_a_dead_peer_is_reported_promptly(
    backend: str, world_size: int, mode: str, die_rank: int, where: str, tmp_path: Path
) -> None:
    path = str(tmp_path / "out")
    with pytest.raises(RanksFailed) as info:
        run_ranks(death_body, world_size, backend, mode, die_rank, where, path, timeout=120)
    assert set(info.value.failures) == {die_rank}, info.value
    assert "exited with code 3" in info.value.failures[die_rank]
    results: list[dict[str, Any]] = []
    for r in range(world_size):
        if r == die_rank:
            results.append({})
            continue
        res = json.loads(Path(f"{path}.{r}").read_text())
        results.append(res)
        call, after = res["call"], res["after"]
        if where == "before_first_call":
            # no connection to the dead rank exists yet: creating syncreward's gloo group times out after
            # timeout=, then the group is unusable
            assert call["kind"] == "SyncTimeoutError", call
            assert call["s"] < TIGHT + 5, call
        else:
            assert call["kind"] == "CommunicationError", call
            assert "unusable" in call["msg"]
            assert call["s"] < 5.0, call  # seconds, not the 60 s timeout
        assert after["kind"] == "GroupBrokenError", after
        assert after["s"] < 0.5
    record(
        backend,
        world_size,
        [{f"death/{mode}/rank{die_rank}/{where}/{k}": v for k, v in res.items()} for res in results],
    )
