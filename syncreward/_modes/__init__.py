"""The modes, by name: who scores which samples, and how inputs and results move (one file each).

Adding a mode is its file (a ``Mode`` subclass: see ``_base``) and its line in :data:`MODES`, with its
name in :data:`ModeName` (the type checker's copy of the registry's keys, checked against it by
``tests/test_decorator.py``) -- and in :data:`GatherModeName` too if it gathers the whole batch
(``GatherMode``: it can then run a reward group).

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

__all__ = ["MODES", "GatherModeName", "Mode", "ModeName"]

MODES: dict[str, Mode[Any]] = {
    "main": MainMode(),
    "replicate": ReplicateMode(),
    "shard": ShardMode(),
}
