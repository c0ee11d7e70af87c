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

import dataclasses
import keyword
from typing import Any

from .._options import GatherModeName, ModeName, Options
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


_GENERAL = frozenset(f.name for f in dataclasses.fields(Options))  # the options every mode takes (and mode_options)


def register(mode: Mode[Any]) -> Mode[Any]:
    """Make ``mode`` a ``mode=`` choice under its ``name`` (a name already taken is refused); return it.

    Its own options need keyword names that no option every mode takes has (``timeout``, ``mode``, ...).

    An option it declares under another mode's option's name must be declared alike (type and default):
    the decorator's keywords are shared.
    """
    if not mode.name or mode.name in MODES:
        raise ValueError(f"a mode needs a name that no mode has yet, not {mode.name!r} (taken: {tuple(MODES)})")
    for o in mode.options:  # a keyword of its own: one named like an option every mode takes would claim it
        if not o.name.isidentifier() or keyword.iskeyword(o.name) or o.name in _GENERAL:
            raise ValueError(
                f"mode {mode.name!r} declares an option named {o.name!r}: a mode's own option needs a keyword name "
                f"that no option every mode takes has ({', '.join(sorted(_GENERAL))})"
            )
    taken = {o.name: (o.type, o.default) for m in MODES.values() for o in m.options}
    clash = sorted(o.name for o in mode.options if taken.get(o.name, (o.type, o.default)) != (o.type, o.default))
    if clash:
        raise ValueError(f"mode {mode.name!r} declares options another mode declares otherwise: {clash}")
    MODES[mode.name] = mode
    return mode
