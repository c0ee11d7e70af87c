"""A backend name is one registry line: what accepts, dispatches and lists names is derived from it.

Also: the backends package reaches nothing above it; what the layers above hold per backend goes
through its release hooks. No ranks needed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

import syncreward
from syncreward import BackendError, backends, synced_reward
from syncreward import _session as session_module
from syncreward.backends import LocalBackend, _cache, _resolve, resolve_backend
from syncreward.backends._resolve import BACKEND_NAMES

DOCS = Path(__file__).parent.parent / "docs"


def reward(completions: Any, **kwargs: Any) -> list[float]:
    return [0.0 for _ in completions]


def test_registry_keeps_the_documented_names_in_order() -> None:
    assert BACKEND_NAMES == ("auto", "local", "torch", "accelerate", "ray")
    assert tuple(_resolve._FACTORIES) == BACKEND_NAMES


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("backends module docstring", backends.__doc__),
        ("synced_reward docstring", synced_reward.__doc__),
        ("docs/concepts.md", (DOCS / "concepts.md").read_text()),
    ],
)
def test_docs_name_every_registered_backend(where: str, text: str | None) -> None:
    assert text is not None
    missing = [name for name in BACKEND_NAMES if f'"{name}"' not in text]
    assert not missing, f"{where} does not name {missing}"


def test_backends_module_docstring_lists_only_registered_names() -> None:
    assert backends.__doc__ is not None
    first_step = backends.__doc__.split("1. ")[1].split("2. ")[0]
    assert set(re.findall(r'``"(\w+)"``', first_step)) == set(BACKEND_NAMES) - {"auto"}


@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_every_registered_name_is_accepted_by_the_decorator(name: str) -> None:
    synced_reward(backend=name)(reward)


def test_unknown_name_is_refused_at_decoration_naming_every_registered_backend() -> None:
    with pytest.raises(ValueError, match="unknown backend 'nccl'") as info:
        synced_reward(backend="nccl")(reward)
    assert str(info.value) == (
        "unknown backend 'nccl'; expected one of ('auto', 'local', 'torch', 'accelerate', 'ray') or a Backend object"
    )


def test_unknown_name_is_refused_by_resolve_backend_in_the_decorator_words() -> None:
    with pytest.raises(BackendError) as info:
        resolve_backend("nccl")
    with pytest.raises(ValueError) as at_decoration:
        synced_reward(backend="nccl")(reward)
    assert str(info.value) == str(at_decoration.value)


def test_resolve_backend_calls_the_registered_factory_with_the_options(monkeypatch: pytest.MonkeyPatch) -> None:
    made = LocalBackend()
    calls: list[Any] = []
    group = object()
    monkeypatch.setitem(_resolve._FACTORIES, "local", lambda process_group: calls.append(process_group) or made)
    assert resolve_backend("local", group) is made
    assert calls == [group]


def test_auto_and_local_resolve_to_the_local_backend_in_one_process() -> None:
    assert resolve_backend("auto") is resolve_backend("local")
    assert resolve_backend("auto").world_size == 1


def test_release_calls_the_backend_then_every_release_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[Any] = []

    class Released(LocalBackend):
        def release(self) -> None:
            events.append("released")

    monkeypatch.setattr(_cache, "_release_hooks", list(_cache._release_hooks))
    _cache.on_release(lambda b: events.append(("hook", b)))
    backend = Released()
    _cache.release(backend)
    assert events == ["released", ("hook", backend)]


def test_release_drops_the_backends_session() -> None:
    backend = LocalBackend()
    session_module.session_for(backend, "reward")
    assert backend in session_module._sessions
    _cache.release(backend)
    assert backend not in session_module._sessions


def test_the_session_registers_its_release_hook() -> None:
    assert session_module._forget_session in _cache._release_hooks


@pytest.mark.parametrize("path", sorted(Path(backends.__file__).parent.glob("*.py")), ids=lambda p: p.name)
def test_backends_reach_nothing_above_them(path: Path) -> None:
    """Imports from the parent package are the errors module only; no ``sys.modules`` look-up of a layer above."""
    tree = ast.parse(path.read_text())
    upward = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level >= 2]
    assert set(upward) <= {"_errors"}, upward
    named = [
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and re.fullmatch(r"syncreward\.[\w.]+", n.value)
    ]
    assert all(name.startswith("syncreward.backends") for name in named), named


def test_package_exports_resolve_backend_from_the_registry_module() -> None:
    assert syncreward.resolve_backend is resolve_backend


@pytest.mark.parametrize("module", ["testing.py", "_identity.py", "_session.py", "_decorator.py", "_lifecycle.py"])
def test_modules_above_the_backends_use_only_their_public_seams(module: str) -> None:
    """No private name of the backends package is imported or read from above it (its seams are public names)."""
    tree = ast.parse((Path(syncreward.__file__).parent / module).read_text())
    private = [
        f"{n.module}.{a.name}"
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("backends")
        for a in n.names
        if a.name.startswith("_")
    ]
    private += [
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute)
        and isinstance(n.value, ast.Name)
        and "backends" in n.value.id
        and n.attr.startswith("_")
    ]
    assert private == [], private


def test_optional_backend_methods_are_capabilities_decided_once_per_class() -> None:
    from syncreward.backends import _protocol

    class Plain(LocalBackend):
        pass

    class Full(LocalBackend):
        def scatter(self, send: Any, size: int, *, root: int, channel: int, timeout: float) -> Any:
            return send

        def abandon(self, reason: str) -> None:
            pass

        def release(self) -> None:
            pass

    plain, full = Plain(), Full()
    assert (_protocol.scatters(plain), _protocol.abandons(plain), _protocol.releases(plain)) == (None, None, None)
    assert (_protocol.scatters(full), _protocol.abandons(full), _protocol.releases(full)) == (full, full, full)
    assert _protocol._capabilities[(Full, _protocol.Scatters)] is True  # the class answers for its objects
    assert _protocol._capabilities[(Plain, _protocol.Scatters)] is False  # ... and where it has none,
    plain.scatter = full.scatter  # type: ignore[attr-defined]  # the object itself is asked
    assert _protocol.scatters(plain) is plain
    assert _protocol.scatters(Plain()) is None
