"""syncreward: reward functions that see the whole batch in SPMD trainers.

``@synced_reward`` gathers a reward function's per-sample inputs across ranks in rank order, scores the
function once on the global batch, and returns each rank exactly its own slice. ``synced_rewards``
does the same for several rewards of a step, whose shared columns then travel once.

In one process (no ``torch.distributed``, accelerate or Ray job) the function is simply called (its result
checked as on several ranks), so the same code runs in a unit test; under ``torchrun`` or ``accelerate
launch`` each rank passes its own completions and gets back the rewards of those completions, computed
over every rank's:

>>> from syncreward import synced_reward
>>> @synced_reward
... def centred_length(completions, **kwargs):
...     mean = sum(map(len, completions)) / len(completions)
...     return [len(c) - mean for c in completions]
>>> centred_length(["a", "abc"])
[-1.0, 1.0]

``syncreward.testing.run_threads(body, world_size)`` runs a body on simulated ranks in one process.
Errors derive from ``SyncRewardError``; the documentation (guides, API reference, troubleshooting) is
in the repository's ``docs/``.
"""

from ._binding import NotSynced
from ._decorator import SyncedReward, synced_reward, synced_rewards
from ._errors import (
    BackendError,
    CodecError,
    ColumnNotSyncedError,
    CommunicationError,
    GroupBrokenError,
    InputError,
    MismatchError,
    RemoteError,
    ResultLengthError,
    SyncRewardError,
    SyncTimeoutError,
    UnsupportedTypeError,
)
from .backends import Backend, resolve_backend

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendError",
    "CodecError",
    "ColumnNotSyncedError",
    "CommunicationError",
    "GroupBrokenError",
    "InputError",
    "MismatchError",
    "NotSynced",
    "RemoteError",
    "ResultLengthError",
    "SyncRewardError",
    "SyncTimeoutError",
    "SyncedReward",
    "UnsupportedTypeError",
    "__version__",
    "resolve_backend",
    "synced_reward",
    "synced_rewards",
]
