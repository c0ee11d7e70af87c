"""The modes, by name: who scores which samples, and how inputs and results move (one file each)."""

from __future__ import annotations

from ._base import Mode
from .main import MainMode
from .replicate import ReplicateMode
from .shard import ShardMode

__all__ = ["MODES", "Mode"]

MODES: dict[str, Mode] = {m.name: m for m in (MainMode(), ReplicateMode(), ShardMode())}
