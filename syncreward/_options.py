"""A synced function's options: their one declaration, with their defaults.

The options every mode takes are this dataclass's fields; the options only one mode takes (``shard``'s
``group_size``, ``group_by``) are declared by that mode (``Mode.options``: name, type, default, check)
and kept here as ``mode_options``, the given ones only. ``synced_reward`` and ``synced_rewards`` spell
both kinds out in their signatures (users, IDEs and type checkers read those); ``tests/test_decorator.py``
checks that every signature names these fields and the registered modes' declared options, with their
types and defaults, so they cannot drift apart. They are checked in one place, at decoration time
(``_decorator._given``).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .backends import Backend

__all__ = ["DEFAULT_TIMEOUT", "MAX_TIMEOUT", "GatherModeName", "ModeName", "Options"]

ModeName = Literal["main", "replicate", "shard"]
"""The modes' names, for the type checker (the registry is ``_modes.MODES``; a test checks they agree)."""
GatherModeName = Literal["main", "replicate"]
"""The names of the modes that gather the whole batch (``GatherMode``), which can run a reward group."""

DEFAULT_TIMEOUT = 1800.0
"""Seconds one synced call may take on a rank, from its start to its end (torch.distributed's default, 30 minutes)."""
MAX_TIMEOUT = 1e7
"""The longest ``timeout`` accepted (about 115 days): longer waits overflow the transports' clocks."""


@dataclass(frozen=True)
class Options:
    """The options of ``synced_reward`` (see its docstring for what each means)."""

    mode: ModeName = "main"
    backend: str | Backend = "auto"
    timeout: float = DEFAULT_TIMEOUT
    include: Collection[str] | str | None = None
    exclude: Collection[str] | str = ()
    shared: Collection[str] | str = ()
    allow_pickle: bool = False
    process_group: Any = None
    mode_options: tuple[tuple[str, Any], ...] = ()  # the chosen mode's own options given (not their defaults)
