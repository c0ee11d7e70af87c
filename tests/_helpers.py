"""Helpers shared by test modules (importable from spawned ranks: tests/ is on sys.path); no test imports another."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

import syncreward


def outcome(fn: Any, *args: Any, **kwargs: Any) -> tuple[str, Any, float]:
    """Call ``fn`` and describe what happened: ``(kind, info, seconds)``.

    ``kind`` is ``"ok"`` or the exception's class name; ``info`` the return value, ``(origin_rank,
    exc_type, exc_message)`` for a RemoteError, the missing ranks for a SyncTimeoutError, else the message.
    """
    t0 = time.perf_counter()
    try:
        value = fn(*args, **kwargs)
    except Exception as e:
        info: Any = str(e)
        if isinstance(e, syncreward.RemoteError):
            info = (e.origin_rank, e.exc_type, e.exc_message)
        elif isinstance(e, syncreward.SyncTimeoutError):
            info = e.missing_ranks
        return type(e).__name__, info, time.perf_counter() - t0
    return "ok", value, time.perf_counter() - t0


def same(a: Any, b: Any) -> bool:
    """Strict equality: same types all the way down (tuple vs list, bool vs int), NaN equals NaN, -0.0 != 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        if a.numel() == 0:
            return True
        if a.dtype.is_floating_point or a.dtype.is_complex:  # bit-exact, NaN payloads and -0.0 included
            a, b = (t.reshape(-1).clone(memory_format=torch.contiguous_format).view(torch.uint8) for t in (a, b))
        return bool(torch.equal(a, b))
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype.hasobject:
            return all(same(x, y) for x, y in zip(a.reshape(-1).tolist(), b.reshape(-1).tolist(), strict=True))
        return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=False))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) and same(k, kb) for k, kb in zip(a, b, strict=False))
    return bool(a == b)


@dataclass
class TrainerState:
    """Stand-in for ``transformers.TrainerState``, which TRL passes as ``trainer_state``."""

    global_step: int = 0


class Wrapping:
    """A test double around a rank's backend: the same rank and world size; subclasses change its collectives."""

    def __init__(self, inner: syncreward.Backend) -> None:
        self.inner = inner

    @property
    def rank(self) -> int:
        return self.inner.rank

    @property
    def world_size(self) -> int:
        return self.inner.world_size


class Counting(Wrapping):
    """Wraps a backend; counts collectives and the bytes this rank sends to the others."""

    def __init__(self, inner: syncreward.Backend) -> None:
        super().__init__(inner)
        self.calls = 0
        self.sent = 0

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        self.calls += 1
        self.sent += row.nbytes * (self.world_size - 1)
        return self.inner.all_gather(row, channel=channel, timeout=timeout)

    def all_to_all(
        self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], *, channel: int, timeout: float
    ) -> np.ndarray:
        self.calls += 1
        self.sent += sum(int(c) for d, c in enumerate(send_counts) if d != self.rank)
        return self.inner.all_to_all(send, send_counts, recv_counts, channel=channel, timeout=timeout)


def outputs_under_hash_seeds(body: str, seeds: Sequence[str] = ("1", "2", "3")) -> set[str]:
    """What ``body`` prints in fresh interpreters with each ``PYTHONHASHSEED``: one output means it ignores the salt.

    ``body`` runs with the package's modules importable but without its ``__init__`` (no torch imported).
    """
    package = os.path.dirname(syncreward.__file__)
    script = (
        "import sys, types\n"
        "package = types.ModuleType('syncreward')\n"
        f"package.__path__ = [{package!r}]\n"
        "sys.modules['syncreward'] = package\n" + body
    )
    seen = set()
    for seed in seeds:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        seen.add(out.stdout.strip())
    return seen
