"""The accelerate backend: ranks are the processes of an ``accelerate launch`` job (``PartialState``)."""

from __future__ import annotations

import os
from typing import Any

from .._errors import BackendError
from .local import LocalBackend
from .torch_distributed import TorchDistributedBackend

__all__ = ["AccelerateBackend", "accelerate_backend"]


def _partial_state() -> Any:
    try:
        from accelerate import PartialState
    except ImportError as e:
        raise ImportError(
            "backend='accelerate' needs the accelerate package. HINT: pip install accelerate "
            "(or, in a checkout of syncreward, pip install -e '.[accelerate]')"
        ) from e
    return PartialState()


class AccelerateBackend(TorchDistributedBackend):
    """Exchange between the processes of an accelerate job.

    accelerate (DDP, FSDP, DeepSpeed, MULTI_CPU) runs on ``torch.distributed``; this backend checks the
    job through ``accelerate.PartialState`` and then exchanges over syncreward's own gloo group, exactly
    like the ``torch`` backend, with ``PartialState().process_index`` as the rank.
    """

    name = "accelerate"

    def __init__(self, state: Any) -> None:
        kind = str(getattr(state, "distributed_type", ""))
        if "XLA" in kind or "TPU" in kind:
            raise BackendError(f"accelerate distributed_type {kind} is not supported (no torch.distributed group)")
        super().__init__(None)
        if self.rank != state.process_index or self.world_size != state.num_processes:
            raise BackendError(
                f"accelerate reports process {state.process_index}/{state.num_processes} but torch.distributed "
                f"reports {self.rank}/{self.world_size}"
            )


def accelerate_backend() -> TorchDistributedBackend | LocalBackend:
    """The backend for the current accelerate job (a local backend when it runs a single process)."""
    state = _partial_state()
    if state.num_processes <= 1:
        import torch.distributed as dist

        ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        env = os.environ.get("WORLD_SIZE", "1")
        ranks = max(ranks, int(env) if env.isdigit() else 1)
        if ranks > 1:  # scoring each rank alone would silently give wrong rewards
            raise BackendError(
                f"accelerate reports a single process, but this job runs {ranks} ranks (torch.distributed / "
                "WORLD_SIZE). HINT: on a CPU-only machine create the Accelerator or PartialState with cpu=True, "
                "or pass backend='torch'."
            )
        return LocalBackend()
    return AccelerateBackend(state)
