"""syncreward: reward functions that see the whole batch in SPMD trainers.

``@synced_reward`` gathers a reward function's per-sample inputs across ranks in rank order, scores the
function once on the global batch, and returns each rank exactly its own slice.
"""

from ._binding import NotSynced
from ._decorator import synced_reward, synced_rewards
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
    "UnsupportedTypeError",
    "__version__",
    "resolve_backend",
    "synced_reward",
    "synced_rewards",
]
