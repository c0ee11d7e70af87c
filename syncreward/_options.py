"""A synced function's options: their one declaration, with their defaults.

``synced_reward`` and ``synced_rewards`` spell the options out in their signatures (users, IDEs and type
checkers read those); ``tests/test_decorator.py`` checks that every signature names these fields with
these types and defaults, so the two cannot drift apart. They are checked in one place, at decoration
time (``_decorator._given``), which asks the chosen mode about the options that are its own
(``Mode.check``).
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
    group_size: int | None = None
    group_by: str | None = None
    include: Collection[str] | str | None = None
    exclude: Collection[str] | str = ()
    shared: Collection[str] | str = ()
    allow_pickle: bool = False
    process_group: Any = None
