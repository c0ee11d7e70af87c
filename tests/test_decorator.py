"""The decorator's surface: metadata, options, backend resolution, the single-process path."""

from __future__ import annotations

import asyncio
import importlib
import inspect
import re
import sys
from typing import Any

import numpy as np
import pytest
import torch

import syncreward
import syncreward.testing
from syncreward import Backend, BackendError, synced_reward, synced_rewards
from syncreward.backends import LocalBackend, resolve_backend


def reward(completions: list[str], solution: list[str], **kwargs: object) -> list[float]:
    """Length reward."""
    return [float(len(c)) for c in completions]


async def async_reward(completions: list[str], **kwargs: object) -> list[float]:
    """Async length reward."""
    await asyncio.sleep(0)
    return [float(len(c)) for c in completions]


def test_public_api_is_pinned() -> None:
    assert sorted(syncreward.__all__) == sorted(
        [
            "Backend", "BackendError", "CodecError", "ColumnNotSyncedError", "CommunicationError",
            "GroupBrokenError", "InputError", "MismatchError", "NotSynced", "RemoteError", "ResultLengthError",
            "SyncRewardError", "SyncTimeoutError", "SyncedReward", "UnsupportedTypeError", "__version__",
            "resolve_backend", "synced_reward",
            "synced_rewards",
        ]
    )


@pytest.mark.parametrize("decorate", [synced_reward, synced_reward(), synced_reward(mode="replicate", timeout=5)])
def test_wrapper_keeps_name_doc_signature(decorate) -> None:  # type: ignore[no-untyped-def]
    wrapped = decorate(reward)
    assert wrapped.__name__ == "reward"
    assert wrapped.__qualname__ == reward.__qualname__
    assert wrapped.__doc__ == "Length reward."
    assert inspect.signature(wrapped) == inspect.signature(reward)
    assert not inspect.iscoroutinefunction(wrapped)


def test_async_wrapper_stays_a_coroutine_function() -> None:
    wrapped = synced_reward(async_reward)
    assert inspect.iscoroutinefunction(wrapped)
    assert wrapped.__name__ == "async_reward"
    trl_utils = pytest.importorskip("trl.trainer.utils")
    if hasattr(trl_utils, "is_async_callable"):
        assert trl_utils.is_async_callable(wrapped)
        assert not trl_utils.is_async_callable(synced_reward(reward))


def test_single_process_calls_the_function_directly() -> None:
    sentinel = [1.0, 2.0]
    wrapped = synced_reward(lambda completions: sentinel)
    assert wrapped(["a", "b"]) is sentinel  # no copy, no exchange
    assert synced_reward(reward)(["ab", "c"], ["1", "2"], trainer_state=None) == [2.0, 1.0]
    assert asyncio.run(synced_reward(async_reward)(["abc"])) == [3.0]


def test_single_process_torch_job_is_a_direct_call(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    from syncreward.backends.local import LocalBackend

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(syncreward.testing.free_port()))
    assert isinstance(resolve_backend("auto"), LocalBackend)  # (the check reads torch's record of its group)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        backend = resolve_backend("auto")
        assert backend.world_size == 1 and backend.rank == 0 and not isinstance(backend, LocalBackend)
        assert synced_reward(backend="torch")(reward)(["ab"], ["x"]) == [2.0]
    finally:
        dist.destroy_process_group()
    assert isinstance(resolve_backend("auto"), LocalBackend)  # the job is gone: one process again


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "all"}, "mode must be one of"),
        ({"mode": "shard"}, "exactly one of group_size"),
        ({"mode": "shard", "group_size": 2, "group_by": "x"}, "exactly one of group_size"),
        ({"mode": "shard", "group_size": 0}, "positive int"),
        ({"group_size": 4}, "group_size= only applies to mode='shard', not mode='main'"),
        ({"mode": "replicate", "group_by": "x"}, "group_by= only applies to mode='shard', not mode='replicate'"),
        ({"mode": "shard", "group_by": 3}, "group_by must name a per-sample column"),
        ({"timeout": 0}, "timeout must be a number of seconds"),
        ({"backend": "nccl"}, "unknown backend"),
        ({"shared": ["solution"], "include": ["solution"]}, "both shared and included"),
        ({"mode": "shard", "group_by": "trainer_state"}, "shared argument"),
    ],
)
def test_bad_options_fail_at_decoration(options: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        synced_reward(**options)(reward)  # type: ignore[call-overload]


def test_multi_process_env_without_init_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(BackendError, match="init_process_group"):
        synced_reward(reward)(["a"], ["b"])
    # an explicit choice to score alone is respected
    assert synced_reward(backend="local")(reward)(["a"], ["b"]) == [1.0]


def test_torch_backend_without_init_explains() -> None:
    with pytest.raises(BackendError, match="init_process_group"):
        synced_reward(backend="torch")(reward)(["a"], ["b"])


def test_missing_accelerate_says_what_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # syncreward is not on PyPI: the hint names what works, not pip install 'syncreward[accelerate]'
    monkeypatch.setitem(sys.modules, "accelerate", None)
    with pytest.raises(ImportError) as info:
        synced_reward(backend="accelerate")(reward)(["a"], ["b"])
    assert str(info.value) == (
        "backend='accelerate' needs the accelerate package. HINT: pip install accelerate "
        "(or, in a checkout of syncreward, pip install -e '.[accelerate]')"
    )


def test_missing_ray_says_what_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.delitem(sys.modules, "syncreward.backends.ray", raising=False)
    with pytest.raises(ImportError) as info:
        importlib.import_module("syncreward.backends.ray")
    assert str(info.value) == (
        "backend='ray' needs the ray package. HINT: pip install ray (or, in a checkout of syncreward, pip install "
        "-e '.[ray]')"
    )


def test_backend_protocol_is_runtime_checkable() -> None:
    assert isinstance(LocalBackend(), Backend)
    assert not isinstance(object(), Backend)
    with pytest.raises(BackendError, match="Backend protocol"):
        synced_reward(backend=object())(reward)(["a"], ["b"])  # type: ignore[call-overload]


def test_explicit_backend_object_wins() -> None:
    class OneRank:
        rank = 0
        world_size = 1
        calls = 0

        def all_gather(self, row, *, channel, timeout):  # type: ignore[no-untyped-def]
            raise AssertionError("a one-rank backend needs no exchange")

        def all_to_all(self, send, send_counts, recv_counts, *, channel, timeout):  # type: ignore[no-untyped-def]
            raise AssertionError("a one-rank backend needs no exchange")

    assert synced_reward(backend=OneRank())(reward)(["abc"], ["x"]) == [3.0]


def test_containers_pass_through_locally() -> None:
    t = torch.arange(3.0)
    a = np.arange(3)
    assert synced_reward(lambda x: x * 2)(t).tolist() == [0.0, 2.0, 4.0]
    assert synced_reward(lambda x: x + 1)(a).tolist() == [1, 2, 3]


# --------------------------------------------------------------------------------------------- one declaration


def _keyword_defaults(fn: Any) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _declared() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Every option's (default, type): ``Options``' fields, the modes' declared options, the gathering modes'."""
    import dataclasses

    from syncreward._modes import MODES
    from syncreward._modes._base import GatherMode
    from syncreward._options import Options

    general = {f.name: (f.default, f.type) for f in dataclasses.fields(Options) if f.name != "mode_options"}
    modes = {o.name: (o.default, o.type) for m in MODES.values() for o in m.options}
    gathering = {o.name: (o.default, o.type) for m in MODES.values() if isinstance(m, GatherMode) for o in m.options}
    return general, modes, gathering


def test_options_signatures_name_the_options_with_their_defaults() -> None:
    """``synced_reward``'s keywords (and the typed overload's) are ``Options``' fields and the modes' declared
    options; ``synced_rewards``' are ``Options``' fields and the gathering modes' options."""
    import typing

    general, modes, gathering = _declared()
    assert set(modes) == {"group_size", "group_by"}  # shard's: the declarations are read, not empty
    declared = {k: d for k, (d, _) in {**general, **modes}.items()}
    assert _keyword_defaults(synced_reward) == declared
    if sys.version_info >= (3, 11):  # typing.get_overloads
        overloads = [o for o in typing.get_overloads(synced_reward) if _keyword_defaults(o)]
        assert [_keyword_defaults(o) for o in overloads] == [declared]
    assert _keyword_defaults(synced_rewards) == {k: d for k, (d, _) in {**general, **gathering}.items()}


def _keyword_types(fn: Any) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    return {p.name: p.annotation for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_options_signatures_spell_the_options_types() -> None:
    """Each option has one type: the signatures' annotations are the declarations' (a group takes a gathering mode)."""
    import typing

    general, modes, gathering = _declared()
    declared = {k: t for k, (_, t) in {**general, **modes}.items()}
    assert declared["mode"] == "ModeName"
    assert declared["backend"] == "str | Backend"
    assert declared["group_size"] == "int | None"
    assert _keyword_types(synced_reward) == declared
    if sys.version_info >= (3, 11):  # typing.get_overloads
        overloads = [o for o in typing.get_overloads(synced_reward) if _keyword_types(o)]
        assert [_keyword_types(o) for o in overloads] == [declared]
    group = {k: t for k, (_, t) in {**general, **gathering}.items()}
    assert _keyword_types(synced_rewards) == {**group, "mode": "GatherModeName"}


def test_options_of_a_mode_are_documented_in_synced_reward_docstring() -> None:
    """Every declared mode option has its ``Args:`` entry, which names the mode that takes it."""
    from syncreward._modes import MODES

    doc = synced_reward.__doc__ or ""
    for name, impl in MODES.items():
        for o in impl.options:
            assert re.search(rf"^\s+{o.name}: with ``mode=\"{name}\"``", doc, re.M), o.name


def test_mode_names_for_the_type_checker_are_the_registry() -> None:
    import typing

    from syncreward._modes import MODES, GatherModeName, ModeName
    from syncreward._modes._base import GatherMode

    assert typing.get_args(ModeName) == tuple(MODES)
    assert typing.get_args(GatherModeName) == tuple(n for n, m in MODES.items() if isinstance(m, GatherMode))
