"""The Ray backend on a local Ray instance: members are actors; results equal the plain function's.

One Ray start and one pool of four member actors per module. Each test runs a *body* on the first W
actors; every actor joins a fresh group (``with join(...)``) for the body and leaves after it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

ray = pytest.importorskip("ray")

from _helpers import outcome  # noqa: E402

import syncreward  # noqa: E402
from syncreward import synced_reward  # noqa: E402
from syncreward.backends import resolve_backend  # noqa: E402
from syncreward.backends.ray import _NAMESPACE, RayBackend, _actor_name, destroy, join  # noqa: E402

pytestmark = pytest.mark.ray

HERE = Path(__file__).parent
SIZES = {2: [3, 0], 3: [0, 4, 2], 4: [2, 0, 5, 1]}  # uneven, with empty ranks (and an empty scoring rank)


# --------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def members() -> Any:
    if ray.is_initialized():  # pragma: no cover - someone else's instance
        pytest.skip("a Ray instance is already running in this process")
    # Ray starts its workers at nice 15: beside other CPU-bound jobs (a loaded CI machine) they would get a
    # few percent of a core and every test here would crawl. The actors run this test's ranks: normal priority.
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        # so the workers can import this module (the actor class and the bodies live here)
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}},
    )
    pool = [Member.remote() for _ in range(4)]
    ray.get([m.ping.remote() for m in pool])
    yield pool
    ray.shutdown()


def run_group(pool: list[Any], group: str, world_size: int, body: Any, *args: Any, timeout: float = 120) -> list[Any]:
    refs = [m.run.remote(group, r, world_size, body, *args) for r, m in enumerate(pool[:world_size])]
    return list(ray.get(refs, timeout=timeout))


def coordinator_info(group: str) -> dict[str, Any]:
    return dict(ray.get(ray.get_actor(_actor_name(group), namespace=_NAMESPACE).info.remote()))


def wait_until_waiting(group: str) -> None:
    """Return once some member of ``group`` is waiting in an exchange."""
    deadline = time.monotonic() + 30
    while True:
        assert time.monotonic() < deadline, f"nobody reached an exchange of {group!r}"
        try:
            if coordinator_info(group)["pending_slots"]:
                return
        except ValueError:  # not created yet
            pass
        time.sleep(0.05)


@ray.remote(num_cpus=0)
class Member:
    """A member actor that joins a group for the duration of one body."""

    def ping(self) -> int:
        return os.getpid()

    def run(self, group: str, rank: int, world_size: int, body: Any, *args: Any) -> Any:
        with join(group, rank, world_size):
            return body(rank, world_size, *args)

    def call(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


# --------------------------------------------------------------------------------------------- oracles


def local_batch(rank: int, world_size: int) -> dict[str, Any]:
    n = SIZES[world_size][rank]
    start = sum(SIZES[world_size][:rank])
    ids = list(range(start, start + n))
    return {
        "completions": [f"answer {i} " + "é" * (i % 3) + "x" * i for i in ids],
        "solution": [str(i % 4) for i in ids],
        "feats": torch.arange(2 * n, dtype=torch.float32).reshape(n, 2) + 2 * start,
        "arr": np.arange(n, dtype=np.int16) + start,
    }


def global_batch(world_size: int) -> dict[str, Any]:
    parts = [local_batch(r, world_size) for r in range(world_size)]
    return {
        "completions": [c for p in parts for c in p["completions"]],
        "solution": [s for p in parts for s in p["solution"]],
        "feats": torch.cat([p["feats"] for p in parts]),
        "arr": np.concatenate([p["arr"] for p in parts]),
    }


def slices(values: Any, world_size: int) -> list[Any]:
    offsets = np.cumsum([0, *SIZES[world_size]]).tolist()
    return [values[offsets[r] : offsets[r + 1]] for r in range(world_size)]


def batch_reward(completions, solution, feats, arr, **kwargs):
    """Each score depends on the whole batch (its size and mean length)."""
    n = len(completions)
    mean = sum(map(len, completions)) / max(n, 1)
    rows = zip(completions, solution, feats, arr, strict=True)
    return [len(c) - mean + int(s) + float(f.sum()) + int(a) + n for c, s, f, a in rows]


def dict_reward(completions, feats, **kwargs):
    n = len(completions)
    return {"length": np.array([len(c) + n for c in completions], dtype=np.float64), "feat": feats.sum(dim=1) * n}


def group_reward(completions, **kwargs):
    """Relative within consecutive groups of 3."""
    out = []
    for g in range(0, len(completions), 3):
        grp = completions[g : g + 3]
        mean = sum(map(len, grp)) / len(grp)
        out += [len(c) - mean for c in grp]
    return out


async def async_reward(completions, delay: float = 0.0, **kwargs):
    await asyncio.sleep(delay)
    return [float(len(c) * len(completions)) for c in completions]


main_batch = synced_reward(backend="ray")(batch_reward)
replicate_batch = synced_reward(mode="replicate", backend="ray")(batch_reward)
auto_batch = synced_reward(batch_reward)  # backend="auto": the one Ray group this process joined
main_dict = synced_reward(backend="ray")(dict_reward)
shard_groups = synced_reward(mode="shard", group_size=3, backend="ray")(group_reward)
# the ranks pass different delays on purpose (to finish in different orders): not a shared value to check
main_async = synced_reward(backend="ray", exclude=["delay"])(async_reward)
replicate_async = synced_reward(mode="replicate", backend="ray")(async_reward)


def modes_body(rank: int, world_size: int) -> dict[str, Any]:
    b = local_batch(rank, world_size)
    out: dict[str, Any] = {"backend": repr(resolve_backend("auto"))}
    out["main"] = main_batch(**b)
    out["replicate"] = replicate_batch(b["completions"], b["solution"], feats=b["feats"], arr=b["arr"])
    out["auto"] = auto_batch(**b)
    out["dict"] = main_dict(b["completions"], b["feats"])
    if sum(SIZES[world_size]) % 3 == 0:
        out["shard"] = shard_groups(b["completions"])

    async def concurrent() -> list[Any]:
        # two synced async calls in flight at once (channels 0 and 1 interleave); bodies finish in
        # different orders on different ranks
        d = 0.05 * (rank % 2)
        return list(await asyncio.gather(
            main_async(b["completions"], delay=d), replicate_async(b["completions"], delay=0.05 - d)
        ))

    out["async"] = asyncio.run(concurrent())
    return out


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_mode_equals_the_plain_function_on_the_concatenated_batch(members: Any, world_size: int) -> None:
    group = f"modes-{world_size}"
    results = run_group(members, group, world_size, modes_body)
    g = global_batch(world_size)
    expected = slices(batch_reward(**g), world_size)
    expected_dict = {k: slices(v, world_size) for k, v in dict_reward(g["completions"], g["feats"]).items()}
    expected_async = slices(asyncio.run(async_reward(g["completions"])), world_size)
    expected_shard = slices(group_reward(g["completions"]), world_size)
    for r, res in enumerate(results):
        assert res["backend"] == f"RayBackend(group={group!r}, rank={r}, world_size={world_size})"
        assert res["main"] == expected[r]
        assert res["replicate"] == expected[r]
        assert res["auto"] == expected[r]
        assert np.array_equal(res["dict"]["length"], expected_dict["length"][r])
        assert res["dict"]["length"].dtype == np.float64
        assert torch.equal(res["dict"]["feat"], expected_dict["feat"][r])
        assert res["async"] == [expected_async[r], expected_async[r]]
        if "shard" in res:
            assert res["shard"] == expected_shard[r]
    # every member left; nothing is held for a slot any more
    info = coordinator_info(group)
    assert info["pending_slots"] == 0
    assert info["members"] == dict.fromkeys(range(world_size), "left")


def big_body(rank: int, world_size: int) -> dict[str, Any]:
    comps = [chr(97 + rank) * (700_000 + i) for i in range(2)]  # ~1.4 MB per member: the zero-copy path
    return {"main": main_len(comps), "replicate": replicate_len(comps)}


def total_len(completions, **kwargs):
    n = sum(map(len, completions))
    return [float(len(c) + n) + completions[0].count(c[0]) for c in completions]


main_len = synced_reward(backend="ray")(total_len)
replicate_len = synced_reward(mode="replicate", backend="ray")(total_len)


def test_large_payloads(members: Any) -> None:
    results = run_group(members, "big", 2, big_body)
    everything = [chr(97 + r) * (700_000 + i) for r in range(2) for i in range(2)]
    expected = total_len(everything)
    for r, res in enumerate(results):
        assert res["main"] == expected[2 * r : 2 * r + 2]
        assert res["replicate"] == expected[2 * r : 2 * r + 2]


# --------------------------------------------------------------------------------------------- failures


FAIL_HERE = False  # set in one member's process: the function raises there only


def fails_here(completions, **kwargs):
    _ = kwargs  # it may read its **kwargs, so every column reaching them travels and is checked
    if FAIL_HERE:
        raise ValueError(f"boom on pid {os.getpid()}")
    return [1.0] * len(completions)


main_failing = synced_reward(backend="ray")(fails_here)
replicate_failing = synced_reward(mode="replicate", backend="ray")(fails_here)
shard_failing = synced_reward(mode="shard", group_size=1, backend="ray")(fails_here)
main_tight = synced_reward(backend="ray", timeout=1.5)(batch_reward)


def raising_body(rank: int, world_size: int) -> dict[str, Any]:
    global FAIL_HERE
    comps = [f"c{rank}{i}" for i in range(rank + 1)]
    out: dict[str, Any] = {"pid": os.getpid()}
    try:
        FAIL_HERE = rank == 0
        out["main"] = outcome(main_failing, comps)  # scores on rank 0, which raises
        FAIL_HERE = rank == 2
        out["replicate"] = outcome(replicate_failing, comps)  # scores everywhere; rank 2 raises
        out["shard"] = outcome(shard_failing, comps)  # rank 2 scores some groups and raises
        FAIL_HERE = False
        out["after"] = outcome(main_failing, comps)  # a raising function breaks nothing
    finally:
        FAIL_HERE = False
    return out


def test_a_raising_member_raises_on_every_member(members: Any) -> None:
    r0, r1, r2 = run_group(members, "raises", 3, raising_body)
    boom0, boom2 = f"boom on pid {r0['pid']}", f"boom on pid {r2['pid']}"
    assert r0["main"][:2] == ("ValueError", boom0)
    for r in (r1, r2):
        assert r["main"][:2] == ("RemoteError", (0, "ValueError", boom0))
    for key in ("replicate", "shard"):
        assert r2[key][:2] == ("ValueError", boom2)
        for r in (r0, r1):
            assert r[key][:2] == ("RemoteError", (2, "ValueError", boom2)), r[key]
    for r in (r0, r1, r2):
        assert r["after"] == ("ok", [1.0] * len(r["after"][1]), r["after"][2])
        assert max(r[k][2] for k in ("main", "replicate", "shard")) < 10


def input_error_body(rank: int, world_size: int) -> tuple[str, Any, float]:
    comps = [f"c{rank}{i}" for i in range(2)]
    other = comps if rank != 1 else comps[:1]  # rank 1's columns disagree in length: fails before sending
    return outcome(main_failing, comps, other=other)


def test_a_member_failing_locally_raises_there_and_remote_error_elsewhere(members: Any) -> None:
    r0, r1 = run_group(members, "input-error", 2, input_error_body)
    assert r1[0] == "InputError"
    assert r0[:2] == ("RemoteError", (1, "syncreward.InputError", r1[1]))


def never_calls_body(rank: int, world_size: int) -> dict[str, Any]:
    b = local_batch(rank, world_size)
    out: dict[str, Any] = {}
    if rank == 1:  # never makes the call; arrives after the others gave up
        time.sleep(3.0)
    else:
        out["timeout"] = outcome(main_tight, **b)
    out["after"] = outcome(main_tight, **b)
    return out


def test_a_member_that_never_calls_is_named_in_the_timeout(members: Any) -> None:
    r0, r1, r2 = run_group(members, "never-calls", 3, never_calls_body)
    for r in (r0, r2):
        kind, missing, seconds = r["timeout"]
        assert (kind, missing) == ("SyncTimeoutError", (1,)), r["timeout"]
        assert 1.4 < seconds < 5
        assert r["after"][0] == "GroupBrokenError"
    assert r1["after"][0] == "GroupBrokenError"  # the late member learns at once, without waiting
    assert r1["after"][2] < 2
    assert "did not arrive" in r1["after"][1]


# --------------------------------------------------------------------------------------------- a dead member


@ray.remote(num_cpus=0)
class Victim:
    def join(self, group: str, rank: int, world_size: int) -> None:
        join(group, rank, world_size)


def waits_body(rank: int, world_size: int) -> tuple[str, Any, float]:
    return outcome(synced_reward(backend="ray", timeout=60.0)(batch_reward), **local_batch(rank, world_size))


def test_a_dead_member_fails_the_others_promptly(members: Any) -> None:
    victim = Victim.remote()
    ray.get(victim.join.remote("dead-member", 1, 2))
    ref = members[0].run.remote("dead-member", 0, 2, waits_body)
    wait_until_waiting("dead-member")  # rank 0 waits for rank 1 in its first exchange
    ray.kill(victim)
    kind, message, seconds = ray.get(ref, timeout=30)
    assert kind == "CommunicationError", message
    assert "rank 1" in message
    assert "died" in message
    assert seconds < 15  # well before the 60 s timeout


def join_quietly(group: str, rank: int, world_size: int, settings: dict[str, float]) -> None:
    join(group, rank, world_size, _settings=settings)  # run() joins again later: gets this same member


@ray.remote(num_cpus=0, max_retries=0)
def dies_after_joining(group: str, rank: int, world_size: int) -> None:
    join(group, rank, world_size)
    os._exit(1)  # a task member (no actor handle to watch): only its heartbeats stop


def test_a_dead_task_member_is_found_by_its_missing_heartbeat(members: Any) -> None:
    # rank 0 creates the group first, with a short heartbeat limit, then waits for rank 1 in a call
    ray.get(members[0].call.remote(join_quietly, "dead-task", 0, 2, {"heartbeat_dead_s": 3.0}))
    ref = members[0].run.remote("dead-task", 0, 2, waits_body)
    wait_until_waiting("dead-task")
    with pytest.raises(ray.exceptions.RayError):
        ray.get(dies_after_joining.remote("dead-task", 1, 2), timeout=60)
    kind, message, seconds = ray.get(ref, timeout=60)
    assert kind == "CommunicationError", message
    assert "rank 1" in message
    assert "no heartbeat" in message
    assert seconds < 20


def test_a_dead_coordinator_fails_its_members(members: Any) -> None:
    ref = members[0].run.remote("doomed", 0, 2, waits_body)  # rank 1 never comes
    wait_until_waiting("doomed")
    assert destroy("doomed")  # as if its node had failed
    kind, message, seconds = ray.get(ref, timeout=30)
    assert kind == "CommunicationError", message
    assert "coordinator actor died" in message
    assert seconds < 15


def test_the_coordinator_process_imports_neither_syncreward_nor_torch(members: Any) -> None:
    """Its classes travel by value (``_ray_coordinator``); by reference, its process would import syncreward,
    and with it torch (the workers here could: they have this checkout on their path). The member is the
    driver: an actor member's handle makes the coordinator load that actor's class, and what its module
    imports (docs/ray.md)."""
    with join("lean", 0, 1):
        info = coordinator_info("lean")
    assert info["imported"] == []
    assert info["pid"] != os.getpid()


# --------------------------------------------------------------------------------------------- membership


def misuse_body(rank: int, world_size: int) -> dict[str, Any]:
    return {
        "same_object": join("misuse", rank, world_size) is join("misuse", rank, world_size),
        "other_size": outcome(join, "misuse", rank, world_size + 1),
        "bad_rank": outcome(join, "misuse", world_size, world_size),
    }


def test_join_checks_its_arguments_and_the_group(members: Any) -> None:
    with pytest.raises(syncreward.BackendError, match="rank"):
        join("misuse", 2, 2)
    for r in run_group(members, "misuse", 2, misuse_body):
        assert r["same_object"] is True
        assert r["other_size"][0] == "BackendError"
        assert "already joined" in r["other_size"][1]
        assert r["bad_rank"][0] == "BackendError"
    with join("taken", 0, 2):  # the driver is rank 0: no other process can take rank 0 while it is live
        kind, message, _ = ray.get(members[0].call.remote(outcome, join, "taken", 0, 2))
        assert (kind, "already joined by another live member" in message) == ("BackendError", True)
        kind, message, _ = ray.get(members[0].call.remote(outcome, join, "taken", 1, 3))
        assert kind == "BackendError"
        assert "world_size 2" in message


def resolution_body(rank: int, world_size: int) -> dict[str, Any]:
    import torch.distributed as dist

    from syncreward.backends.ray import joined_backends

    out: dict[str, Any] = {"joined": [repr(b) for b in joined_backends()]}
    with join(f"second-{rank}", 0, 1):  # now two groups: "ray" and "auto" are ambiguous
        out["ray_two"] = outcome(resolve_backend, "ray")
        out["auto_two"] = outcome(resolve_backend, "auto")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29600 + rank))
    dist.init_process_group("gloo", rank=0, world_size=1)  # as under Ray Train
    try:
        out["auto_torch"] = outcome(resolve_backend, "auto")
        out["ray_torch"] = outcome(resolve_backend, "ray")
    finally:
        dist.destroy_process_group()
    return out


def test_backend_resolution(members: Any) -> None:
    with pytest.raises(syncreward.BackendError, match="join"):
        resolve_backend("ray")  # the driver joined nothing
    assert resolve_backend("auto").world_size == 1  # nothing joined: Ray is never guessed
    results = run_group(members, "resolution", 2, resolution_body)
    for r in results:
        assert r["ray_two"][0] == "BackendError"
        assert "ambiguous" in r["ray_two"][1]
        assert r["auto_two"][0] == "BackendError"
        assert r["auto_torch"][0] == "BackendError"
        assert "backend='ray'" in r["auto_torch"][1]
        assert r["ray_torch"][0] == "ok"


# --------------------------------------------------------------------------------------------- tasks + driver


def score_both(rank: int, world_size: int) -> list[Any]:
    """The driver and the task run different code: they make their synced calls through one function."""
    b = local_batch(rank, world_size)
    return [main_batch(**b), replicate_batch(**b)]


@ray.remote(num_cpus=0)
def task_member(group: str, rank: int, world_size: int) -> Any:
    with join(group, rank, world_size):
        return score_both(rank, world_size)


def test_a_task_and_the_driver_can_be_members(members: Any) -> None:
    ref = task_member.remote("task-driver", 1, 2)
    with join("task-driver", 0, 2) as backend:
        assert isinstance(backend, RayBackend)
        mine = score_both(0, 2)
    theirs = ray.get(ref, timeout=60)
    expected = slices(batch_reward(**global_batch(2)), 2)
    assert mine == [expected[0], expected[0]]
    assert theirs == [expected[1], expected[1]]
    with pytest.raises(syncreward.BackendError, match="join"):
        resolve_backend("ray")  # left


# --------------------------------------------------------------------------------------------- shipped by value


def test_reward_group_members_in_an_actor_class_shipped_by_value_stay_one_group(members: Any) -> None:
    """docs/ray.md's pattern with a reward group: rewards and actor class made where pickle cannot name them
    (as in a driver script's ``__main__``), so Ray ships the class by value, with the group's members."""

    def count(completions: Any, **kwargs: Any) -> list[float]:
        return [float(len(completions))] * len(completions)

    def longest(completions: Any, **kwargs: Any) -> list[float]:
        return [float(max(map(len, completions)))] * len(completions)

    first, second = syncreward.synced_rewards(count, longest, backend="ray", timeout=60)

    @ray.remote(num_cpus=0)
    class Worker:
        def step(self, rank: int, world_size: int, completions: list[str]) -> Any:
            with join("by-value", rank, world_size):
                group = second.__syncreward_spec__.impl.group  # how many calls reused a gathering
                before = group.hits
                return first(completions), second(completions), group.hits - before

    batches = [["a", "bbb"], ["cc", "d", "eeeee"]]
    workers = [Worker.remote() for _ in batches]  # type: ignore[attr-defined]
    try:
        refs = [w.step.remote(r, len(batches), b) for r, (w, b) in enumerate(zip(workers, batches, strict=True))]
        got = ray.get(refs, timeout=120)
    finally:
        for w in workers:
            ray.kill(w)
    assert got == [([5.0, 5.0], [5.0, 5.0], 1), ([5.0] * 3, [5.0] * 3, 1)]
