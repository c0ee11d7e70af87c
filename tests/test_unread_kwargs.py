"""A column that reaches only a ``**kwargs`` the reward provably never reads does not travel.

TRL hands every reward every column; open-r1's ``accuracy_reward(completions, solution, **kwargs)`` reads
two. What the function cannot read is decided once, from its code (``_reads.readable_keywords``):
anything that could read the ``**kwargs`` mapping -- passing it on, a closure, ``locals()``, frames,
``eval``, code that cannot be seen -- keeps every column travelling as before.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import operator
import sys
from collections.abc import Callable
from typing import Any

import pytest
from _helpers import Counting, TrainerState

import syncreward
from syncreward import synced_reward, synced_rewards
from syncreward._binding import Binder
from syncreward._reads import readable_keywords
from syncreward.testing import run_threads

# --------------------------------------------------------------------------------------------- rewards


def accuracy_reward(completions: Any, solution: Any, **kwargs: Any) -> list[float]:  # open-r1's shape
    return [float(c.endswith(s)) for c, s in zip(completions, solution, strict=True)]


def format_reward(completions: Any, **kwargs: Any) -> list[float]:
    return [float("answer" in c) for c in completions]


def length_reward(completions: Any, **kwargs: Any) -> list[float]:  # reads completion_ids through **kwargs
    return [float(len(ids)) for ids in kwargs["completion_ids"]]


def helper(**kwargs: Any) -> list[float]:
    return [0.0] * len(kwargs["completions"])


def _passes_on(completions: Any, **kwargs: Any) -> Any:
    return helper(completions=completions, **kwargs)


def _gets(completions: Any, **kwargs: Any) -> Any:
    return kwargs.get("solution")


def _indexes(completions: Any, **kw: Any) -> Any:
    return kw["solution"]


def _iterates(completions: Any, **kwargs: Any) -> Any:
    return [k for k in kwargs]


def _len(completions: Any, **kwargs: Any) -> Any:
    return len(kwargs)


def _copies(completions: Any, **kwargs: Any) -> Any:
    kwargs = dict(kwargs)
    return kwargs


def _stores_then_loads(completions: Any, **kwargs: Any) -> Any:  # the load reads the new dict: still "reads"
    kwargs = {}
    return helper(**kwargs)


def _closure(completions: Any, **kwargs: Any) -> Any:
    def inner() -> Any:
        return kwargs

    return inner()


def _lambda(completions: Any, **kwargs: Any) -> Any:
    return (lambda: kwargs)()


def _comprehension(completions: Any, **kwargs: Any) -> Any:
    return [kwargs[k] for k in ("solution",)]


def _generator_expression(completions: Any, **kwargs: Any) -> Any:
    return list(v for v in kwargs.values())


def _locals(completions: Any, **kwargs: Any) -> Any:
    return locals()


def _vars(completions: Any, **kwargs: Any) -> Any:
    return vars()


def _dir(completions: Any, **kwargs: Any) -> Any:
    return dir()


def _eval(completions: Any, **kwargs: Any) -> Any:
    return eval("kwargs")


def _exec(completions: Any, **kwargs: Any) -> Any:
    exec("print(kwargs)")


def _getframe(completions: Any, **kwargs: Any) -> Any:
    return sys._getframe().f_locals


def _currentframe(completions: Any, **kwargs: Any) -> Any:
    return inspect.currentframe()


def _nested_getframe(completions: Any, **kwargs: Any) -> Any:
    def peek() -> Any:
        return sys._getframe(1)

    return peek()


def _traceback(completions: Any, **kwargs: Any) -> Any:
    try:
        raise ValueError
    except ValueError as e:
        return e.__traceback__.tb_frame  # type: ignore[union-attr]


def _breakpoint(completions: Any, **kwargs: Any) -> Any:
    breakpoint()


def _generator(completions: Any, **kwargs: Any) -> Any:
    yield kwargs


async def _async(completions: Any, **kwargs: Any) -> Any:
    return kwargs


def _wrapper_passing_on(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


class _Reads:
    def __call__(self, completions: Any, **kwargs: Any) -> Any:
        return kwargs


class _LoggingPartial(functools.partial):  # type: ignore[type-arg]
    """A partial whose own ``__call__`` runs (and reads the keywords) before the function it wraps."""

    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        print(sorted(kwargs))
        return super().__call__(*args)


class _LoggingStaticmethod(staticmethod):  # type: ignore[type-arg]
    def __call__(self, /, *args: Any, **kwargs: Any) -> Any:
        print(sorted(kwargs))
        return self.__func__(*args)


def _getargvalues(completions: Any, **kwargs: Any) -> Any:
    import traceback

    try:
        raise LookupError
    except LookupError as e:
        frame = next(traceback.walk_tb(e.__traceback__))[0]  # this frame, named by no frame reader
    return inspect.getargvalues(frame)[3]  # its locals: kwargs


class _CCall:
    __call__ = print  # a builtin: code that cannot be seen


READS = {
    "passes-on": _passes_on,
    "get": _gets,
    "index": _indexes,
    "iterate": _iterates,
    "len": _len,
    "copy": _copies,
    "store-then-load": _stores_then_loads,
    "closure": _closure,
    "lambda": _lambda,
    "comprehension": _comprehension,
    "generator-expression": _generator_expression,
    "locals": _locals,
    "vars": _vars,
    "dir": _dir,
    "eval": _eval,
    "exec": _exec,
    "sys-getframe": _getframe,
    "inspect-currentframe": _currentframe,
    "nested-getframe": _nested_getframe,
    "traceback-frame": _traceback,
    "breakpoint": _breakpoint,
    "generator": _generator,
    "async": _async,
    "wraps-wrapper": _wrapper_passing_on(accuracy_reward),
    "callable-object": _Reads(),
    "callable-object-c-call": _CCall(),
    "builtin": print,
    "class": dict,
    "partial-of-builtin": functools.partial(print, "x"),
    "lru-cache": functools.lru_cache(maxsize=None)(format_reward),
    "c-callable": operator.itemgetter(0),
    "synced-twice": synced_reward(accuracy_reward),  # the synced wrapper passes **kwargs on
    "partial-of-reader": functools.partial(_gets, solution=["x"]),
    "partial-subclass-with-its-own-call": _LoggingPartial(format_reward),
    "staticmethod-subclass-with-its-own-call": _LoggingStaticmethod(format_reward),
    "getargvalues-of-a-walked-frame": _getargvalues,
}


def _deletes(completions: Any, **kwargs: Any) -> Any:
    del kwargs
    return completions


def _stores(completions: Any, **kwargs: Any) -> Any:
    kwargs = None  # noqa: F841 - never read again
    return completions


def _other_closure(completions: Any, **kwargs: Any) -> Any:
    return (lambda: completions)()


def _keyword_only(*, completions: Any, solution: Any, **kwargs: Any) -> Any:
    return completions


def _positional(completions: Any, /, solution: Any, *rest: Any, **kwargs: Any) -> Any:
    return completions


def _unread_generator(completions: Any, **kwargs: Any) -> Any:
    yield completions


async def _unread_async(completions: Any, **kwargs: Any) -> Any:
    await asyncio.sleep(0)
    return completions


def _no_var_keyword(completions: Any, solution: Any) -> Any:
    return completions


def _wrapper_naming(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(completions: Any, solution: Any, **kw: Any) -> Any:
        return fn(completions, solution)

    return wrapper


class _Base:
    def score(self, completions: Any) -> list[float]:
        return [1.0] * len(completions)


class _Method(_Base):
    def score(self, completions: Any, **kwargs: Any) -> list[float]:  # super() reaches the class, not **kwargs
        return super().score(completions)

    def __call__(self, completions: Any, solution: Any, **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)


NOT_READ = {
    "open-r1-accuracy": (accuracy_reward, {"completions", "solution"}),
    "open-r1-format": (format_reward, {"completions"}),
    "delete": (_deletes, {"completions"}),
    "store-only": (_stores, {"completions"}),
    "closure-over-another-name": (_other_closure, {"completions"}),
    "keyword-only": (_keyword_only, {"completions", "solution"}),
    "positional-and-varargs": (_positional, {"completions", "solution"}),
    "generator": (_unread_generator, {"completions"}),
    "async": (_unread_async, {"completions"}),
    "no-var-keyword": (_no_var_keyword, {"completions", "solution"}),
    "wraps-wrapper-naming-its-own": (_wrapper_naming(format_reward), {"completions", "solution"}),
    "bound-method-with-super": (_Method().score, {"self", "completions"}),
    "callable-object": (_Method(), {"self", "completions", "solution"}),
    "staticmethod": (staticmethod(format_reward), {"completions"}),
    "partial": (functools.partial(accuracy_reward, solution=["1"]), {"completions", "solution"}),
}


@pytest.mark.parametrize("fn", READS.values(), ids=READS.keys())
def test_unread_kwargs_analysis_says_may_read_for_every_conservative_case(fn: Any) -> None:
    assert readable_keywords(fn) is None


@pytest.mark.parametrize(("fn", "names"), NOT_READ.values(), ids=NOT_READ.keys())
def test_unread_kwargs_analysis_proves_the_names_a_function_can_read(fn: Any, names: set[str]) -> None:
    assert readable_keywords(fn) == names


# --------------------------------------------------------------------------------------------- binding, no ranks


def trl_call(n: int = 3, **extra: Any) -> dict[str, Any]:
    """What TRL's GRPOTrainer passes every reward (TRL 1.x: every dataset column, the trainer's state)."""
    return {
        "prompts": [f"p{i // 2}" for i in range(n)],
        "completions": [f"answer {i}" for i in range(n)],
        "completion_ids": [[i] * (i + 1) for i in range(n)],
        "solution": [str(i) for i in range(n)],
        "dataset_name": ["gsm8k"] * n,
        "trainer_state": TrainerState(global_step=3),
        "log_extra": print,
        "log_metric": print,
        **extra,
    }


def bind(fn: Any, call: dict[str, Any], **options: Any) -> Any:
    b = Binder(
        fn, include=options.get("include"), exclude=options.get("exclude", ()), shared=(), **options.get("more", {})
    )
    return b.bind((), call)


def test_unread_kwargs_columns_are_not_columns_and_the_function_gets_placeholders() -> None:
    bound = bind(accuracy_reward, trl_call())
    assert [c.name for c in bound.columns] == ["completions", "solution"]
    assert bound.n == 3
    assert bound.step == 3
    _, kwargs = bound.call_args({"completions": ["A"] * 6, "solution": ["S"] * 6})
    read = {"completions", "solution", "trainer_state", "log_extra", "log_metric"}
    assert read < set(kwargs)
    unread = set(kwargs) - read
    assert unread == {"prompts", "completion_ids", "dataset_name"} & set(trl_call())
    for name in unread:  # code the analysis cannot see (a frame reader) gets a clear error, not this rank's slice
        assert isinstance(kwargs[name], syncreward.NotSynced)
        with pytest.raises(syncreward.ColumnNotSyncedError, match=rf"{name}.*never reads its \*\*kwargs.*include="):
            len(kwargs[name])


def test_unread_kwargs_columns_travel_where_the_function_may_read_them() -> None:
    bound = bind(length_reward, trl_call())
    assert [c.name for c in bound.columns] == ["completion_ids", "completions", "dataset_name", "prompts", "solution"]


def test_unread_kwargs_include_forces_a_column_in() -> None:
    bound = bind(format_reward, trl_call(), include=["completion_ids"])
    assert [c.name for c in bound.columns] == ["completion_ids", "completions"]


def test_unread_kwargs_reward_group_readers_carry_the_union() -> None:
    """A group member's binder carries what any member can read: named by one, read through **kwargs by none."""
    bound = bind(format_reward, trl_call(), more={"readers": (format_reward, accuracy_reward)})
    assert [c.name for c in bound.columns] == ["completions", "solution"]
    bound = bind(format_reward, trl_call(), more={"readers": (format_reward, length_reward)})
    assert len(bound.columns) == 5  # one member reads its **kwargs: every column travels, as before


def test_unread_kwargs_columns_are_neither_length_checked_nor_refused() -> None:
    call = trl_call(image=[object()] * 3, weights=[0.5, 0.5], stream=iter([1, 2, 3]), picked={1, 2})
    bound = bind(accuracy_reward, call)
    assert [c.name for c in bound.columns] == ["completions", "solution"]
    assert bound.n == 3
    with pytest.raises(syncreward.InputError, match="is a list_iterator"):  # a reader still gets the checks
        bind(length_reward, call)
    with pytest.raises(syncreward.InputError, match="different lengths"):
        bind(length_reward, trl_call(weights=[0.5, 0.5]))


def test_unread_kwargs_tensor_column_still_says_where_tensor_results_go() -> None:
    import torch

    ids = torch.zeros(3, 4)
    bound = bind(accuracy_reward, trl_call(completion_ids=ids))
    assert [c.name for c in bound.columns] == ["completions", "solution"]
    assert bound.unread_tensor is ids  # _transfers.device: the device of the caller's tensor inputs


def test_unread_kwargs_one_process_counts_the_samples_as_several_ranks_do() -> None:
    """In one process the result is checked against the columns the function reads, as on several ranks:
    an unread ``weights`` of another length is not the batch (it once made a 2-sample call "5 samples")."""
    synced = synced_reward(timeout=20)(format_reward)
    call = {"weights": [0.5] * 5, "completions": ["answer", "no"]}
    assert synced(**call) == [1.0, 0.0]
    assert run_threads(lambda rank, world_size: synced(**call), 2, timeout=120) == [[1.0, 0.0], [1.0, 0.0]]


def test_unread_kwargs_still_give_the_batch_size_when_the_function_reads_no_column() -> None:
    def constant(**kwargs: Any) -> list[float]:
        return []

    bound = bind(constant, {"completions": ["a", "b"], "solution": ["1", "2"]})
    assert bound.columns == []
    assert bound.n == 2


# --------------------------------------------------------------------------------------------- on ranks

IDS = 2000  # token ids per completion: ~16 KB a sample on the wire, far more than everything else


def rank_call(rank: int, n: int = 4, **extra: Any) -> dict[str, Any]:
    call = trl_call(n, **extra)
    call["completions"] = [f"r{rank} answer {i}" for i in range(n)]
    call["completion_ids"] = [list(range(rank, rank + IDS)) for _ in range(n)]
    return call


def oracle(fn: Any, rank: int, world_size: int, n: int = 4) -> Any:
    parts = [rank_call(r, n) for r in range(world_size)]
    flat = {k: [x for p in parts for x in p[k]] for k in ("prompts", "completions", "completion_ids", "solution")}
    return fn(**flat)[rank * n : (rank + 1) * n]


def sent_by_rank(fn: Any, *, group: tuple[Any, ...] = (), **options: Any) -> list[tuple[Any, int]]:
    """Each rank's results and the bytes it sent, over three calls (rank 1 sends its columns to rank 0)."""

    def body(rank: int, world_size: int) -> tuple[Any, int]:
        counting = Counting(syncreward.resolve_backend("auto"))
        if group:
            synced = synced_rewards(*group, backend=counting, timeout=20, **options)[group.index(fn)]
        else:
            synced = synced_reward(backend=counting, timeout=20, **options)(fn)
        results = [synced(**rank_call(rank)) for _ in range(3)]
        assert all(r == results[0] for r in results)
        return results[0], counting.sent

    return run_threads(body, 2, timeout=120)


ID_BYTES = 3 * 4 * IDS * 2  # three calls of 4 samples of 2000 ids under 65536: at least 2 bytes each on the wire


def test_unread_kwargs_column_does_not_travel() -> None:
    for rank, (got, sent) in enumerate(sent_by_rank(accuracy_reward)):
        assert got == oracle(accuracy_reward, rank, 2)
        assert sent < ID_BYTES // 10, f"rank {rank} sent {sent} bytes: completion_ids travelled"


@pytest.mark.parametrize(
    "fn", [length_reward, _wrapper_passing_on(accuracy_reward)], ids=["reads-kwargs", "wraps-wrapper"]
)
def test_unread_kwargs_a_reward_that_may_read_them_still_gets_every_column(fn: Any) -> None:
    got = sent_by_rank(fn)
    assert [r for r, _ in got] == [oracle(fn, rank, 2) for rank in range(2)]
    assert got[1][1] > ID_BYTES, f"rank 1 sent only {got[1][1]} bytes"


def test_unread_kwargs_include_makes_a_column_travel() -> None:
    got = sent_by_rank(accuracy_reward, include=["completion_ids", "solution"])
    assert got[1][1] > ID_BYTES, f"rank 1 sent only {got[1][1]} bytes"


def test_unread_kwargs_reward_group_carries_what_any_member_reads() -> None:
    for fn in (accuracy_reward, length_reward):
        got = sent_by_rank(fn, group=(accuracy_reward, length_reward))
        assert [r for r, _ in got] == [oracle(fn, rank, 2) for rank in range(2)]
        assert got[1][1] > ID_BYTES, f"{fn.__name__}: rank 1 sent only {got[1][1]} bytes"
    for rank, (got, sent) in enumerate(sent_by_rank(format_reward, group=(accuracy_reward, format_reward))):
        assert got == oracle(format_reward, rank, 2)
        assert sent < ID_BYTES // 10, f"rank {rank} sent {sent} bytes: completion_ids travelled"


def test_unread_kwargs_group_by_column_travels_for_the_shard_mode() -> None:
    """``group_by="prompts"`` is read by the library itself, though the function never reads it."""

    def body(rank: int, world_size: int) -> Any:
        synced = synced_reward(mode="shard", group_by="prompts", timeout=20)(format_reward)
        return synced(**rank_call(rank))

    for rank, got in enumerate(run_threads(body, 2, timeout=120)):
        assert got == oracle(format_reward, rank, 2)


def test_unread_kwargs_ranks_that_differ_only_in_an_unread_column_pair() -> None:
    """Rank 1 has an extra column holding objects; neither reward reads it (once a MismatchError: another schema)."""

    def body(rank: int, world_size: int) -> Any:
        a, f = synced_rewards(accuracy_reward, format_reward, timeout=20)
        extra = {"image": (object(),) * 4} if rank == 1 else {}
        single = synced_reward(timeout=20)(accuracy_reward)
        out = []
        for _ in range(2):
            call = rank_call(rank, **extra)
            out.append((a(**call), f(**call), single(**call)))
        return out

    for rank, got in enumerate(run_threads(body, 2, timeout=120)):
        want = (oracle(accuracy_reward, rank, 2), oracle(format_reward, rank, 2), oracle(accuracy_reward, rank, 2))
        assert got == [want, want]


def _sums_dataset_names(completions: Any, **kwargs: Any) -> list[float]:  # the edit: reads a column through **kwargs
    total = sum(len(d) for d in kwargs["dataset_name"])  # over the whole batch: only right if it was gathered
    return [float(len(c) + total) for c in completions]


class _SumsDatasetNames:
    def __call__(self, completions: Any, **kwargs: Any) -> list[float]:
        return _sums_dataset_names(completions, **kwargs)


@pytest.mark.parametrize("kind", ["function", "callable-object", "group-member"])
def test_unread_kwargs_a_reward_whose_code_is_replaced_after_syncing_gets_what_its_new_code_reads(kind: str) -> None:
    """IPython's autoreload edits a function in place (``__code__``): the columns follow the code that runs.

    Once the analysis made when the function was synced stayed: ``KeyError: 'dataset_name'`` on several ranks.
    """

    def names(rank: int) -> list[str]:
        return [f"set{rank}-{i}" * (i + 1) for i in range(4)]

    def body(rank: int, world_size: int) -> list[float]:
        def edited(completions: Any, **kwargs: Any) -> list[float]:  # reads no column through **kwargs (yet)
            return [0.0] * len(completions)

        class Edited:
            def __call__(self, completions: Any, **kwargs: Any) -> list[float]:
                return [0.0] * len(completions)

        synced: Any
        target: Any
        new: Any
        if kind == "callable-object":
            synced, target, new = synced_reward(timeout=20)(Edited()), Edited.__call__, _SumsDatasetNames.__call__
        elif kind == "group-member":
            synced, target, new = synced_rewards(format_reward, edited, timeout=20)[1], edited, _sums_dataset_names
        else:
            synced, target, new = synced_reward(timeout=20)(edited), edited, _sums_dataset_names
        assert synced(**rank_call(rank, dataset_name=names(rank))) == [0.0] * 4
        target.__code__ = new.__code__  # what autoreload does to the function object the synced reward holds
        return synced(**rank_call(rank, dataset_name=names(rank)))  # type: ignore[no-any-return]

    total = sum(len(d) for r in range(2) for d in names(r))
    want = [[float(len(c) + total) for c in rank_call(rank)["completions"]] for rank in range(2)]
    assert run_threads(body, 2, timeout=120) == want
