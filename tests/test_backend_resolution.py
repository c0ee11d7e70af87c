"""Backend resolution and setup: one backend object per job, and setup failures named for what they are."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist

import syncreward
from syncreward import synced_reward
from syncreward.testing import free_port, run_ranks


def _init_single_process_gloo() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)


def test_backend_resolution_concurrent_first_resolve_gives_one_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two threads resolving backend='torch' for the first time at once get the same object."""
    from syncreward.backends import torch_distributed

    _init_single_process_gloo()
    original = torch_distributed.TorchDistributedBackend.__init__

    def slow_init(self: Any, *args: Any, **kwargs: Any) -> None:
        time.sleep(0.3)  # widen the race window
        original(self, *args, **kwargs)

    monkeypatch.setattr(torch_distributed.TorchDistributedBackend, "__init__", slow_init)
    start = threading.Barrier(2)
    got: list[Any] = [None, None]

    def resolve(i: int) -> None:
        start.wait(5)
        got[i] = syncreward.resolve_backend("torch")

    threads = [threading.Thread(target=resolve, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert None not in got, got
    assert got[0] is got[1], f"two backends for one job: {got[0]!r} (id {id(got[0])}) and {got[1]!r} (id {id(got[1])})"


def test_backend_resolution_group_setup_failure_is_not_called_a_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure creating syncreward's gloo groups that is not a timeout is reported as what it was."""
    _init_single_process_gloo()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(dist, "ProcessGroupGloo", boom)  # syncreward builds its gloo groups with it
    backend = syncreward.resolve_backend("torch")
    with pytest.raises(Exception) as info:  # the type is free; the message is what is pinned
        backend.all_gather(np.zeros(3, dtype=np.int64), channel=0, timeout=5.0)
    message = str(info.value)
    problems = []
    if "boom" not in message:
        problems.append("the error does not name the cause ('boom')")
    if isinstance(info.value, syncreward.SyncTimeoutError):
        problems.append("it is a SyncTimeoutError")
    if re.search(r"within [0-9.]+ ?s\b", message) or "timed out" in message:
        problems.append("its message claims a timeout")
    assert not problems, f"{type(info.value).__name__}: {message}\n" + "\n".join(problems)


def _reward(completions: Any, **kwargs: Any) -> list[float]:
    return [1.0] * len(completions)


def _first_call_timeout_body(rank: int, world_size: int, done: str) -> Any:
    if rank == 1:  # never makes the call, but stays in the job until rank 0 has given up
        deadline = time.monotonic() + 30
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    t0 = time.monotonic()
    try:
        synced_reward(timeout=2)(_reward)(["a"])
        return ("ok", "", (), time.monotonic() - t0)
    except syncreward.SyncTimeoutError as e:
        return ("SyncTimeoutError", str(e), tuple(e.missing_ranks), time.monotonic() - t0)
    except Exception as e:
        return (type(e).__name__, str(e), (), time.monotonic() - t0)
    finally:
        Path(done).touch()


@pytest.mark.multiprocess
def test_backend_resolution_first_call_timeout_names_the_missing_rank(tmp_path: Path) -> None:
    kind, message, missing, seconds = run_ranks(_first_call_timeout_body, 2, str(tmp_path / "done"), timeout=120)[0]
    problems = []
    if kind != "SyncTimeoutError":
        problems.append(f"rank 0 raised {kind}, not SyncTimeoutError")
    if missing != (1,):
        problems.append(f"missing_ranks is {missing}, not (1,)")
    if not re.search(r"\branks?(\(s\))?:? \[?1\b", message):
        problems.append("the message does not name rank 1 as the missing one")
    if seconds > 10:
        problems.append(f"it took {seconds:.1f}s")
    assert not problems, f"{kind}: {message}\n" + "\n".join(problems)


def _quiet_first_call_timeout_body(rank: int, world_size: int, done: str, log: str) -> Any:
    if rank == 1:
        return _first_call_timeout_body(rank, world_size, done)
    saved = os.dup(2)
    with open(log, "w") as f:
        os.dup2(f.fileno(), 2)  # torch's C++ logging writes to fd 2
    try:
        result = _first_call_timeout_body(rank, world_size, done)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    return result, Path(log).read_text()


@pytest.mark.multiprocess
def test_backend_resolution_first_call_timeout_logs_no_store_noise(tmp_path: Path) -> None:
    # the rank that gives up names the missing rank without gloo's rendezvous waiting in the store first
    # (which logged "[c10d] waitForInput: ... timed out after 2000ms" before syncreward's error)
    args = (str(tmp_path / "done"), str(tmp_path / "rank0.err"))
    (kind, message, missing, _), stderr = run_ranks(_quiet_first_call_timeout_body, 2, *args, timeout=120)[0]
    assert kind == "SyncTimeoutError", message
    assert missing == (1,)
    assert "waitForInput" not in stderr, stderr
    assert "[c10d]" not in stderr, stderr


def test_backend_resolution_auto_in_one_process_is_local_only_where_nothing_distributed_is_set_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ "auto"'s order, case by case, with each library loaded or not (its single-process steps are cheap lookups)."""
    import sys
    import types

    from syncreward.backends import _resolve

    def auto() -> Any:
        try:
            return _resolve._auto(None)
        except syncreward.BackendError as e:
            return e

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    for module in ("accelerate.state", "syncreward.backends.ray"):  # earlier tests of the suite loaded them
        monkeypatch.delitem(sys.modules, module, raising=False)
    assert auto() is _resolve._LOCAL

    for value, says_local in (("1", True), ("2", False), ("01", True), ("0", True)):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("WORLD_SIZE", value)
            got = auto()
            if says_local:
                assert got is _resolve._LOCAL, value
            else:
                assert isinstance(got, syncreward.BackendError), value  # WORLD_SIZE=2 without a process group

    ray_module = types.ModuleType("syncreward.backends.ray")
    ray_module.joined_backends = lambda: []  # type: ignore[attr-defined]
    with pytest.MonkeyPatch.context() as patch:  # the Ray backend loaded, no group joined: still local
        patch.setitem(sys.modules, "syncreward.backends.ray", ray_module)
        assert auto() is _resolve._LOCAL

    import accelerate.state  # loaded (TRL imports it) but no state of several processes: still local

    assert auto() is _resolve._LOCAL
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(accelerate.state.PartialState, "_shared_state", {"num_processes": 2})
        chosen = object()
        patch.setattr(_resolve, "_accelerate", lambda process_group: chosen)
        assert auto() is chosen

    _init_single_process_gloo()  # a default process group: the torch backend, never local
    try:
        backend = syncreward.resolve_backend("auto")
        assert backend.world_size == 1
        assert backend is not _resolve._LOCAL
    finally:
        dist.destroy_process_group()


def test_backend_resolution_follows_a_torch_world_replaced_after_the_first_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torch's record of its default group (``distributed_c10d._world``) is an "extension point to override" that
    torch's own multi-threaded process group replaces: whether a job is initialised follows ``dist.is_initialized()``
    whatever record is in place, even one swapped in after a single-process call read the first."""
    from torch.distributed import distributed_c10d as c10d

    from syncreward.backends import _cache

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not dist.is_initialized()
    assert not _cache.torch_active()  # (a first single-process check: it read torch's record as it is now)

    class ThreadLocalWorld:  # as torch.testing._internal.distributed.multi_threaded_pg's: a property, no attribute
        default_pg: Any = object()

    initialised = c10d._World()
    initialised.default_pg = object()  # type: ignore[assignment]
    for world in (initialised, ThreadLocalWorld()):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(c10d, "_world", world)
            assert dist.is_initialized()
            assert _cache.torch_active(), type(world).__name__
            assert _cache.torch_active()  # (and again, once this record was seen)
        assert not _cache.torch_active()  # the first record back: one process again
