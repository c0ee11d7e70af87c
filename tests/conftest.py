from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# run_ranks forks the ranks of most tests from a fork server that imported torch once (a tenth of a second
# per test instead of seconds). Forked ranks share one str hash seed; test_distributed.py keeps spawned ranks,
# each with its own, as real ranks have. A value set outside (SYNCREWARD_START_METHOD=spawn) wins.
os.environ.setdefault("SYNCREWARD_START_METHOD", "forkserver")
# One thread per rank process (several ranks share a few cores), for the whole session: the fork server starts
# with it, and a rank whose start-up variables differ from the server's would be spawned.
os.environ["OMP_NUM_THREADS"] = "1"

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
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
