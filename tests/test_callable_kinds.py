"""Every way users hand a reward to a trainer works when synced: partials, instances, methods, lambdas, closures.

TRL, ms-swift and open-r1 code wrap rewards in ``functools.partial(f, num_generations=K)``, pass callable
class instances (ORM classes with a sync or ``async`` ``__call__``), bound and static methods, lambdas
and closures. Each must keep a name that is the same on every rank (never one holding a memory address,
which differs between processes) and the name TRL logs, and must see the global batch. One launch of 2
real processes runs every kind.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from syncreward import synced_reward
from syncreward.testing import run_ranks

pytestmark = pytest.mark.multiprocess

BATCHES = [["a", "bb"], ["ccc", "dddd", "e"]]
GLOBAL = [c for b in BATCHES for c in b]


def sized(completions: Any, offset: int = 0, **kwargs: Any) -> list[float]:
    """Depends on the whole batch: a wrong (local) batch gives other numbers."""
    return [float(len(c) + len(completions) + offset) for c in completions]


def expected(rank: int, offset: int = 0) -> list[float]:
    lo = sum(len(b) for b in BATCHES[:rank])
    return sized(GLOBAL, offset)[lo : lo + len(BATCHES[rank])]


class LengthORM:
    """An ms-swift-style reward class: an instance, no __name__."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def __call__(self, completions: Any, **kwargs: Any) -> list[float]:
        return sized(completions, self.offset)


class AsyncJudgeORM:
    """An ORM class whose __call__ is async (an LLM judge client)."""

    async def __call__(self, completions: Any, **kwargs: Any) -> list[float]:
        await asyncio.sleep(0)
        return sized(completions, 2)


class Scorer:
    def __init__(self) -> None:
        self.offset = 3

    def method(self, completions: Any, **kwargs: Any) -> list[float]:
        return sized(completions, self.offset)

    @synced_reward
    @staticmethod
    def static(completions: Any, **kwargs: Any) -> list[float]:
        return sized(completions, 4)


def logged(fn: Any) -> Any:
    """A decorator users put on __call__ (timing, logging): keeps the signature with functools.wraps."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


class DecoratedCall:
    @logged
    def __call__(self, completions: Any, **kwargs: Any) -> list[float]:
        return sized(completions, 5)


def make_closure(offset: int) -> Any:
    def closure_reward(completions: Any, **kwargs: Any) -> list[float]:
        return sized(completions, offset)

    return closure_reward


def kinds() -> dict[str, tuple[Any, int, str]]:
    """name -> (synced callable, offset it adds, the __name__ TRL must log)."""
    scorer = Scorer()
    return {
        "partial": (synced_reward(functools.partial(sized, offset=1)), 1, "sized"),
        "instance": (synced_reward(LengthORM(7)), 7, "LengthORM"),
        "async_instance": (synced_reward(AsyncJudgeORM()), 2, "AsyncJudgeORM"),
        "bound_method": (synced_reward(scorer.method), 3, "method"),
        "staticmethod_via_instance": (scorer.static, 4, "static"),
        "decorated_call": (synced_reward(DecoratedCall()), 5, "DecoratedCall"),
        "lambda": (synced_reward(lambda completions, **kw: sized(completions, 6)), 6, "<lambda>"),
        "closure": (synced_reward(make_closure(8)), 8, "closure_reward"),
    }


def body(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (fn, _, _) in kinds().items():
        try:
            value = fn(completions=BATCHES[rank])
            if asyncio.iscoroutine(value):
                value = asyncio.run(value)
            out[name] = ("ok", value, fn.__name__, asyncio.iscoroutinefunction(fn))
        except Exception as e:
            out[name] = (type(e).__name__, str(e)[:300], getattr(fn, "__name__", None), None)
    return out


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return run_ranks(body, 2, timeout=90)


@pytest.mark.parametrize("kind", list(kinds()))
def test_every_callable_kind_sees_the_global_batch_and_keeps_its_name(
    kind: str, results: list[dict[str, Any]]
) -> None:
    _, offset, name = kinds()[kind]
    for rank, res in enumerate(results):
        status, value, logged_name, is_coroutine_fn = res[kind]
        assert status == "ok", f"rank {rank}: {kind} raised {status}: {value}"
        assert value == expected(rank, offset), f"rank {rank}: {kind} saw a partial batch: {value}"
        assert logged_name == name, f"{kind}: TRL would log rewards/{logged_name}/mean"
        assert is_coroutine_fn == (kind == "async_instance"), f"{kind}: coroutine-ness not kept"
