"""What ranks share is checked: a shared argument that differs between ranks, or that is no value at all.

A shared argument (anything that is not a per-sample column) is one value for the whole batch, and
in ``mode="main"`` and ``"shard"`` the batch is scored with one rank's value (in ``main`` rank 0's).
Ranks that pass different plain values must raise on every rank, naming the argument and the reward,
instead of scoring every rank's samples with rank 0's argument; values that cannot be compared alike
(objects, TRL's ``trainer_state`` and callables) or that differ on purpose (``exclude=``) are not
checked. In ``mode="replicate"`` every rank scores with its own values and keeps its own samples'
results: nothing is compared, and each rank's results are those of its own arguments. An iterator, a set or a dict
view is neither a column nor a value: it is refused, with a hint to pass a list.

Every case runs under the thread double (``run_threads``) and on real gloo ranks (``run_ranks``), and
both must give the same verdict.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import syncreward
from syncreward import synced_reward, synced_rewards
from syncreward.testing import run_ranks, run_threads

WORLD = 2
TIMEOUT = 60  # per call: a hang detector, not a speed test
MODES = ("main", "replicate", "shard")
SHARING = ("main", "shard")  # the modes in which one rank's shared arguments score other ranks' samples


@dataclass
class TrainerState:  # what TRL passes: an object, a different one on every rank
    global_step: int


def scaled(completions: Any, threshold: float = 0.5, weights: Any = (1.0,), **kwargs: Any) -> list[float]:
    return [len(c) * threshold * sum(weights) for c in completions]


def lengths(completions: Any, solution: Any = None, **kwargs: Any) -> list[float]:
    if solution is not None and not isinstance(solution, list):
        solution = list(solution)
    return [float(len(c)) + (len(solution) if solution is not None else 0) for c in completions]


def _completions(rank: int) -> list[str]:
    return [f"r{rank}-" + "x" * i for i in range(rank + 2)]


def _options(mode: str) -> dict[str, Any]:
    return {"mode": mode, "timeout": TIMEOUT, **({"group_size": 1} if mode == "shard" else {})}


def _call(fn: Callable[..., Any], mode: str, rank: int, options: dict[str, Any] | None = None, **kwargs: Any) -> Any:
    return synced_reward(**_options(mode), **(options or {}))(fn)(completions=_completions(rank), **kwargs)


# Each case: (mode, rank) -> the call's result. The "differs" cases must raise MismatchError on every rank.
DIFFERS: dict[str, Callable[[str, int], Any]] = {
    "scalar": lambda mode, rank: _call(scaled, mode, rank, threshold=0.5 + rank),
    "float_bits": lambda mode, rank: _call(scaled, mode, rank, threshold=0.1 + 0.2 if rank == 0 else 0.3),
    "shared_list": lambda mode, rank: _call(scaled, mode, rank, {"shared": ["weights"]}, weights=[1.0, 2.0 + rank]),
    "kwargs_scalar": lambda mode, rank: _call(scaled, mode, rank, temperature=[0.7, 1.0][rank]),
    "passed_on_one_rank": lambda mode, rank: _call(scaled, mode, rank, **({"threshold": 0.7} if rank == 0 else {})),
}

AGREES: dict[str, Callable[[str, int], Any]] = {
    "same_values": lambda mode, rank: _call(
        scaled, mode, rank, threshold=0.25, config=dict([("a", 1), ("b", [1, 2.5])][:: 1 - 2 * rank])
    ),
    "objects_not_checked": lambda mode, rank: _call(scaled, mode, rank, tokenizer=object(), hook=lambda: rank),
    "trl_shared": lambda mode, rank: _call(
        scaled,
        mode,
        rank,
        trainer_state=TrainerState(3),
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
    ),
    "excluded_differs_on_purpose": lambda mode, rank: _call(
        scaled, mode, rank, {"exclude": ["device"]}, device=f"cuda:{rank}"
    ),
    "generator_declared_shared": lambda mode, rank: _call(
        lengths, mode, rank, {"shared": ["solution"]}, solution=(x for x in "ab")
    ),
}

REFUSED: dict[str, Callable[[str, int], Any]] = {
    "generator": lambda mode, rank: _call(lengths, mode, rank, solution=(c for c in _completions(rank))),
    "map_on_one_rank": lambda mode, rank: _call(
        lengths, mode, rank, solution=map(str, _completions(rank)) if rank == 1 else _completions(rank)
    ),
    "set": lambda mode, rank: _call(lengths, mode, rank, solution=set(_completions(rank))),
    "dict_keys": lambda mode, rank: _call(lengths, mode, rank, solution=dict.fromkeys(_completions(rank)).keys()),
    "dict_values": lambda mode, rank: _call(lengths, mode, rank, solution={1: 2, 3: 4}.values()),
}


def _group_hit_differs(mode: str, rank: int) -> Any:
    """A reward group's second member is a hit (no inbound exchange): its check record must catch it too."""
    first, second = synced_rewards(scaled, lengths, mode=mode, timeout=TIMEOUT)
    comps = _completions(rank)
    first(completions=comps, threshold=0.5)
    return second(completions=comps, threshold=0.5 + rank)


def _describe(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except syncreward.RemoteError as e:
        return "RemoteError", (e.origin_rank, e.exc_type, e.exc_message)
    except Exception as e:
        return type(e).__name__, str(e)


def cases_body(rank: int, world_size: int) -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for mode in MODES:
        for table in (DIFFERS, AGREES, REFUSED):
            for name, case in table.items():
                out[f"{mode}/{name}"] = _describe(lambda: case(mode, rank))  # noqa: B023 (called at once)
        if mode != "shard":
            out[f"{mode}/group_hit"] = _describe(lambda: _group_hit_differs(mode, rank))  # noqa: B023
        # the mismatches above were collective: the group is still in step and usable
        out[f"{mode}/usable_after"] = _describe(lambda: _call(scaled, mode, rank, threshold=2.0))  # noqa: B023
    return out


@pytest.fixture(scope="module", params=["threads", "gloo"])
def outcomes(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, tuple[str, Any]]]]:
    if request.param == "threads":
        return "threads", run_threads(cases_body, WORLD, timeout=120)
    return "gloo", run_ranks(cases_body, WORLD, timeout=240)


def _expected(fn: Callable[..., Any], **kwargs: Any) -> list[Any]:
    """Every rank's slice of ``fn`` on the concatenated batch."""
    batches = [_completions(r) for r in range(WORLD)]
    full = fn([c for b in batches for c in b], **kwargs)
    out, lo = [], 0
    for b in batches:
        out.append(full[lo : lo + len(b)])
        lo += len(b)
    return out


def _mismatch_on_every_rank(got: list[tuple[str, Any]]) -> list[str]:
    kinds = [kind for kind, _ in got]
    assert kinds == ["MismatchError"] * WORLD, got
    messages = [info for _, info in got]
    assert len(set(messages)) == 1, messages  # every rank decided from the same data: one message
    return messages


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", SHARING)
@pytest.mark.parametrize("case", sorted(DIFFERS))
def test_shared_argument_that_differs_between_ranks_raises_on_every_rank(
    outcomes: tuple[str, list[dict[str, tuple[str, Any]]]], mode: str, case: str
) -> None:
    double, results = outcomes
    (message,) = set(_mismatch_on_every_rank([r[f"{mode}/{case}"] for r in results]))
    name = {"shared_list": "weights", "kwargs_scalar": "temperature"}.get(case, "threshold")
    assert f"synced function 'scaled' with different values of the shared argument(s) '{name}'" in message, double
    assert "HINT: if it holds one entry per sample, pass it as a list" in message
    assert f"exclude=['{name}']" in message
    shown = {
        "scalar": "0.5 on rank(s) [0]; 1.5 on rank(s) [1]",
        "float_bits": "0.30000000000000004 on rank(s) [0]; 0.3 on rank(s) [1]",
        "shared_list": "[1.0, 2.0] on rank(s) [0]; [1.0, 3.0] on rank(s) [1]",
        "kwargs_scalar": "0.7 on rank(s) [0]; 1.0 on rank(s) [1]",
        "passed_on_one_rank": "0.7 on rank(s) [0]; <not passed> on rank(s) [1]",
    }[case]
    assert f"  {name}: {shown}" in message, (double, message)


@pytest.mark.multiprocess
def test_shared_argument_that_differs_in_a_reward_groups_hit_raises_on_every_rank(
    outcomes: tuple[str, list[dict[str, tuple[str, Any]]]],
) -> None:
    double, results = outcomes
    (message,) = set(_mismatch_on_every_rank([r["main/group_hit"] for r in results]))
    assert "synced function 'lengths' with different values of the shared argument(s) 'threshold'" in message, double


# rank -> (threshold, weights) each DIFFERS case passes on that rank (scaled's defaults where it passes none)
OWN = {
    "scalar": lambda rank: (0.5 + rank, (1.0,)),
    "float_bits": lambda rank: (0.1 + 0.2 if rank == 0 else 0.3, (1.0,)),
    "shared_list": lambda rank: (0.5, [1.0, 2.0 + rank]),
    "kwargs_scalar": lambda rank: (0.5, (1.0,)),
    "passed_on_one_rank": lambda rank: (0.7 if rank == 0 else 0.5, (1.0,)),
}


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", sorted(DIFFERS))
def test_replicate_scores_each_ranks_samples_with_its_own_shared_arguments(
    outcomes: tuple[str, list[dict[str, tuple[str, Any]]]], case: str
) -> None:
    double, results = outcomes
    for rank, r in enumerate(results):
        threshold, weights = OWN[case](rank)
        want = [len(c) * threshold * sum(weights) for c in _completions(rank)]
        assert r[f"replicate/{case}"] == ("ok", want), (double, rank)
    assert [r["replicate/group_hit"] for r in results] == [
        ("ok", [float(len(c)) for c in _completions(rank)]) for rank in range(WORLD)
    ], double


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(AGREES))
def test_shared_arguments_that_agree_or_are_not_checked_score_normally(
    outcomes: tuple[str, list[dict[str, tuple[str, Any]]]], mode: str, case: str
) -> None:
    double, results = outcomes
    got = [r[f"{mode}/{case}"] for r in results]
    assert [kind for kind, _ in got] == ["ok"] * WORLD, (double, got)
    if case == "generator_declared_shared":  # one generator object per rank: only the scoring rank's is read
        return
    threshold = 0.25 if case == "same_values" else 0.5
    assert [value for _, value in got] == _expected(scaled, threshold=threshold), (double, case)


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_iterator_set_or_dict_view_argument_is_refused_on_every_rank(
    outcomes: tuple[str, list[dict[str, tuple[str, Any]]]], mode: str, case: str
) -> None:
    double, results = outcomes
    got = [r[f"{mode}/{case}"] for r in results]
    refusing = [1] if case == "map_on_one_rank" else list(range(WORLD))
    for rank, (kind, info) in enumerate(got):
        if rank in refusing:
            assert kind == "InputError", (double, rank, got)
            message = info
        else:  # the rank that passed a list learns the other's failure
            assert (kind, info[0]) == ("RemoteError", 1), (double, rank, got)
            assert info[1].endswith("InputError"), (double, rank, got)
            message = info[2]
        what = {"generator": "generator", "map_on_one_rank": "map", "set": "set"}.get(case, case)
        assert f"argument 'solution' of synced function 'lengths' is a {what}, which is not a per-sample" in message
        assert "HINT: pass a list with one entry per sample" in message
        assert "shared=['solution']" in message


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", MODES)
def test_group_stays_usable_after_a_shared_argument_mismatch(
    outcomes: tuple[str, list[dict[str, tuple[str, Any]]]], mode: str
) -> None:
    double, results = outcomes
    got = [r[f"{mode}/usable_after"] for r in results]
    assert got == [("ok", part) for part in _expected(scaled, threshold=2.0)], (double, got)


@pytest.mark.multiprocess
def test_troubleshooting_quotes_the_shared_argument_mismatch_as_raised(
    outcomes: tuple[str, list[dict[str, tuple[str, Any]]]],
) -> None:
    import re
    from pathlib import Path

    _, results = outcomes
    raised = results[0]["main/scalar"][1].replace("'scaled'", "'f'")
    page = (Path(__file__).parent.parent / "docs" / "troubleshooting.md").read_text()
    quoted = page.split("```text\nMismatchError: ", 1)[1].split("```", 1)[0]
    assert " ".join(quoted.split()) == " ".join(raised.split())
    assert re.search(r"### `MismatchError: ranks called synced function 'f' with different values of the shared", page)
