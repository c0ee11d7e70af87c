"""A synced function's options: their one declaration, with their defaults.

``synced_reward`` and ``synced_rewards`` spell the options out in their signatures (users, IDEs and type
checkers read those); ``tests/test_decorator.py`` checks that every signature names these fields with
these defaults, so the two cannot drift apart. Each mode checks the options that are its own
(``Mode.check``); the decorator checks the rest.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

__all__ = ["DEFAULT_TIMEOUT", "MAX_TIMEOUT", "Options"]

DEFAULT_TIMEOUT = 1800.0
"""Seconds a rank waits for the others in one exchange step (torch.distributed's default, 30 minutes)."""
MAX_TIMEOUT = 1e7
"""The longest ``timeout`` accepted (about 115 days): longer waits overflow the transports' clocks."""


@dataclass(frozen=True)
class Options:
    """The options of ``synced_reward`` (see its docstring for what each means)."""

    mode: str = "main"
    backend: Any = "auto"  # a backend name or a Backend object
    timeout: float = DEFAULT_TIMEOUT
    group_size: int | None = None
    group_by: str | None = None
    include: Collection[str] | str | None = None
    exclude: Collection[str] | str = ()
    shared: Collection[str] | str = ()
    allow_pickle: bool = False
    process_group: Any = None
