"""The fault matrix on real local gloo ranks: every live rank raises a clear error within seconds.

Modes (main, replicate, shard) x backends (torch, accelerate) x world sizes 2-4. Process launches are
expensive, so one launch runs every recoverable failure of every mode in sequence, and checks after
each one that the next synced call works; the unrecoverable ones (a timeout, a dead peer) come last in
a launch, or have a small launch of their own. Each case of a launch is then its own test item (named by
the behaviour, with ``<launch>-<mode>-<case>`` ids, so ``-k lengths_disagree`` finds it), checked against
that one launch's outcomes: a failing case shows its own message and the others still report; a launch
that fails fails every one of its items, with the ranks' tracebacks.

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
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
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
    _ = kwargs  # it may read its **kwargs, so every column reaching them travels and is checked
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


def synced(fn: Callable[..., Any], mode: str, backend: Any, **options: Any) -> Callable[..., Any]:
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

    def case(name: str, call: Callable[[], Any], late: float = 0.0, after: Callable[[], Any] | None = None) -> None:
        time.sleep(late)  # arrive late on purpose, outside the measured time
        out[f"{mode}/{name}"] = outcome(call)
        out[f"{mode}/{name}/after"] = outcome(after or (lambda: synced(plain, mode, backend)(comps)))

    f_plain = synced(plain, mode, backend)
    f_other = synced(other, mode, backend)
    f_raise = synced(raising, mode, backend, exclude=["fail_rank"])  # differs between ranks on purpose
    f_payload = synced(uses_payload, mode, backend)
    f_async = synced(aslow, mode, backend, exclude=["delay"])  # rank 0 alone delays, on purpose
    other_mode = "replicate" if mode != "replicate" else "main"
    f_plain_other_mode = synced(plain, other_mode, backend)

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
    if "main" in (mode, other_mode):
        # main's gather meets the other mode's all_to_all, which gloo never matches: every rank raises a
        # MismatchError at once, and that group is lost -- so the case runs on a group of its own (later
        # calls on it raise GroupBrokenError), and the launch's other cases go on over the usual one
        import torch.distributed as dist

        lost = syncreward.resolve_backend("torch", process_group=dist.new_group(backend="gloo"))
        mine = synced(plain, mode if rank == 0 else other_mode, lost)
        case("different_modes", lambda: mine(comps), after=lambda: synced(plain, mode, lost)(comps))
    else:
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

# One launch per (backend, world size) runs every case (see matrix_body); each case is then its own test item
# below, so a failing case shows its own message and the others still run.

LAUNCHES = {"torch-W2": ("torch", 2), "accelerate-W3": ("accelerate", 3), "torch-W4": ("torch", 4)}
SCORING_ELSEWHERE = ("replicate", "shard")  # modes where every rank runs the function (main: only rank 0)
MISMATCHES = ("different_functions", "different_columns", "different_containers", "different_modes")
# main's gather beside another mode's all_to_all: that group is lost (the case runs on a group of its own)
LOSE_THE_GROUP = (("main", "different_modes/after"), ("replicate", "different_modes/after"))


def case_names(mode: str) -> list[str]:
    """The cases ``mode_cases`` runs in ``mode``, in order; each is followed by a plain call (``<case>/after``)."""
    raising = ["raises_on_rank0"] + (["raises_on_last_rank", "raises_on_every_rank"] if mode != "main" else [])
    return [
        *raising, "lengths_disagree", "unsupported_object", "custom_reduce_named", "custom_reduce_in_kwargs",
        "wrong_output_length", *MISMATCHES, "different_order", "tensor_dtypes_disagree", "non_finite",
        "async_cancelled_while_waiting_on_last_rank", "async_cancelled_in_reward_on_rank0",
    ]  # fmt: skip


@dataclass
class Matrix:
    """One launch's per-rank outcomes, or why the launch failed (then every case of that launch fails with it)."""

    launch: str
    world_size: int
    marker_dir: Path
    results: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None

    @property
    def last(self) -> int:
        return self.world_size - 1

    @property
    def ranks(self) -> range:
        return range(self.world_size)

    def at(self, key: str, ranks: Iterable[int] | None = None) -> dict[int, dict[str, Any]]:
        """Each rank's outcome of ``key`` (every rank unless ``ranks``), by rank."""
        if self.failure is not None:
            pytest.fail(self.failure, pytrace=False)
        ranks = self.ranks if ranks is None else list(ranks)
        missing = [r for r in ranks if key not in self.results[r]]
        assert not missing, f"{self.launch}: no outcome {key!r} on rank(s) {missing}"
        return {r: self.results[r][key] for r in ranks}


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Matrix]:
    """``matrix(launch)``: that launch's outcomes; its ranks start once, for the first item that needs them."""
    launched: dict[str, Matrix] = {}

    def get(launch: str) -> Matrix:
        if launch in launched:
            return launched[launch]
        backend, world_size = LAUNCHES[launch]
        m = launched[launch] = Matrix(launch, world_size, tmp_path_factory.mktemp(f"markers-{launch}"))
        try:
            m.results = run_ranks(matrix_body, world_size, backend, str(m.marker_dir), timeout=240)
        except BaseException as e:  # a rank raised, died or hung (RanksFailed holds every rank's traceback or stack)
            text = str(e) if isinstance(e, RanksFailed) else "".join(traceback.format_exception(e))
            m.failure = f"the {launch} launch failed, so none of its cases ran:\n{text}"
            if not isinstance(e, Exception):
                raise
        else:
            record(backend, world_size, m.results)
        return m

    return get


def cases(*names: str, modes: Iterable[str] = MODES) -> list[Any]:
    """``(launch, mode, case)`` for every launch, mode and case name; the id is ``<launch>-<mode>-<case>``."""
    return [
        pytest.param(launch, mode, name, id=f"{launch}-{mode}-{name}")
        for launch in LAUNCHES
        for mode in modes
        for name in names
    ]


def launches(*only: str) -> list[Any]:
    return [pytest.param(launch, id=launch) for launch in only or LAUNCHES]


def expected_plain(mode: str, world_size: int, rank: int) -> list[float]:
    """``plain`` adds the size of the batch it sees: the global batch, or in shard the scoring rank's share."""
    total = sum(range(1, world_size + 1))
    start = sum(range(1, rank + 1))
    if mode != "shard":
        return [float(len(c) + total) for c in comps_of(rank)]
    dest = [i * world_size // total for i in range(total)]  # group_size=1: contiguous blocks of ~total/W samples
    return [float(len(c) + dest.count(dest[start + i])) for i, c in enumerate(comps_of(rank))]


def assert_remote(got: dict[int, dict[str, Any]], origin: int, exc_type: str) -> None:
    """Every rank but ``origin`` raised a RemoteError naming ``origin`` and ``exc_type``."""
    for r, o in got.items():
        if r != origin:
            assert is_remote(o, origin, exc_type), f"rank {r}: want RemoteError({origin}, {exc_type}), got {o}"


def is_remote(o: dict[str, Any], origin: int, exc_type: str) -> bool:
    return o["kind"] == "RemoteError" and o["origin"] == origin and o["exc_type"] == exc_type


def assert_prompt(got: dict[int, dict[str, Any]]) -> None:
    """Every rank that raised did so within seconds."""
    slow = {r: o for r, o in got.items() if o["kind"] != "ok" and o["s"] >= 5.0}
    assert not slow, f"raised only after 5 s or more: {slow}"


# --------------------------------------------------------------------------------------------- one item per case


@pytest.mark.parametrize(
    ("launch", "mode", "case"), cases("raises_on_rank0") + cases("raises_on_last_rank", modes=SCORING_ELSEWHERE)
)
def test_a_reward_raising_on_one_rank_raises_there_and_a_remote_error_naming_it_elsewhere(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    m = matrix(launch)
    origin = 0 if case == "raises_on_rank0" else m.last  # rank 0 is main's scoring rank
    got = m.at(f"{mode}/{case}")
    assert got[origin]["kind"] == "ValueError", f"rank {origin}: {got[origin]}"
    assert got[origin]["msg"] == f"boom on rank {origin}", f"rank {origin}: {got[origin]}"
    assert_remote(got, origin, "ValueError")
    assert all(f"boom on rank {origin}" in o["msg"] for o in got.values()), got  # the remote errors carry its message
    assert_prompt(got)


@pytest.mark.parametrize(("launch", "mode", "case"), cases("raises_on_every_rank", modes=SCORING_ELSEWHERE))
def test_a_reward_raising_on_every_rank_raises_each_ranks_own_error(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    m = matrix(launch)
    got = m.at(f"{mode}/{case}")  # shard: every rank scores
    assert [o["kind"] for o in got.values()] == ["ValueError"] * m.world_size, got
    assert [o["msg"] for o in got.values()] == [f"boom on rank {r}" for r in m.ranks], got
    assert_prompt(got)


@pytest.mark.parametrize(("launch", "mode", "case"), cases("lengths_disagree"))
def test_columns_of_different_lengths_raise_input_error_on_that_rank(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    m = matrix(launch)
    got = m.at(f"{mode}/{case}")
    assert got[m.last]["kind"] == "InputError", f"rank {m.last}: {got[m.last]}"
    assert "different lengths" in got[m.last]["msg"], f"rank {m.last}: {got[m.last]}"
    assert_remote(got, m.last, "syncreward.InputError")
    assert all(got[m.last]["msg"] in o["msg"] for o in got.values()), got  # the remote errors carry its message
    assert_prompt(got)


@pytest.mark.parametrize(("launch", "mode", "case"), cases("unsupported_object", "custom_reduce_named"))
def test_an_object_the_codec_cannot_encode_raises_unsupported_type_error_on_its_rank(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    m = matrix(launch)
    got = m.at(f"{mode}/{case}")  # rank 1 holds the objects
    assert got[1]["kind"] == "UnsupportedTypeError", f"rank 1: {got[1]}"
    assert "allow_pickle=True" in got[1]["msg"], f"rank 1: {got[1]}"
    assert "trusted clusters only" in got[1]["msg"], f"rank 1: {got[1]}"
    assert_remote(got, 1, "syncreward.UnsupportedTypeError")
    assert_prompt(got)


@pytest.mark.parametrize(("launch", "mode", "case"), cases("custom_reduce_in_kwargs"))
def test_a_custom_reduce_in_a_kwargs_column_is_left_behind_and_the_call_works(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    got = matrix(launch).at(f"{mode}/{case}")  # left behind (NotSynced), never serialized
    assert all(o["kind"] == "ok" for o in got.values()), got


@pytest.mark.parametrize("launch", launches())
def test_nothing_was_pickled_or_unpickled_on_any_rank(matrix: Callable[[str], Matrix], launch: str) -> None:
    m = matrix(launch)
    if m.failure is not None:
        pytest.fail(m.failure, pytrace=False)
    assert sorted(os.listdir(m.marker_dir)) == []  # Exploit leaves a marker when pickled or unpickled


@pytest.mark.parametrize(("launch", "mode", "case"), cases("wrong_output_length"))
def test_a_reward_returning_the_wrong_length_raises_result_length_error(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    got = matrix(launch).at(f"{mode}/{case}")
    if mode == "main":
        assert got[0]["kind"] == "ResultLengthError", f"rank 0: {got[0]}"
        assert_remote(got, 0, "syncreward.ResultLengthError")
        assert all(got[0]["msg"] in o["msg"] for o in got.values()), got  # the remote errors carry its message
    else:  # every rank scores (shard: group_size=1 spreads the samples over every rank)
        assert all(o["kind"] == "ResultLengthError" for o in got.values()), got
    assert_prompt(got)


@pytest.mark.parametrize(("launch", "mode", "case"), cases(*MISMATCHES))
def test_ranks_making_different_calls_raise_mismatch_error_naming_every_rank(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    m = matrix(launch)
    got = m.at(f"{mode}/{case}")
    # main's gather beside another mode's all_to_all: the MismatchError subclass that also breaks the group
    kind = "CollectiveMismatchError" if (mode, f"{case}/after") in LOSE_THE_GROUP else "MismatchError"
    assert all(o["kind"] == kind for o in got.values()), got
    assert all(f"rank {r}:" in o["msg"] for o in got.values() for r in m.ranks), got
    if case == "different_functions":
        assert all("plain(" in o["msg"] and "other(" in o["msg"] for o in got.values()), got  # both named
    if case == "different_columns":
        assert all("solution:list" in o["msg"] for o in got.values()), got
    if case == "different_containers":
        assert all("completions:tuple" in o["msg"] for o in got.values()), got
    assert_prompt(got)


@pytest.mark.parametrize(("launch", "mode", "case"), cases("different_order"))
def test_ranks_making_calls_in_a_different_order_raise_mismatch_error_on_both(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    got = matrix(launch).at(f"{mode}/{case}")
    for r, o in got.items():
        assert o["kind"] == "ok", f"rank {r}: {o}"  # the two calls' outcomes, in its value
        assert [x["kind"] for x in o["value"]] == ["MismatchError", "MismatchError"], f"rank {r}: {o['value']}"


@pytest.mark.parametrize(("launch", "mode", "case"), cases("tensor_dtypes_disagree"))
def test_tensors_of_different_dtypes_raise_input_error(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    got = matrix(launch).at(f"{mode}/{case}")
    for r, o in got.items():
        assert o["kind"] == "InputError" or is_remote(o, o.get("origin", -1), "syncreward.InputError"), f"rank {r}: {o}"
    assert any(o["kind"] == "InputError" and "different dtypes" in o["msg"] for o in got.values()), got
    assert_prompt(got)


@pytest.mark.parametrize(("launch", "mode", "case"), cases("non_finite"))
def test_non_finite_inputs_and_outputs_pass_through_unchanged(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    pattern = [math.nan, math.inf, -math.inf, -0.0]
    for r, o in matrix(launch).at(f"{mode}/{case}").items():
        assert o["kind"] == "ok", f"rank {r}: {o}"
        n, start = r + 1, sum(range(1, r + 1))
        values = [[math.nan, math.inf, -math.inf, 1.5][(r + i) % 4] for i in range(n)]
        computed = [pattern[i % 4] for i in range(start, start + n)] if mode != "shard" else None
        v = o["value"]
        for got_x, want in zip(v["echo"], values, strict=True):
            assert (math.isnan(got_x) and math.isnan(want)) or got_x == want, f"rank {r}: echo {v['echo']} != {values}"
        assert torch.equal(v["tensor"].isnan(), torch.tensor(values, dtype=torch.float32).isnan()), f"rank {r}: {v}"
        if computed is not None:
            for got_x, want in zip(v["computed"], computed, strict=True):
                assert (math.isnan(got_x) and math.isnan(want)) or (
                    got_x == want and math.copysign(1, got_x) == math.copysign(1, want)
                ), f"rank {r}: computed {v['computed']} != {computed}"


@pytest.mark.parametrize(("launch", "mode", "case"), cases("async_cancelled_while_waiting_on_last_rank"))
def test_an_async_call_cancelled_while_waiting_raises_there_and_travels_where_others_score(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    m = matrix(launch)
    got = m.at(f"{mode}/{case}")
    assert got[m.last]["kind"] == "TimeoutError", f"rank {m.last}: {got[m.last]}"
    for r, o in got.items():
        if r == m.last:
            continue
        if mode == "main":  # a non-scoring rank only receives: the others still get their results
            assert o["kind"] == "ok", f"rank {r}: {o}"
            assert o["value"] == expected_plain(mode, m.world_size, r), f"rank {r}: {o}"
        else:  # replicate/shard: its cancellation travels
            assert is_remote(o, m.last, "asyncio.exceptions.CancelledError"), f"rank {r}: {o}"
    assert_prompt(got)


@pytest.mark.parametrize(("launch", "mode", "case"), cases("async_cancelled_in_reward_on_rank0"))
def test_an_async_call_cancelled_in_its_reward_raises_there_and_a_remote_cancelled_error_elsewhere(
    matrix: Callable[[str], Matrix], launch: str, mode: str, case: str
) -> None:
    got = matrix(launch).at(f"{mode}/{case}")
    assert got[0]["kind"] == "TimeoutError", f"rank 0: {got[0]}"
    assert_remote(got, 0, "asyncio.exceptions.CancelledError")
    assert_prompt(got)


def call_id(call: str) -> str:
    """``raises_on_rank0/after`` -> ``after_raises_on_rank0``: ``-k raises_on_rank0`` finds a case and its after."""
    return f"after_{call.removesuffix('/after')}" if call.endswith("/after") else call


@pytest.mark.parametrize(
    ("launch", "mode", "call"),
    [
        pytest.param(launch, mode, call, id=f"{launch}-{mode}-{call_id(call)}")
        for launch in LAUNCHES
        for mode in MODES
        for call in ["warmup", *[f"{c}/after" for c in case_names(mode)], "async_after"]
        if (mode, call) not in LOSE_THE_GROUP
    ],
)
def test_a_plain_call_works_before_and_after_every_recoverable_failure(
    matrix: Callable[[str], Matrix], launch: str, mode: str, call: str
) -> None:
    m = matrix(launch)
    for r, o in m.at(f"{mode}/{call}").items():
        assert o["kind"] == "ok", f"rank {r}: {o}"
        assert o["value"] == expected_plain(mode, m.world_size, r), f"rank {r}: {o}"


@pytest.mark.parametrize(("launch", "mode", "call"), [(lch, m, c) for lch in LAUNCHES for m, c in LOSE_THE_GROUP])
def test_main_meeting_another_mode_loses_that_group_and_later_calls_on_it_say_why(
    matrix: Callable[[str], Matrix], launch: str, mode: str, call: str
) -> None:
    """A gather and an all_to_all at the same point stay pending inside gloo: the group cannot be used again."""
    for r, o in matrix(launch).at(f"{mode}/{call}").items():
        assert o["kind"] == "GroupBrokenError", f"rank {r}: {o}"
        assert "ranks made different synced calls at the same point" in o["msg"], f"rank {r}: {o}"
        assert o["s"] < 2.0, f"rank {r}: {o}"


@pytest.mark.parametrize("launch", launches("accelerate-W3"))
def test_accelerate_state_of_one_process_raises_backend_error_naming_cpu_true(
    matrix: Callable[[str], Matrix], launch: str
) -> None:
    got = matrix(launch).at("accelerate_state_of_one_process")
    for r, o in got.items():
        assert o["kind"] == "BackendError", f"rank {r}: {o}"
        assert "cpu=True" in o["msg"], f"rank {r}: {o}"
    assert_prompt(got)


# the unrecoverable one, last in each launch: the last rank skips a call


@pytest.mark.parametrize("launch", launches())
def test_the_ranks_waiting_on_a_skipped_call_time_out_naming_the_missing_rank(
    matrix: Callable[[str], Matrix], launch: str
) -> None:
    m = matrix(launch)
    for r, o in m.at("skipped_call/timeout", ranks=range(m.last)).items():
        assert o["kind"] == "SyncTimeoutError", f"rank {r}: {o}"
        assert o["missing"] == [m.last], f"rank {r}: {o}"
        assert f"rank(s) [{m.last}] did not arrive within timeout=" in o["msg"], f"rank {r}: {o}"
        assert "of 'plain' timed out" in o["msg"], f"rank {r}: {o}"
        assert TIGHT - 0.1 < o["s"] < TIGHT + 1.5, f"rank {r}: {o}"  # the timeout, plus a 0.25 s grace to name it


@pytest.mark.parametrize("launch", launches())
def test_after_a_timeout_the_group_is_unusable_at_once(matrix: Callable[[str], Matrix], launch: str) -> None:
    m = matrix(launch)
    for r, o in m.at("skipped_call/after", ranks=range(m.last)).items():
        assert o["kind"] == "GroupBrokenError", f"rank {r}: {o}"
        assert o["s"] < 0.5, f"rank {r}: {o}"
        assert "unusable" in o["msg"], f"rank {r}: {o}"


@pytest.mark.parametrize("launch", launches())
def test_the_rank_that_skipped_a_call_learns_at_once_that_the_others_gave_up(
    matrix: Callable[[str], Matrix], launch: str
) -> None:
    m = matrix(launch)
    o = m.at("skipped_call/late_rank", ranks=[m.last])[m.last]
    assert o["kind"] == "CommunicationError", o
    assert "the other ranks had given up waiting for this rank" in o["msg"], o
    assert f"for rank(s) [{m.last}]" in o["msg"], o
    assert "'plain'" in o["msg"], o
    assert o["s"] < 2.0, o


@pytest.mark.parametrize("launch", launches())
def test_the_launch_recorded_exactly_the_outcomes_checked_here(matrix: Callable[[str], Matrix], launch: str) -> None:
    """Guards the items above: an outcome matrix_body records but no item checks fails here."""
    m = matrix(launch)
    if m.failure is not None:
        pytest.fail(m.failure, pytrace=False)
    for r in m.ranks:
        want = {"accelerate_state_of_one_process"} if LAUNCHES[launch][0] == "accelerate" else set()
        for mode in MODES:
            want |= {f"{mode}/warmup", f"{mode}/async_after"}
            want |= {f"{mode}/{c}{after}" for c in case_names(mode) for after in ("", "/after")}
        want |= {"skipped_call/late_rank"} if r == m.last else {"skipped_call/timeout", "skipped_call/after"}
        got = set(m.results[r])
        assert got == want, f"rank {r}: unchecked {sorted(got - want)}, missing {sorted(want - got)}"


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
