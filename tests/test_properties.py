"""Every sample gets its own result: property tests on an in-process fake backend (W ranks as W threads).

Spawning processes per example would take minutes, so the ranks here are threads of this process
(:func:`syncreward.testing.run_threads`), each with its own :class:`~syncreward.testing.ThreadBackend`
implementing the :class:`syncreward.Backend` protocol with barrier-based collectives (two independent
channels, as the protocol requires). The backend also checks the protocol itself: an ``all_to_all``
whose receive counts disagree with the senders' send counts fails the test.

For random world sizes 1-4, per-rank sizes 0-20 and random schemas mixing str, int, float, bool, None,
nested lists, tuples, dicts, numpy arrays/scalars and tensors (as whole columns and as per-sample
values), every mode must hand every rank exactly the results of its own samples, in order, and the
function must see the batch the mode promises (the whole batch in order; whole groups in ``shard``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import same
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import syncreward
from syncreward import Backend, SyncTimeoutError, synced_reward
from syncreward.testing import ThreadGroup, run_threads

EXAMPLES = int(os.environ.get("SYNCREWARD_PROPERTY_EXAMPLES", "200"))  # >= 200 in CI; raise it for a deep local run


def test_thread_backend_implements_the_protocol() -> None:
    (backend,) = ThreadGroup(1).backends()
    assert isinstance(backend, Backend)


# --------------------------------------------------------------------------------------------- schemas

KINDS = [
    "ndarray_str",
    "str",
    "int",
    "float",
    "bool",
    "mixed",
    "ids",
    "nested",
    "dict",
    "np_elem",
    "tensor_elem",
    "npscalar",
    "ndarray",
    "tensor",
    "tuple_str",
    "objarray",
]
NP_DTYPES = ["<i8", "<i4", ">i4", "<u1", "<f4", "<f8", "<f2", "<c8", "|b1", "<U4"]
TORCH_DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
]

text = st.text(st.characters() | st.sampled_from("\ud800\udfff\x00"), max_size=8)  # lone surrogates too
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), text)
nested = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


def small_array(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "U":
        return np.array(rng.choice(["", "a", "bé", "漢字x"], size=shape), dtype=dt)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind == "c":
        return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(dt)
    if dt.kind == "f":
        a = rng.normal(size=shape) * 100
        if a.size:
            a.reshape(-1)[0] = [np.nan, np.inf, -0.0, 1.0][seed % 4]
        return a.astype(dt)
    return rng.integers(0, 100, size=shape).astype(dt)


def small_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 10).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


@st.composite
def schemas(draw: st.DrawFn) -> list[tuple[str, str, Any]]:
    """Column name, kind, and the per-schema parameters (dtype and trailing shape for array columns)."""
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=0, max_size=4))
    out = []
    for i, kind in enumerate(kinds):
        param: Any = None
        if kind == "ndarray":
            param = (draw(st.sampled_from(NP_DTYPES)), tuple(draw(st.lists(st.integers(0, 3), max_size=2))))
        elif kind == "tensor":
            param = (draw(st.sampled_from(TORCH_DTYPES)), tuple(draw(st.lists(st.integers(0, 3), max_size=2))))
        elif kind in ("str", "int", "float", "mixed", "nested"):
            param = draw(st.sampled_from(["list", "tuple"]))
        out.append((f"c{i}_{kind}", kind, param))
    return out


def column(draw: st.DrawFn, kind: str, param: Any, n: int, seed: int) -> Any:
    """One rank's column of ``n`` samples."""

    def lst(strategy: st.SearchStrategy[Any]) -> list[Any]:
        return draw(st.lists(strategy, min_size=n, max_size=n))

    if kind in ("str", "int", "float", "mixed", "nested"):
        strategy = {
            "str": text,
            "int": st.integers() | st.integers(-(2**63), 2**63 - 1),
            "float": st.floats(),
            "mixed": st.one_of(st.none(), st.integers(-5, 5), text, st.floats(allow_nan=False)),
            "nested": nested,
        }[kind]
        values = lst(strategy)
        return tuple(values) if param == "tuple" else values
    if kind == "bool":
        return lst(st.booleans())
    if kind == "ids":
        return lst(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6))
    if kind == "dict":
        return lst(st.dictionaries(text, scalars, max_size=3))
    if kind == "tuple_str":
        return tuple(lst(text))
    if kind == "npscalar":
        return [np.float32(i / 3) if i % 2 else np.int16(-i) for i in range(seed, seed + n)]
    if kind == "np_elem":
        return [small_array(NP_DTYPES[(seed + i) % len(NP_DTYPES)], (i % 3, 2), seed + i) for i in range(n)]
    if kind == "tensor_elem":
        return [small_tensor(TORCH_DTYPES[(seed + i) % len(TORCH_DTYPES)], (i % 3,), seed + i) for i in range(n)]
    if kind == "objarray":
        arr = np.empty(n, dtype=object)
        arr[:] = [("x", i) if i % 2 else None for i in range(n)]
        return arr
    if kind == "ndarray":
        dtype, trailing = param
        return small_array(dtype, (n, *trailing), seed)
    if kind == "ndarray_str":  # numpy picks the width from the longest entry: it differs between ranks
        return (
            np.array(lst(text.filter(lambda t: not t.endswith("\x00"))), dtype=str) if n else np.array([], dtype="<U1")
        )
    dtype, trailing = param
    return small_tensor(dtype, (n, *trailing), seed)


# --------------------------------------------------------------------------------------------- the reward


def same_values(a: Any, b: Any) -> bool:
    """``same``, except numpy byte order and str/bytes width: concatenating ranks' arrays normalises both."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and not a.dtype.hasobject:
        if a.shape != b.shape or a.dtype.kind != b.dtype.kind:
            return False
        if a.dtype.kind in "US":
            return bool(a.tolist() == b.tolist())
        return a.dtype.itemsize == b.dtype.itemsize and same(
            a.astype(a.dtype.newbyteorder("=")), b.astype(b.dtype.newbyteorder("="))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_values(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_values(a[k], b[k]) for k in a)
    return same(a, b)


RESULT_KINDS = ["list", "tuple", "ndarray", "tensor", "dict", "echo_list"]


def context_of(mode: str, gid: Sequence[int], key: Sequence[Any], group_size: int | None) -> list[int]:
    """What each sample's score depends on besides itself: the batch size, or the size of its group."""
    if mode in ("main", "replicate"):
        return [len(gid)] * len(gid)
    if mode == "shard_size":
        assert group_size is not None
        return [group_size] * len(gid)
    counts = Counter(key)
    return [counts[k] for k in key]


def build_result(kind: str, gid: Sequence[int], ctx: Sequence[int], cols: dict[str, Any]) -> Any:
    """Per-sample results that identify each sample (``gid``) and echo its columns exactly."""
    if kind == "list":
        return [g * 10 + c for g, c in zip(gid, ctx, strict=True)]
    if kind == "tuple":
        return tuple(f"{g}/{c}" for g, c in zip(gid, ctx, strict=True))
    if kind == "ndarray":
        return np.array([g + c / 1000 for g, c in zip(gid, ctx, strict=True)], dtype=np.float64).reshape(-1)
    if kind == "tensor":
        return torch.tensor([[g, c] for g, c in zip(gid, ctx, strict=True)], dtype=torch.int64).reshape(-1, 2)
    if kind == "echo_list":  # every column's value per sample, through the generic encoding
        names = sorted(cols)
        return [(g, c, *(cols[n][i] for n in names)) for i, (g, c) in enumerate(zip(gid, ctx, strict=True))]
    out: dict[str, Any] = {"gid": list(gid), "ctx": torch.tensor(list(ctx), dtype=torch.int32)}
    out.update({f"echo_{n}": v for n, v in sorted(cols.items())})  # each column's own container
    return out


def make_reward(mode: str, result_kind: str, group_size: int | None, key_counts: dict[Any, int]) -> Callable[..., Any]:
    def reward(gid: Any, key: Any, **cols: Any) -> Any:
        gid, key = list(gid), list(key)
        # what the function sees: global order, and for shard whole groups only
        assert gid == sorted(gid), f"batch out of order: {gid}"
        if mode == "shard_size":
            assert group_size is not None
            sizes = Counter(g // group_size for g in gid)
            assert all(v == group_size for v in sizes.values()), f"split group: {sizes}"
        if mode == "shard_by":
            assert all(Counter(key)[k] == key_counts[k] for k in key), f"split group: {Counter(key)} vs {key_counts}"
        return build_result(result_kind, gid, context_of(mode, gid, key, group_size), cols)

    reward.__qualname__ = f"reward_{mode}_{result_kind}"
    return reward


def decorate(mode: str, fn: Callable[..., Any], group_size: int | None) -> Callable[..., Any]:
    if mode == "shard_size":
        return synced_reward(mode="shard", group_size=group_size, timeout=30)(fn)
    if mode == "shard_by":
        return synced_reward(mode="shard", group_by="key", timeout=30)(fn)
    return synced_reward(mode=mode, timeout=30)(fn)  # type: ignore[arg-type]


def check_example(
    world_size: int,
    batches: list[dict[str, Any]],
    mode: str,
    result_kind: str,
    group_size: int | None,
) -> None:
    gids = [g for b in batches for g in b["gid"]]
    keys = [k for b in batches for k in b["key"]]
    key_counts = dict(Counter(keys))
    fn = make_reward(mode, result_kind, group_size, key_counts)

    def body(rank: int, world_size: int) -> Any:
        b = batches[rank]
        return decorate(mode, fn, group_size)(b["gid"], key=b["key"], **b["cols"])

    results = run_threads(body, world_size)
    for rank, value in enumerate(results):
        b = batches[rank]
        # the oracle: the same per-sample results, computed for this rank's samples with the global context (an
        # empty global batch too: in shard mode rank 0 scores it, as one process would)
        ctx = context_of(mode, gids, keys, group_size)
        offset = sum(len(x["gid"]) for x in batches[:rank])
        expected = build_result(result_kind, b["gid"], ctx[offset : offset + len(b["gid"])], b["cols"])
        assert same_values(value, expected), (
            f"rank {rank} ({mode}, {result_kind}): got {value!r}, expected {expected!r}"
        )


@st.composite
def examples(draw: st.DrawFn) -> tuple[int, list[dict[str, Any]], str, int]:
    world_size = draw(st.integers(1, 4))
    sizes = draw(st.lists(st.integers(0, 20), min_size=world_size, max_size=world_size))
    schema = draw(schemas())
    key_kind = draw(st.sampled_from(["int", "str", "tuple"]))
    batches = []
    start = 0
    for rank, n in enumerate(sizes):
        raw_keys = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
        keys = [k if key_kind == "int" else f"k{k}" if key_kind == "str" else (k, "x") for k in raw_keys]
        cols = {
            name: column(draw, kind, param, n, seed=1000 * rank + i) for i, (name, kind, param) in enumerate(schema)
        }
        batches.append({"gid": list(range(start, start + n)), "key": keys, "cols": cols})
        start += n
    result_kind = draw(st.sampled_from(RESULT_KINDS))
    total = sum(sizes)
    divisors = [d for d in range(1, total + 1) if total % d == 0] or [1]
    group_size = draw(st.sampled_from(divisors))
    return world_size, batches, result_kind, group_size


PROPERTY = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)


BIG_ENDIAN_SHARD = (  # regression: shard results mixed '>i4' and native int32 parts (InputError)
    4,
    [
        {"gid": [], "key": [], "cols": {"c0_ndarray": np.array([], dtype=">i4")}},
        {"gid": [], "key": [], "cols": {"c0_ndarray": np.array([], dtype=">i4")}},
        {"gid": [0, 1, 2], "key": [0, 0, 0], "cols": {"c0_ndarray": np.array([23, 57, 20], dtype=">i4")}},
        {"gid": [3, 4, 5, 6], "key": [0] * 4, "cols": {"c0_ndarray": np.array([77, 43, 26, 32], dtype=">i4")}},
    ],
    "dict",
    1,
)


EMPTY_GLOBAL_BATCH = (  # regression: shard mode returned a bare [] for an empty global batch, not the reward's dict
    3,
    [{"gid": [], "key": [], "cols": {"c0_ndarray": np.zeros((0, 2), dtype=np.float32)}}] * 3,
    "dict",
    1,
)


@PROPERTY
@example(BIG_ENDIAN_SHARD)
@example(EMPTY_GLOBAL_BATCH)
@given(examples())
def test_every_rank_gets_exactly_its_own_results_in_every_mode(
    example: tuple[int, list[dict[str, Any]], str, int],
) -> None:
    world_size, batches, result_kind, group_size = example
    for mode in ("main", "replicate", "shard_size", "shard_by"):
        check_example(world_size, batches, mode, result_kind, group_size)


async def _areward(completions: Any, idx: Any, delay: float = 0.0, **kwargs: Any) -> list[Any]:
    await asyncio.sleep(delay)
    return [(c, i, len(completions)) for c, i in zip(completions, idx, strict=True)]


@settings(max_examples=max(EXAMPLES // 4, 30), deadline=None, database=None)
@given(
    world_size=st.integers(2, 4),
    sizes=st.lists(st.integers(0, 6), min_size=4, max_size=4),
    delays=st.lists(st.sampled_from([0.0, 0.001, 0.003]), min_size=12, max_size=12),
    modes=st.lists(st.sampled_from(["main", "replicate"]), min_size=3, max_size=3),
)
def test_concurrent_async_calls_keep_their_samples_apart(
    world_size: int, sizes: list[int], delays: list[float], modes: list[str]
) -> None:
    """Three async synced calls in flight at once per rank, finishing in a different order on every rank."""
    sizes = sizes[:world_size]
    total = sum(sizes)

    def body(rank: int, world_size: int) -> Any:
        # each rank delays its calls differently on purpose: a shared value that differs between ranks
        fns = [synced_reward(mode=m, timeout=30, exclude=["delay"])(_areward) for m in modes]
        start = sum(sizes[:rank])
        comps = [f"s{start + i}" for i in range(sizes[rank])]

        async def go() -> list[Any]:
            return list(
                await asyncio.gather(
                    *(
                        f(comps, [(j, start + i) for i in range(sizes[rank])], delay=delays[4 * j + rank])
                        for j, f in enumerate(fns)
                    )
                )
            )

        return asyncio.run(go())

    results = run_threads(body, world_size)
    for rank, value in enumerate(results):
        start = sum(sizes[:rank])
        for j in range(3):
            assert value[j] == [(f"s{start + i}", (j, start + i), total) for i in range(sizes[rank])]


# --------------------------------------------------------------------------------------------- fast unit suite


def _plain(completions: Any, **kwargs: Any) -> list[float]:
    return [float(len(c)) + len(completions) / 100 for c in completions]


def _fails_on(completions: Any, fail: bool = False, **kwargs: Any) -> list[float]:
    if fail:
        raise ValueError("boom")
    return [1.0] * len(completions)


@pytest.mark.parametrize("mode", ["main", "replicate", "shard"])
def test_unit_fixed_batch_matches_the_oracle(mode: str) -> None:
    batches = [["a", "bb"], [], ["ccc", "dddd", "e", "ff"]]
    flat = [c for b in batches for c in b]
    extra = {"group_size": 2} if mode == "shard" else {}

    def body(rank: int, world_size: int) -> Any:
        f = synced_reward(mode=mode, timeout=10, **extra)(_plain)  # type: ignore[call-overload]
        return [f(batches[rank]) for _ in range(3)]

    results = run_threads(body, 3)
    for rank, value in enumerate(results):
        if mode == "shard":  # each group of 2 is scored alone
            want = [float(len(c)) + 0.02 for c in batches[rank]]
        else:
            want = [float(len(c)) + len(flat) / 100 for c in batches[rank]]
        assert value == [want] * 3


@pytest.mark.parametrize("mode", ["main", "replicate", "shard"])
def test_unit_failure_on_one_rank_raises_everywhere_then_recovers(mode: str) -> None:
    extra = {"group_size": 1} if mode == "shard" else {}
    failing_rank = 0 if mode == "main" else 2

    def body(rank: int, world_size: int) -> Any:
        # the failure is injected on one rank: a shared value that differs between ranks on purpose
        f = synced_reward(mode=mode, timeout=10, exclude=["fail"], **extra)(_fails_on)  # type: ignore[call-overload]
        out = []
        for fail in (rank == failing_rank, False):
            try:
                out.append(("ok", f([f"c{rank}"], fail=fail)))
            except Exception as e:
                out.append((type(e).__name__, getattr(e, "origin_rank", None)))
        return out

    for rank, value in enumerate(run_threads(body, 3)):
        if rank == failing_rank:
            assert value[0] == ("ValueError", None)
        else:
            assert value[0] == ("RemoteError", failing_rank)
        assert value[1] == ("ok", [1.0])


def test_unit_mismatch_and_timeout_on_fake_backend() -> None:
    def other(completions: Any, **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    def body(rank: int, world_size: int) -> Any:
        f = synced_reward(timeout=1.0)(_plain)
        g = synced_reward(timeout=1.0)(other)
        out = []
        try:
            (f if rank == 0 else g)(["x"])
        except syncreward.MismatchError as e:
            out.append(("MismatchError", "_plain" in str(e) and "other" in str(e)))
        out.append(f(["x"]))
        t0 = time.perf_counter()
        try:
            if rank != 1:
                f(["x"])
            else:  # busy past the timeout (a rank that returns has left: it would be named at once)
                time.sleep(2.0)
        except SyncTimeoutError:
            out.append(("SyncTimeoutError", time.perf_counter() - t0))
        return out

    results = run_threads(body, 3)
    for rank, value in enumerate(results):
        assert value[0] == ("MismatchError", True)
        assert value[1] == [1.03]
        if rank != 1:
            assert value[2][0] == "SyncTimeoutError"
            assert 0.9 < value[2][1] < 5.0, value
