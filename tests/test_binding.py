"""Argument binding: which arguments are per-sample columns, which are shared, which travel."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from syncreward import ColumnNotSyncedError, InputError, NotSynced
from syncreward._binding import Binder


def trl_reward(completions: list[str], solution: list[str], **kwargs: Any) -> list[float]:
    """Reads its ``**kwargs``, so every column reaching them travels (an unread one would not: test_unread_kwargs)."""
    return [0.0] * len(kwargs.get("prompts", completions))


def binder(fn: Any = trl_reward, **options: Any) -> Binder:
    return Binder(fn, include=options.get("include"), exclude=options.get("exclude", ()), shared=options.get("shared", ()))


def trl_call() -> dict[str, Any]:
    """What TRL's GRPOTrainer passes a reward function (3 local samples)."""
    return {
        "prompts": ["p0", "p0", "p1"],
        "completions": ["a", "bb", "ccc"],
        "completion_ids": [[1], [2, 3], [4, 5, 6]],
        "solution": ["1", "1", "2"],
        "image": [object(), object(), object()],
        "trainer_state": object(),
        "log_extra": print,
        "log_metric": print,
    }


def test_trl_call_is_split_as_a_trl_user_expects() -> None:
    bound = binder().bind((), trl_call())
    assert bound.n == 3
    assert [c.name for c in bound.columns] == ["completion_ids", "completions", "image", "prompts", "solution"]
    # named parameters must travel; **kwargs columns may be left behind if they hold objects
    assert bound.droppable == {"completion_ids", "image", "prompts"}


def test_shared_values_pass_through_untouched() -> None:
    call = trl_call()
    bound = binder().bind((), call)
    args, kwargs = bound.call_args({"completions": ["x"] * 3, "solution": ["y"] * 3}, dropped=["image"])
    assert kwargs["trainer_state"] is call["trainer_state"]
    assert kwargs["log_extra"] is print
    # a keyword-only call (TRL's) is passed on by keyword
    assert args == ()
    assert (kwargs["completions"], kwargs["solution"]) == (["x"] * 3, ["y"] * 3)
    assert isinstance(kwargs["image"], NotSynced)


def test_positional_calls_stay_positional() -> None:
    def f(completions, /, solution, *rest, **kwargs):  # type: ignore[no-untyped-def]
        return completions, kwargs

    bound = Binder(f, include=None, exclude=(), shared=()).bind((["a"], ["b"], ["c"]), {"extra": ["d"]})
    args, kwargs = bound.call_args({"completions": ["A", "B"], "solution": ["S", "T"]})
    assert args[:2] == (["A", "B"], ["S", "T"])
    assert kwargs == {"extra": ["d"]}


def test_not_synced_placeholder_fails_loudly_but_reprs() -> None:
    placeholder = NotSynced("image", "it holds objects")
    assert "image" in repr(placeholder)
    for use in (len, list, lambda p: p[0], bool, lambda p: p.size, np.asarray):
        with pytest.raises(ColumnNotSyncedError, match="include=\\['image'\\]"):
            use(placeholder)


def test_lengths_that_disagree_name_every_column() -> None:
    call = trl_call()
    call["solution"] = ["1", "2"]
    with pytest.raises(InputError, match=r"completions=3.*solution=2.*shared=") as info:
        binder().bind((), call)
    assert isinstance(info.value, ValueError)


def test_shared_marks_a_list_that_is_not_per_sample() -> None:
    call = trl_call()
    call["weights"] = [0.5, 0.5]
    with pytest.raises(InputError):
        binder().bind((), call)
    bound = binder(shared=["weights"]).bind((), call)
    assert "weights" not in [c.name for c in bound.columns]


def test_include_and_exclude() -> None:
    bound = binder(include=["prompts"]).bind((), trl_call())
    assert [c.name for c in bound.columns] == ["completions", "prompts", "solution"]
    assert set(bound.excluded) == {"completion_ids", "image"}
    assert bound.droppable == set()
    bound = binder(exclude=["solution"]).bind((), trl_call())
    assert "solution" not in [c.name for c in bound.columns]
    with pytest.raises(InputError, match="no such argument"):
        binder(include=["nothere"]).bind((), trl_call())
    with pytest.raises(InputError, match="not a per-sample column"):
        binder(include=["trainer_state"]).bind((), {**trl_call(), "trainer_state": 3})


def test_arrays_tensors_and_positional_arguments() -> None:
    def f(x: Any, y: Any, *rest: Any, scale: float = 1.0) -> Any:
        return x

    bound = binder(f).bind((torch.zeros(4, 2), np.ones(4), [1, 2, 3, 4]), {"scale": 2.0})
    assert [c.name for c in bound.columns] == ["*rest[0]", "x", "y"]
    args, kwargs = bound.call_args({"x": "X", "y": "Y", "*rest[0]": "R"})
    assert args == ("X", "Y", "R") and kwargs == {"scale": 2.0}


def test_a_call_without_any_batch_is_an_error() -> None:
    with pytest.raises(InputError, match="without any per-sample argument"):
        binder(lambda a: a).bind((3,), {})


def test_wrong_arguments_raise_type_error_like_the_function() -> None:
    with pytest.raises(TypeError):
        binder().bind((), {"solution": ["x"]})
