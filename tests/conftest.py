from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

_DIST_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
)


@pytest.fixture(autouse=True)
def _clean_distributed_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Strip launcher variables so a test never inherits (or leaks) a distributed setup."""
    for key in list(os.environ):
        if key in _DIST_ENV or key.startswith("ACCELERATE_"):
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
