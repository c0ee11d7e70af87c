"""Only the same call pairs with the same call: what tells two rewards, and two calls, apart on every rank."""

from __future__ import annotations

import asyncio
import enum
import functools
import gc
import importlib.util
import json
import os
import subprocess
import sys
import types
from typing import Any

import pytest
from _helpers import outcome, outputs_under_hash_seeds

from syncreward import MismatchError, synced_reward
from syncreward._identity import Identity, call_site, plain_repr
from syncreward.testing import free_port, run_ranks, run_threads


def target_reward(completions: list[str], target: int = 0, **kwargs: Any) -> list[float]:
    return [float(len(c) == target) + len(completions) for c in completions]


class TargetReward:
    def __init__(self, target: int, device: str = "cpu") -> None:
        self.target = target
        self.device = device

    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        return [float(self.target) + len(completions) for _ in completions]


def make_reward(target: int) -> Any:
    def reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(target) + len(completions) for _ in completions]

    return reward


def _swapped(first: Any, second: Any, world_size: int = 2) -> list[list[tuple[str, Any]]]:
    """Rank 0 calls ``first`` then ``second``; the other ranks the other way round."""

    def body(rank: int, _: int) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for f in (first, second) if rank == 0 else (second, first):
            try:
                out.append(("ok", f(completions=["ab", "abc"][: rank + 1])))
            except MismatchError as e:
                out.append(("MismatchError", str(e)))
        return out

    return run_threads(body, world_size, timeout=30)


def _every_rank_raised(results: list[list[tuple[str, Any]]]) -> None:
    for rank, calls in enumerate(results):
        assert [kind for kind, _ in calls] == ["MismatchError"] * len(calls), (rank, calls)


def test_two_partials_of_one_function_called_in_another_order_raise_on_every_rank() -> None:
    a = synced_reward(functools.partial(target_reward, target=10), timeout=5)
    b = synced_reward(functools.partial(target_reward, target=20), timeout=5)
    results = _swapped(a, b)
    _every_rank_raised(results)
    assert "target=10" in results[0][0][1]  # the message tells them apart
    assert "target=20" in results[0][0][1]


def test_two_configured_instances_of_one_class_called_in_another_order_raise_on_every_rank() -> None:
    a = synced_reward(TargetReward(10), timeout=5)
    b = synced_reward(TargetReward(20), timeout=5)
    _every_rank_raised(_swapped(a, b))


def test_two_closures_of_one_factory_called_in_another_order_raise_on_every_rank() -> None:
    a = synced_reward(make_reward(10), timeout=5)
    b = synced_reward(make_reward(20), timeout=5)
    _every_rank_raised(_swapped(a, b))


def test_rewards_told_apart_only_by_their_name_raise_on_every_rank() -> None:
    p, q = functools.partial(target_reward), functools.partial(target_reward)
    p.__name__, q.__name__ = "accuracy_a", "accuracy_b"  # type: ignore[attr-defined]  # TRL logs by __name__
    a, b = synced_reward(p, timeout=5), synced_reward(q, timeout=5)
    results = _swapped(a, b)
    _every_rank_raised(results)
    assert "'accuracy_a'" in results[1][0][1]


def test_state_that_differs_between_ranks_but_not_between_siblings_does_not_break_pairing() -> None:
    """A ``device``/``rank`` attribute every instance on a rank holds is no reason to refuse the call."""

    def body(rank: int, world_size: int) -> Any:
        a = synced_reward(TargetReward(10, device=f"cuda:{rank}"), timeout=5)
        b = synced_reward(TargetReward(20, device=f"cuda:{rank}"), timeout=5)
        return a(completions=["x"] * (rank + 1)), b(completions=["x"] * (rank + 1))

    assert run_threads(body, 2, timeout=30) == [([13.0], [23.0]), ([13.0, 13.0], [23.0, 23.0])]


def _train_step(reward: Any, rank: int, step: int) -> Any:
    return reward(completions=["a"] * (rank + 1), global_step=step)


def _on_step_end(reward: Any, rank: int, step: int) -> Any:
    return reward(completions=["a"] * (rank + 1), global_step=step)


def test_an_extra_call_at_the_same_step_from_another_place_raises_on_every_rank() -> None:
    """A callback that scores on rank 0 only, at the step the next generation is scored at, never pairs."""
    reward = synced_reward(target_reward, timeout=5)

    def body(rank: int, world_size: int) -> Any:
        _train_step(reward, rank, 0)
        try:
            if rank == 0:
                _on_step_end(reward, rank, 1)  # transformers ran on_step_end after incrementing global_step
            return ("ok", _train_step(reward, rank, 1))
        except MismatchError as e:
            return ("MismatchError", str(e))

    results = run_threads(body, 2, timeout=30)
    assert [kind for kind, _ in results] == ["MismatchError", "MismatchError"], results
    assert "_on_step_end" in results[1][1]
    assert "_train_step" in results[1][1]
    assert "from different places" in results[1][1]  # the HINT says what differs


def test_calls_from_one_place_in_a_loop_pair() -> None:
    reward = synced_reward(target_reward, timeout=5)

    def body(rank: int, world_size: int) -> Any:
        return [_train_step(reward, rank, step) for step in range(3)]

    assert run_threads(body, 2, timeout=30) == [[[3.0]] * 3, [[3.0, 3.0]] * 3]


def test_async_rewards_gathered_as_tasks_pair_across_ranks() -> None:
    """TRL runs async rewards with asyncio.gather: the site is the event loop's, the same on every rank."""

    @synced_reward(timeout=5)
    async def judge(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(completions))] * len(completions)

    async def trl_like(rank: int) -> Any:
        async def invoke() -> Any:
            return await judge(completions=["a"] * (rank + 1))

        return await asyncio.gather(invoke(), judge(completions=["b"] * (rank + 1)))

    got = run_threads(lambda rank, ws: asyncio.run(trl_like(rank)), 2, timeout=30)
    assert got == [[[3.0], [3.0]], [[3.0, 3.0], [3.0, 3.0]]]


# --------------------------------------------------------------------------------------------- on real ranks too
# Each case runs the same module-level body on thread-ranks (run_threads) and on gloo ranks (run_ranks), which
# must reach the same verdict: an identity is a function of the program and the call, not of the process.

RUNNERS = ["threads", pytest.param("gloo", marks=pytest.mark.multiprocess)]


def _run(runner: str, body: Any, *args: Any) -> list[Any]:
    if runner == "threads":
        return run_threads(body, 2, *args, timeout=90)
    return run_ranks(body, 2, *args, timeout=180)


def _kinds(results: list[list[tuple[str, Any]]]) -> list[list[str]]:
    return [[kind for kind, *_ in calls] for calls in results]


def accuracy(completions: list[str], tol: float = 0.0, **kwargs: Any) -> list[float]:
    return [tol + len(completions)] * len(completions)


_TRAIN = synced_reward(functools.partial(accuracy, tol=0.5), timeout=60)  # what every rank trains with


def _own_evaluation_on_rank_zero_body(rank: int, world_size: int) -> list[tuple[str, Any]]:
    if rank == 0:  # rank 0 alone also scores its own evaluation, in this process only
        evaluate = synced_reward(functools.partial(accuracy, tol=0.0), backend="local")
        evaluate(completions=["e"])
    return [outcome(_TRAIN, completions=["a"] * (rank + 1))[:2] for _ in range(2)]


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_sibling_decorated_on_one_rank_only_does_not_change_the_identity(runner: str) -> None:
    results = _run(runner, _own_evaluation_on_rank_zero_body)
    assert results == [[("ok", [3.5])] * 2, [("ok", [3.5, 3.5])] * 2], results


def _collected_sibling_body(rank: int, world_size: int) -> list[tuple[str, Any]]:
    gc.disable()  # only the explicit collection below runs
    try:
        dropped: list[Any] = [synced_reward(functools.partial(accuracy, tol=0.0), timeout=60)]
        dropped.append(dropped)  # a reference cycle: only the garbage collector frees it
        del dropped
        if rank == 0:
            gc.collect()
        return [outcome(_TRAIN, completions=["a"] * (rank + 1))[:2] for _ in range(2)]
    finally:
        gc.enable()


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_sibling_collected_on_one_rank_only_does_not_change_the_identity(runner: str) -> None:
    results = _run(runner, _collected_sibling_body)
    assert results == [[("ok", [3.5])] * 2, [("ok", [3.5, 3.5])] * 2], results


_TARGET_10 = synced_reward(functools.partial(target_reward, target=10), timeout=60)
_TARGET_20 = synced_reward(functools.partial(target_reward, target=20), timeout=60)
_INSTANCE_10 = synced_reward(TargetReward(10), timeout=60)
_INSTANCE_20 = synced_reward(TargetReward(20), timeout=60)
_COPIES = {"partials": (_TARGET_10, _TARGET_20), "instances": (_INSTANCE_10, _INSTANCE_20)}


def _swapped_body(rank: int, world_size: int, copies: str) -> list[tuple[str, Any]]:
    first, second = _COPIES[copies]
    order = (first, second) if rank == 0 else (second, first)
    return [outcome(f, completions=["ab", "abc"][: rank + 1])[:2] for f in order]


@pytest.mark.parametrize("copies", sorted(_COPIES))
@pytest.mark.parametrize("runner", RUNNERS)
def test_configured_copies_called_in_another_order_raise_on_every_rank(runner: str, copies: str) -> None:
    results = _run(runner, _swapped_body, copies)
    assert _kinds(results) == [["MismatchError"] * 2] * 2, results
    assert "target=10" in results[1][0][1]
    assert "target=20" in results[1][0][1]


class PlacedJudge:
    """A judge configured per rank the way accelerate users do it (device, rank, a seed offset by rank)."""

    def __init__(self, rank: int, threshold: float) -> None:
        self.threshold = threshold
        self.device = f"cuda:{rank}"
        self.rank = rank
        self.local_process_index = rank
        self.seed = 42 + rank
        self.placement = "cpu" if rank == 0 else f"cuda:{rank}"  # a device string under another name
        self._log_path = f"judge-rank{rank}.jsonl"  # private: never part of the identity

    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        return [self.threshold + len(completions)] * len(completions)


def _make_judge(device: str, local_rank: int) -> Any:
    def judge(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(completions))] * len(completions)

    return judge


def _placed_body(rank: int, world_size: int) -> list[tuple[str, Any]]:
    rewards = [
        synced_reward(PlacedJudge(rank, 0.5), timeout=60),
        synced_reward(functools.partial(accuracy, tol=0.25, device=f"cuda:{rank}"), timeout=60),
        synced_reward(_make_judge(f"cuda:{rank}", rank), timeout=60),
    ]
    return [outcome(r, completions=["x"] * (rank + 1))[:2] for r in rewards]


@pytest.mark.parametrize("runner", RUNNERS)
def test_per_rank_placement_in_the_configuration_does_not_break_pairing(runner: str) -> None:
    results = _run(runner, _placed_body)
    assert results == [
        [("ok", [3.5]), ("ok", [3.25]), ("ok", [3.0])],
        [("ok", [3.5, 3.5]), ("ok", [3.25, 3.25]), ("ok", [3.0, 3.0])],
    ], results


class LoggingJudge:
    def __init__(self, rank: int) -> None:
        self.log_path = f"judge-rank{rank}.jsonl"  # public, plain, and different on every rank

    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(completions))] * len(completions)


def _public_per_rank_state_body(rank: int, world_size: int) -> list[tuple[str, Any]]:
    return [outcome(synced_reward(LoggingJudge(rank), timeout=60), completions=["x"])[:2]]


@pytest.mark.parametrize("runner", RUNNERS)
def test_per_rank_public_state_is_a_mismatch_named_in_the_message(runner: str) -> None:
    """Configuration that differs between ranks under a name that does not say so: loud, never silent."""
    results = _run(runner, _public_per_rank_state_body)
    assert _kinds(results) == [["MismatchError"], ["MismatchError"]], results
    assert ".log_path='judge-rank0.jsonl'" in results[1][0][1]
    assert ".log_path='judge-rank1.jsonl'" in results[1][0][1]
    assert "keep it in a private attribute" in results[1][0][1]  # the HINT says what to do


# The script a launcher runs: its parent process is rank 0 and it spawns rank 1 with multiprocessing, whose
# child imports the script as ``__mp_main__``. The threads variant runs the same code under both names.
_SCRIPT_REWARD = """
from syncreward import synced_reward


@synced_reward(timeout=60)
def length_reward(completions, **kwargs):
    return [float(len(completions))] * len(completions)


def score(rank):
    try:
        return ["ok", length_reward(completions=["a"] * (rank + 1))]
    except Exception as e:
        return [type(e).__name__, str(e)]
"""
_SCRIPT_LAUNCHER = """
import json
import multiprocessing
import sys

import torch.distributed as dist


def main(rank, port, out):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    got = score(rank)
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    port, out = int(sys.argv[1]), sys.argv[2]
    child = multiprocessing.get_context("spawn").Process(target=main, args=(1, port, out))
    child.start()
    main(0, port, out)
    child.join(120)
    sys.exit(child.exitcode)
"""


def _as_module(name: str, path: str) -> Any:
    module = types.ModuleType(name)
    module.__file__ = path
    exec(compile(_SCRIPT_REWARD, path, "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_launching_script_is_main_in_its_spawned_children_too(runner: str, tmp_path: Any) -> None:
    script = tmp_path / "launch.py"
    script.write_text(_SCRIPT_REWARD + _SCRIPT_LAUNCHER)
    if runner == "threads":
        copies = [_as_module(name, str(script)) for name in ("__main__", "__mp_main__")]
        results = run_threads(lambda rank, world_size: copies[rank].score(rank), 2, timeout=90)
    else:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        done = subprocess.run(
            [sys.executable, str(script), str(free_port()), str(tmp_path)],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results == [["ok", [3.0]], ["ok", [3.0, 3.0]]], results


class Judge:
    """Two judges that differ only in the model they hold (not plain: nothing in the identity tells them apart)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        return [float(self.model.size * 10 + len(completions))] * len(completions)


class _Model:
    def __init__(self, size: int) -> None:
        self.size = size


_JUDGE_SMALL = synced_reward(Judge(_Model(1)), timeout=60)
_JUDGE_SMALL.__name__ = "judge_small"  # the remedy docs/concepts.md gives, on the object handed to TRL
_JUDGE_LARGE = synced_reward(Judge(_Model(2)), timeout=60)
_JUDGE_LARGE.__name__ = "judge_large"


def _named_judges_body(rank: int, world_size: int) -> list[tuple[str, Any]]:
    order = (_JUDGE_SMALL, _JUDGE_LARGE) if rank == 0 else (_JUDGE_LARGE, _JUDGE_SMALL)
    return [outcome(judge, completions=["x"] * (rank + 1))[:2] for judge in order]


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_name_given_to_the_synced_wrapper_tells_two_judges_apart(runner: str) -> None:
    results = _run(runner, _named_judges_body)
    assert _kinds(results) == [["MismatchError"] * 2] * 2, results
    assert "named 'judge_small'" in results[0][0][1]
    assert "named 'judge_large'" in results[0][0][1]


_CELL = """
try:
    out.append(("ok", _TRAIN(completions={})))
except Exception as e:
    out.append((type(e).__name__, str(e)))
"""
_CELL_TRAIN, _CELL_EVAL = _CELL.format("batch"), _CELL.format("held_out")


def _cells_body(rank: int, world_size: int) -> list[tuple[str, Any]]:
    """Notebook-style code: every rank runs the training cell; rank 0 first runs an evaluation cell too."""
    ns: dict[str, Any] = {"_TRAIN": _TRAIN, "out": [], "batch": ["a"] * (rank + 1), "held_out": ["h"]}
    for cell in (_CELL_EVAL, _CELL_TRAIN) if rank == 0 else (_CELL_TRAIN, _CELL_TRAIN):
        exec(cell, ns)
    return list(ns["out"])


def _lambdas_body(rank: int, world_size: int) -> list[tuple[str, Any]]:
    b, h = ["a"] * (rank + 1), ["h"]  # two lambdas on one line: one name, one first line
    train, evaluate = (lambda: _TRAIN(completions=b)), (lambda: _TRAIN(completions=h))
    return [outcome(f)[:2] for f in ((evaluate, train) if rank == 0 else (train, train))]


@pytest.mark.parametrize("body", [_cells_body, _lambdas_body], ids=["exec_cells", "lambdas"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_an_extra_call_from_code_without_a_file_or_a_lambda_raises_on_every_rank(runner: str, body: Any) -> None:
    results = _run(runner, body)
    assert [calls[0][0] for calls in results] == ["MismatchError"] * 2, results
    assert [calls[1] for calls in results] == [("ok", [3.5]), ("ok", [3.5, 3.5])], results  # the next call pairs


def test_a_mismatch_shows_the_call_site_as_file_and_line() -> None:
    reward = synced_reward(target_reward, timeout=5)

    def body(rank: int, world_size: int) -> Any:
        _train_step(reward, rank, 0)
        if rank == 0:
            return outcome(_on_step_end, reward, rank, 1)[:2]
        return outcome(_train_step, reward, rank, 1)[:2]

    results = run_threads(body, 2, timeout=30)
    assert [kind for kind, _ in results] == ["MismatchError", "MismatchError"], results
    for helper in (_on_step_end, _train_step):
        assert f"{__file__}:{helper.__code__.co_firstlineno + 1}" in results[0][1], (helper, results[0][1])


_HELPER = """
def score(reward, rank):
    return reward(completions=["a"] * (rank + 1))
"""


def _copies_body(rank: int, world_size: int, root: str) -> Any:
    path = os.path.join(root, f"checkout{rank}", "rank_helper.py")  # every rank's copy lives elsewhere
    spec = importlib.util.spec_from_file_location("rank_helper", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return outcome(module.score, _TRAIN, rank)[:2]


@pytest.mark.parametrize("runner", RUNNERS)
def test_ranks_whose_code_lives_at_different_paths_agree(runner: str, tmp_path: Any) -> None:
    for rank in range(2):
        (tmp_path / f"checkout{rank}").mkdir()
        (tmp_path / f"checkout{rank}" / "rank_helper.py").write_text(("\n" * rank) + _HELPER)
    results = _run(runner, _copies_body, str(tmp_path))
    assert results == [("ok", [3.5]), ("ok", [3.5, 3.5])], results


# --------------------------------------------------------------------------------------------- pure parts


def test_copies_that_differ_past_what_their_text_shows_raise_on_every_rank() -> None:
    """A configuration is compared whole: a long prompt that differs past its shown 256 characters still differs."""
    prefix = "You are a strict grader. " * 12  # 300 characters
    first = synced_reward(functools.partial(target_reward, target=prefix + "a"), timeout=30)
    second = synced_reward(functools.partial(target_reward, target=prefix + "b"), timeout=30)
    results = _swapped(first, second)
    _every_rank_raised(results)
    assert "copies of one reward configured differently" in results[0][0][1]


def test_plain_repr_never_holds_a_memory_address() -> None:
    obj = object()
    text = plain_repr({"model": obj, "k": [1, 2.5, "x", None, (True,)], "s": {3, 1}})
    assert "0x" not in text
    assert text == "{k=[1, 2.5, 'x', None, (True,)], model=<object>, s=<set>}"


def test_identity_is_the_configuration_whatever_else_this_process_decorated() -> None:
    a = Identity(TargetReward(1, device="cuda:3"), "TargetReward")
    assert a.key() == "test_call_identity.TargetReward[.target=1]"  # device: per rank, left out
    b = Identity(TargetReward(2, device="cuda:3"), "TargetReward")
    assert (a.key(), b.key()) == (
        "test_call_identity.TargetReward[.target=1]",
        "test_call_identity.TargetReward[.target=2]",
    )
    del b
    assert a.key() == "test_call_identity.TargetReward[.target=1]"  # a sibling coming or going changes nothing


def test_identity_leaves_out_private_and_per_rank_configuration() -> None:
    class Judge:
        def __init__(self, rank: int) -> None:
            self.threshold = 0.5
            self.local_rank = rank
            self.process_index = rank
            self.seed = 1234 + rank
            self.where = f"cuda:{rank}"  # a device string, whatever its name
            self.devices = [f"cuda:{rank}", "cpu"]
            self.options = {"device_map": f"cuda:{rank}", "top_k": 3}
            self._log = f"rank{rank}.log"

    keys = {Identity(Judge(rank), "Judge").key() for rank in range(3)}
    assert keys == {
        "test_call_identity.test_identity_leaves_out_private_and_per_rank_configuration.<locals>.Judge"
        "[.threshold=0.5, .where=<device>, .options={top_k=3}]"
    }


def test_identity_names_the_script_main_in_spawned_children_too() -> None:
    def reward(completions: Any) -> list[float]:
        return []

    reward.__module__ = "__mp_main__"  # what a spawn child's copy of the launching script says
    assert Identity(reward, "reward").key().startswith("__main__.")


@pytest.mark.skipif(sys.version_info < (3, 11), reason="co_qualname and co_positions are Python >= 3.11")
def test_call_site_compares_module_function_and_relative_line_and_shows_file_and_line() -> None:
    def caller() -> Any:
        return call_site(sys._getframe(0))

    site = caller()
    line = caller.__code__.co_firstlineno + 1
    name = "test_call_site_compares_module_function_and_relative_line_and_shows_file_and_line.<locals>.caller"
    assert site.key.startswith(f"test_call_identity:{name}+1@")  # no path, no absolute line
    assert site.shown == f"{__file__}:{line}:16 in {name}"


def test_call_site_of_code_without_a_file_holds_a_digest_of_its_code() -> None:
    ns: dict[str, Any] = {"call_site": call_site, "sys": sys}
    exec("a = call_site(sys._getframe(0))", ns)
    exec("b = call_site(sys._getframe(0))", ns)
    exec("a2 = call_site(sys._getframe(0))", ns)  # the same code as the first cell's but a name
    keys = {ns[k].key for k in ("a", "b", "a2")}
    assert len(keys) == 3
    assert all("#" in k for k in keys)
    assert call_site(sys._getframe(0)).key != ns["a"].key
    again: dict[str, Any] = {"call_site": call_site, "sys": sys}
    exec(compile("a = call_site(sys._getframe(0))", "<another cell>", "exec"), again)
    assert again["a"].key == ns["a"].key  # the same code, compiled apart: the same site on every rank


def test_code_digest_does_not_depend_on_the_process_hash_salt(tmp_path: Any) -> None:
    source = "def f(x):\n    return x in {'a', 'b', 'c', 'd'} and (lambda: x.upper())()\n"
    digests = outputs_under_hash_seeds(
        "from syncreward._identity import code_digest\n"
        "assert 'torch' not in sys.modules\n"
        f"print(code_digest(compile({source!r}, '<cell>', 'exec')))\n"
    )
    assert len(digests) == 1, digests


def test_call_site_of_a_task_is_the_event_loop() -> None:
    async def probe() -> Any:
        return call_site(sys._getframe(1))

    async def main() -> list[Any]:
        return await asyncio.gather(probe())

    assert [s.key for s in asyncio.run(main())] == ["<an event loop task or a thread pool>"]


# Two lambda rewards (TRL's reward_funcs=[lambda ...: ..., lambda ...: ...]) share one qualified name,
# ``<lambda>``, and have no configuration: only their code tells them apart.
_LAMBDA_REWARDS = (
    synced_reward(lambda completions, **kw: [1.0] * len(completions), timeout=60),
    synced_reward(lambda completions, **kw: [2.0] * len(completions), timeout=60),
)


def _lambda_rewards_body(rank: int, world_size: int) -> list[tuple[str, Any]]:
    first, second = _LAMBDA_REWARDS
    return [outcome(f, completions=["x"] * (rank + 1))[:2] for f in ((first, second) if rank == 0 else (second, first))]


@pytest.mark.parametrize("runner", RUNNERS)
def test_two_lambda_rewards_called_in_another_order_raise_on_every_rank(runner: str) -> None:
    results = _run(runner, _lambda_rewards_body)
    assert _kinds(results) == [["MismatchError"] * 2] * 2, results


def test_a_lambda_rewards_identity_is_the_same_in_every_process(tmp_path: Any) -> None:
    """The lambda's part of the identity is a digest of its code: equal across processes (hash salts)."""
    script = tmp_path / "lam.py"
    script.write_text(
        "from syncreward._identity import Identity\n"
        "f = lambda completions, **kw: [len(c) in {1, 2, 3} for c in completions]\n"
        "print(Identity(f, f.__name__).key())\n"
    )
    keys = {
        subprocess.run(
            [sys.executable, str(script)],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(keys) == 1, keys
    assert "<lambda>#" in keys.pop()


class MethodJudge:
    """Rewards as methods decorated in the class body: ``self`` reaches the function as an argument."""

    def __init__(self, target: int, rank: int = 0) -> None:
        self.target = target
        self.device = f"cuda:{rank}"  # placed per rank: not part of the identity
        self.calls = 0  # changed by the method, on the scoring rank only (mode='main')

    @synced_reward(timeout=60)
    def score(self, completions: list[str], **kwargs: Any) -> list[float]:
        self.calls += 1
        return [float(self.target) + len(completions)] * len(completions)


def _method_judges_body(rank: int, world_size: int) -> list[tuple[str, Any]]:
    ten, twenty = MethodJudge(10, rank), MethodJudge(20, rank)
    swapped = [
        outcome(j.score, completions=["x"] * (rank + 1))[:2] for j in ((ten, twenty) if rank == 0 else (twenty, ten))
    ]
    in_step = [outcome(j.score, completions=["x"] * (rank + 1))[:2] for j in (ten, ten, twenty)]
    return swapped + in_step


@pytest.mark.parametrize("runner", RUNNERS)
def test_a_method_decorated_in_its_class_is_configured_by_its_object(runner: str) -> None:
    """Two objects of one class called in another order raise; the same order pairs, whatever the method changes."""
    results = _run(runner, _method_judges_body)
    assert _kinds(results) == [["MismatchError"] * 2 + ["ok"] * 3] * 2, results
    assert "self[.target=10" in results[1][0][1]
    assert "self[.target=20" in results[1][0][1]
    assert [v for _, v in results[1][2:]] == [[13.0, 13.0], [13.0, 13.0], [23.0, 23.0]], results


class Strictness(enum.Enum):
    LENIENT = object()  # a value with a memory address: only the member's name is the same on every rank
    STRICT = object()


class EnumJudge:
    def __init__(self, strictness: Strictness) -> None:
        self.strictness = strictness

    def __call__(self, completions: list[str], **kwargs: Any) -> list[float]:
        return [float(self.strictness is Strictness.STRICT) + len(completions)] * len(completions)


def test_two_instances_configured_by_an_enum_called_in_another_order_raise_on_every_rank() -> None:
    lenient = synced_reward(EnumJudge(Strictness.LENIENT), timeout=30)
    strict = synced_reward(EnumJudge(Strictness.STRICT), timeout=30)
    results = _swapped(lenient, strict)
    _every_rank_raised(results)
    assert "<Strictness.STRICT>" in results[1][0][1]


def test_a_reward_renamed_after_a_call_is_fingerprinted_by_its_new_name() -> None:
    """The reward's key and fingerprint are cached per reward; a rename (TRL logs by ``__name__``) still shows."""
    from syncreward._call import _fingerprint

    def accuracy(completions: list[str]) -> list[float]:
        return [0.0] * len(completions)

    f = synced_reward(accuracy)
    spec = f.__syncreward_spec__  # type: ignore[attr-defined]
    columns = (("completions", "list"),)
    before = spec.key
    assert spec.key is before  # made once while the name stays
    f.__name__ = "accuracy_small"
    renamed = spec.key
    assert "accuracy_small" in renamed
    assert renamed != before
    assert _fingerprint(renamed, "", columns, "site") != _fingerprint(before, "", columns, "site")
    f.__name__ = "accuracy"
    assert spec.key == before
