"""The modes, by name: who scores which samples, and how inputs and results move (one file each).

Adding a built-in mode is its file (a ``Mode`` subclass: see ``_base``) and its line in :data:`MODES`,
with its name in :data:`ModeName` (the type checker's copy of the registry's keys, checked against it by
``tests/test_decorator.py``) -- and in :data:`GatherModeName` too if it gathers the whole batch
(``GatherMode``: it can then run a reward group). A mode written elsewhere (a test's) is registered with
:func:`register` (a private seam: the contract is ``_base``'s and may change).

A reward group's mode (``group.GroupMode``, made by ``synced_rewards``) is not in the registry: it wraps
the gathering mode its members name.
"""

from __future__ import annotations

from typing import Any

from .._options import GatherModeName, ModeName
from ._base import Mode
from .main import MainMode
from .replicate import ReplicateMode
from .shard import ShardMode

__all__ = ["MODES", "GatherModeName", "Mode", "ModeName", "register"]

MODES: dict[str, Mode[Any]] = {
    "main": MainMode(),
    "replicate": ReplicateMode(),
    "shard": ShardMode(),
}


def register(mode: Mode[Any]) -> Mode[Any]:
    """Make ``mode`` a ``mode=`` choice under its ``name`` (a name already taken is refused); return it.

    An option it declares under another mode's option's name must be declared alike (type and default):
    the decorator's keywords are shared.
    """
    if not mode.name or mode.name in MODES:
        raise ValueError(f"a mode needs a name that no mode has yet, not {mode.name!r} (taken: {tuple(MODES)})")
    taken = {o.name: (o.type, o.default) for m in MODES.values() for o in m.options}
    clash = sorted(o.name for o in mode.options if taken.get(o.name, (o.type, o.default)) != (o.type, o.default))
    if clash:
        raise ValueError(f"mode {mode.name!r} declares options another mode declares otherwise: {clash}")
    MODES[mode.name] = mode
    return mode
