"""Messages are finished: they name the reward, the column and the option to pass, never a placeholder.

A hint says ``exclude=['meta']`` and ``'uses_meta'``, not ``exclude=[<column>]``; a call that does not
fit the reward's signature names the reward (not only inspect's words); an option passed positionally
says to pass it as a keyword; a timeout's hint speaks of the ranks that are missing. The multi-rank
cases run on thread-ranks and on real gloo ranks, and both must say the same.
"""

from __future__ import annotations

import time
import traceback
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward
from syncreward.testing import run_ranks, run_threads


class Meta:  # a per-sample object the wire format cannot carry
    pass


@synced_reward(timeout=60)
def uses_meta(completions: Any, meta: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


@synced_reward(timeout=60)
def weighted(completions: Any, weights: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


@synced_reward(timeout=60)
def needs_solution(completions: Any, solution: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


@synced_reward(timeout=60)
def returns_a_float(completions: Any, **kwargs: Any) -> float:
    return 1.0


def _message(fn: Any) -> tuple[str, str]:
    try:
        fn()
    except syncreward.RemoteError as e:
        return "RemoteError", e.exc_message
    except Exception as e:
        return type(e).__name__, str(e)
    return "ok", ""


def cases_body(rank: int, world_size: int) -> dict[str, tuple[str, str]]:
    """Each case's (exception type, message) on this rank; the origin's message for a RemoteError."""
    return {
        "unsupported_column": _message(lambda: uses_meta(completions=["a"], meta=[Meta()])),
        "lengths_differ": _message(lambda: weighted(completions=["a", "b"], weights=[0.5, 0.3, 0.2])),
        "missing_argument": _message(
            lambda: (
                needs_solution(completions=["a"], solution=["x"]) if rank == 0 else needs_solution(completions=["a"])
            )
        ),
        "result_type": _message(lambda: returns_a_float(completions=["a"])),
    }


EXPECTED = {
    "unsupported_column": (
        "column 'meta': cannot send a test_finished_messages.Meta between ranks: syncreward's wire format carries "
        "plain data only (str, bytes, int, float, bool, None, list, tuple, dict, numpy arrays/scalars, torch "
        "tensors, and PIL images in named columns). HINT: if 'uses_meta' does not need column 'meta', pass "
        "exclude=['meta'] to its synced_reward; otherwise convert it to plain data, or pass allow_pickle=True "
        "(pickle runs code when decoded: trusted clusters only)."
    ),
    "lengths_differ": (
        "per-sample arguments of 'weighted' have different lengths on this rank: completions=2, weights=3. Every "
        "per-sample column needs one entry per local sample (2 here). HINT: if 'weights' is shared by all samples "
        "rather than per-sample, pass shared=['weights'] to the synced_reward of 'weighted'; otherwise pass one "
        "entry per sample."
    ),
    "missing_argument": (
        "synced function 'needs_solution' was called with arguments that do not fit its signature (completions, "
        "solution, **kwargs): missing a required argument: 'solution'. HINT: pass it on every rank (TRL passes "
        "each dataset column as a keyword argument: check that every rank's batch has that column), or give the "
        "parameter a default."
    ),
    "result_type": (
        "synced function 'returns_a_float' returned float; expected one result per sample as a list, tuple, numpy "
        "array, tensor, or a dict of those. HINT: return a list with one reward per sample (None where a reward "
        "does not apply)."
    ),
}
KINDS = {  # rank 0's exception type, rank 1's
    "unsupported_column": ("UnsupportedTypeError", "UnsupportedTypeError"),
    "lengths_differ": ("InputError", "InputError"),
    "missing_argument": ("RemoteError", "TypeError"),  # rank 1 is the origin
    "result_type": ("InputError", "RemoteError"),  # rank 0 scores
}


@pytest.fixture(scope="module")
def thread_cases() -> list[dict[str, tuple[str, str]]]:
    return run_threads(cases_body, 2, timeout=60)


@pytest.fixture(scope="module")
def gloo_cases() -> list[dict[str, tuple[str, str]]]:
    return run_ranks(cases_body, 2, timeout=180)


@pytest.mark.parametrize("case", list(EXPECTED))
def test_finished_message_on_thread_ranks(thread_cases: list[dict[str, tuple[str, str]]], case: str) -> None:
    for rank, got in enumerate(thread_cases):
        assert got[case] == (KINDS[case][rank], EXPECTED[case]), (rank, got[case])


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", list(EXPECTED))
def test_finished_message_on_gloo_ranks(gloo_cases: list[dict[str, tuple[str, str]]], case: str) -> None:
    for rank, got in enumerate(gloo_cases):
        assert got[case] == (KINDS[case][rank], EXPECTED[case]), (rank, got[case])


def test_missing_argument_traceback_stays_in_syncreward() -> None:
    # inspect's frames are not shown: the error is raised from syncreward's binding, with no chained cause
    def body(rank: int, world_size: int) -> Any:
        try:
            needs_solution(completions=["a"])
        except TypeError as e:
            return e.__cause__, [frame.filename for frame in traceback.extract_tb(e.__traceback__)]
        return None

    origin = run_threads(body, 2, timeout=60)[0]  # rank 0 raises its own TypeError
    cause, files = origin
    assert cause is None
    assert files[-1].endswith("_binding.py"), files
    assert not any(f.endswith("inspect.py") for f in files), files


def test_missing_argument_hint_for_unexpected_keyword() -> None:
    @synced_reward
    def no_kwargs(completions: Any) -> list[float]:
        return [1.0] * len(completions)

    def body(rank: int, world_size: int) -> Any:
        return _message(lambda: no_kwargs(completions=["a"], solution=["x"]))

    kind, msg = run_threads(body, 2, timeout=60)[0]
    assert kind == "TypeError"
    assert msg.startswith("synced function ")
    assert "got an unexpected keyword argument 'solution'. HINT: call it as its signature says" in msg


@pytest.mark.parametrize(
    ("value", "keyword"),
    [("replicate", "mode='replicate'"), ("shard", "mode='shard'"), ("torch", "backend='torch'"), (30, "timeout=30")],
)
def test_positional_option_says_pass_options_as_keywords(value: Any, keyword: str) -> None:
    with pytest.raises(TypeError) as info:
        synced_reward(value)
    assert str(info.value) == (
        f"synced_reward() takes the reward function as its only positional argument, not {value!r} (a "
        f"{type(value).__name__}). HINT: pass options as keywords: @synced_reward({keyword})."
    )
    with pytest.raises(TypeError) as info:
        syncreward.synced_rewards(uses_meta, value)
    assert str(info.value).endswith(f"HINT: pass options as keywords: synced_rewards(f, g, {keyword}).")


def test_positional_mode_with_shard_options_says_pass_options_as_keywords() -> None:
    """``@synced_reward("shard", group_size=4)``: the positional mode is the mistake, not ``group_size``."""
    with pytest.raises(TypeError) as info:
        synced_reward("shard", group_size=4, timeout=30)  # type: ignore[call-overload]
    assert str(info.value) == (
        "synced_reward() takes the reward function as its only positional argument, not 'shard' (a str). "
        "HINT: pass options as keywords: @synced_reward(mode='shard', timeout=30, group_size=4)."
    )


def test_timeout_hint_names_the_missing_rank() -> None:
    # rank 0 scores and waits for rank 1's inputs: the hint is about rank 1, not "the scoring rank"
    @synced_reward(timeout=1)
    def scored(completions: Any, **kwargs: Any) -> list[float]:
        return [1.0] * len(completions)

    def body(rank: int, world_size: int) -> Any:
        if rank == 1:  # busy past the timeout (a rank that returns has left: it would be named at once)
            time.sleep(1.5)
            return None
        return _message(lambda: scored(completions=["a"]))

    kind, msg = run_threads(body, 2, timeout=60)[0]
    assert kind == "SyncTimeoutError"
    assert "HINT: raise timeout= if rank(s) [1] legitimately take(s) longer to get here" in msg
    assert "scoring rank legitimately" not in msg


def test_positional_option_of_no_known_kind_gives_an_example() -> None:
    with pytest.raises(TypeError) as info:
        synced_reward(["completions"])  # type: ignore[call-overload]
    assert str(info.value).endswith("HINT: pass options as keywords: e.g. @synced_reward(mode='replicate').")
