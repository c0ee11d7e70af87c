"""The Ray backend: ranks are Ray actors (or tasks) in a named group of known size.

Each member calls :func:`join` once with the group's name, its rank and the group's size, then makes
synced calls with ``backend="ray"`` (or passes the returned backend object)::

    from syncreward.backends.ray import join

    @ray.remote
    class Worker:
        def __init__(self, rank, world_size):
            join("rewards", rank, world_size)

        def step(self, completions):
            return my_synced_reward(completions)   # @synced_reward(backend="ray")

Mechanism. The group's traffic goes through one *coordinator*: an async, named Ray actor
(``syncreward:<group>:<job id>`` in namespace ``syncreward``, created race-free with
``get_if_exists=True`` by whichever member joins first; ``num_cpus=0``; its classes, in
:mod:`syncreward.backends._ray_coordinator`, travel to it by value, so its own code imports neither
syncreward nor torch and it is quick to start; Ray does load there the class of each member actor whose
handle it holds, with that class's module). Every collective is one actor call per member: the member
sends its bytes and gets back, in one reply, exactly the bytes addressed to it. The coordinator keeps a
slot per (channel, operation index); a slot holds the members' submissions until all have arrived,
hands every member its part, and is dropped once every member has taken it. Because the coordinator is
async, a waiting member costs it nothing, and channels 0 and 1 are independent slots, so interleaved
operations of concurrent ``async`` synced calls never block each other.

Only bytes travel: the int64 header rows and the uint8 buffers produced by syncreward's codec, as
``bytes`` objects (or, from 1 MiB, as flat uint8 numpy arrays, which Ray moves through its object store
without copies). Ray serialises those without running any user code, and the codec never runs code
from a payload unless ``allow_pickle=True``.

Failures:

* a member that does not arrive within ``timeout``: the coordinator knows exactly who has submitted,
  so every waiting member raises :class:`~syncreward.SyncTimeoutError` naming the missing ranks;
* a member actor that dies: the coordinator keeps one outstanding no-op call (``__ray_ready__``) per
  member actor on a weak handle; Ray fails it as soon as the actor is dead, and every waiting member
  raises :class:`~syncreward.CommunicationError` at once. Members that are not actors (tasks, a driver)
  send a heartbeat every few seconds instead and count as dead after a minute of silence;
* the coordinator itself dies: the members' pending calls fail, and they raise ``CommunicationError``;
* every later call on a member after any of these raises :class:`~syncreward.GroupBrokenError`, and
  so does a late member arriving at a group that has already broken.

The coordinator is *detached* (so it does not die with whichever member created it), and removes
itself once no member has been joined for a few seconds: members :meth:`RayBackend.leave`, die, or
the job ends (its actors die with the driver). :func:`destroy` removes it at once.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any, NoReturn

import numpy as np

try:
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError, RayError
except ImportError as e:  # pragma: no cover - exercised only without ray
    raise ImportError(
        "backend='ray' needs the ray package. HINT: pip install ray "
        "(or, in a checkout of syncreward, pip install -e '.[ray]')"
    ) from e

from .._errors import (
    BackendError,
    CommunicationError,
    GroupBrokenError,
    SyncTimeoutError,
    first_line,
    timeout_message,
)
from ._ray_coordinator import (
    ALL_TO_ALL,
    BROKEN,
    FAILED,
    GATHER,
    OK,
    TIMEOUT,
    ZERO_COPY_BYTES,
    coordinator_class,
)
from ._waiting import given

__all__ = ["RayBackend", "current_backend", "destroy", "join", "joined_backends"]

log = logging.getLogger(__name__)

_HEARTBEAT_S = 2.0  # how often a member that is not an actor tells the coordinator it is alive
_REPLY_MARGIN_S = 30.0  # a member waits this much longer than ``timeout`` for the coordinator's reply
_JOIN_TIMEOUT_S = 120.0

_NAMESPACE = "syncreward"  # a named namespace: detached actors in a job's anonymous one draw a warning


def _actor_name(group: str) -> str:
    return f"syncreward:{group}:{ray.get_runtime_context().get_job_id()}"


# ============================================================================================ failure table
# How a failed exchange becomes a syncreward error: the one mapping, applied by RayBackend._failure. A
# failure is keyed by what the lower layer gives:
#
# * an exception type that ``ray.get`` raised: the first key it is an instance of wins, so a subclass goes
#   above its base (GetTimeoutError and RayActorError are RayErrors);
# * a status the coordinator replied with (its data is the reason it gives, or ``(missing, reason)``);
# * a state of this member: ``_UNUSABLE`` (an earlier failure broke the group) and ``_WRONG_SIZE`` (the
#   reply has another size than the member expects).
#
# Each row gives the error class, what later calls on this member say broke the group (``_broken``), and
# the message. Templates may use {group}, {detail} (the first line of the exception, or the reason),
# {reply_s} (how long the member waited for the coordinator's reply) and {timeout_message} (the shared
# words of a timeout that names the missing ranks, ``_errors.timeout_message``). The words say what
# happened in the group; the session adds which call of which function, on which rank.
#
# To add a row: add the key (an exception type is caught automatically) with its error class and two
# templates.

_UNUSABLE, _WRONG_SIZE = "unusable", "wrong size"
_HINT_RESTART = "HINT: restart the group's actors, or join a group with a new name."

_FAILURES: dict[type[BaseException] | str, tuple[type[CommunicationError], str, str]] = {
    GetTimeoutError: (
        SyncTimeoutError,
        "the group's coordinator did not reply",
        "the coordinator of Ray group {group!r} did not reply within {reply_s:g}s. HINT: the coordinator actor is "
        "overloaded or its node is unreachable; the group is now unusable.",
    ),
    RayActorError: (
        CommunicationError,
        "the group's coordinator actor died",
        "Ray group {group!r}: the coordinator actor died ({detail}). HINT: its node may have failed or it was "
        "killed (ray.kill / destroy()); the group is now unusable.",
    ),
    RayError: (
        CommunicationError,
        "Ray failed: {detail}",
        "Ray failed for group {group!r}: {detail}. The group is now unusable.",
    ),
    TIMEOUT: (SyncTimeoutError, "{detail}", "{timeout_message}"),
    BROKEN: (
        GroupBrokenError,
        "{detail}",
        "Ray group {group!r} broke before this rank arrived ({detail}). " + _HINT_RESTART,
    ),
    FAILED: (  # also the row of ERROR (the coordinator refused the exchange) and of any other status
        CommunicationError,
        "{detail}",
        "Ray group {group!r} failed: {detail}. HINT: see the failed member's log (an exception, OOM kill or node "
        "failure); the group is now unusable.",
    ),
    _UNUSABLE: (
        GroupBrokenError,
        "{detail}",
        "Ray group {group!r} is unusable after an earlier failure ({detail}). " + _HINT_RESTART,
    ),
    _WRONG_SIZE: (
        CommunicationError,
        "a member received {detail}",
        "this member of Ray group {group!r} received {detail}. HINT: the members disagree about the data they "
        "send; make every member run the same syncreward version.",
    ),
}
_RAISED = tuple(key for key in _FAILURES if isinstance(key, type))  # what _exchange catches from ray.get


# ============================================================================================ member side


class RayBackend:
    """One member of a Ray group: implements :class:`~syncreward.Backend` through the group's coordinator.

    Create it with :func:`join` (which also makes it this process's ``backend="ray"``), not directly.
    Leave the group with :meth:`leave` (or use the backend as a context manager) when this process
    stops making synced calls for the group, e.g. at the end of a Ray *task*.
    """

    name = "ray"

    def __init__(self, group: str, rank: int, world_size: int, coordinator: Any, token: str, is_actor: bool) -> None:
        self.group = group
        self._rank = rank
        self._world_size = world_size
        self._coord = coordinator
        self._token = token
        self._is_actor = is_actor
        self._broken: str | None = None

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def __repr__(self) -> str:
        state = f", broken={self._broken!r}" if self._broken else ""
        return f"RayBackend(group={self.group!r}, rank={self._rank}, world_size={self._world_size}{state})"

    def __enter__(self) -> RayBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.leave()

    # ------------------------------------------------------------------------------------ collectives

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        payload = np.ascontiguousarray(row, dtype="<i8").tobytes()
        data = self._exchange(channel, GATHER, payload, None, timeout)
        if len(data) != len(payload) * self._world_size:
            self._fail_protocol(len(data), len(payload) * self._world_size)
        return np.frombuffer(data, dtype="<i8").reshape(self._world_size, -1).astype(np.int64)

    def all_to_all(
        self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], *, channel: int, timeout: float
    ) -> np.ndarray:
        counts = [int(c) for c in send_counts]
        buf = np.ascontiguousarray(send, dtype=np.uint8).reshape(-1)
        payload = buf if buf.nbytes >= ZERO_COPY_BYTES else buf.tobytes()
        data = self._exchange(channel, ALL_TO_ALL, payload, counts, timeout)
        want = int(sum(recv_counts))
        if len(data) != want:
            self._fail_protocol(len(data), want)
        return np.frombuffer(data, dtype=np.uint8)

    def _exchange(self, channel: int, kind: int, payload: Any, counts: list[int] | None, timeout: float) -> Any:
        if self._broken is not None:
            raise self._failure(_UNUSABLE, self._broken)
        try:
            said = given(timeout)  # what a timeout names: the call's timeout=, not the seconds left (_waiting)
            ref = self._coord.exchange.remote(self._rank, self._token, channel, kind, payload, counts, timeout, said)
            status, data = ray.get(ref, timeout=timeout + _REPLY_MARGIN_S if timeout < 1e9 else None)
        except _RAISED as e:
            raise self._failure(next(k for k in _RAISED if isinstance(e, k)), first_line(e), timeout=timeout) from e
        if status == OK:
            return data
        missing, reason = data if status == TIMEOUT else ((), data)
        raise self._failure(status if status in _FAILURES else FAILED, str(reason), missing, timeout)

    def _fail_protocol(self, got: int, want: int) -> NoReturn:
        raise self._failure(_WRONG_SIZE, f"{got} bytes where it expected {want}")

    def _failure(
        self, key: type[BaseException] | str, detail: str, missing: Sequence[int] = (), timeout: float = 0.0
    ) -> CommunicationError:
        """The error of the ``_FAILURES`` row ``key``; it also marks this member unusable from now on."""
        error, broken, template = _FAILURES[key]
        fields = {
            "group": self.group,
            "detail": detail,
            "reply_s": timeout + _REPLY_MARGIN_S,
            "timeout_message": timeout_message(missing, given(timeout), of=f" of Ray group {self.group!r}"),
        }
        self._broken = broken.format(**fields)
        message = template.format(**fields)
        return error(message, missing) if issubclass(error, SyncTimeoutError) else error(message)

    # ------------------------------------------------------------------------------------ membership

    def leave(self) -> None:
        """Leave the group: this object (and ``backend="ray"`` for it) stops working in this process.

        Call it when this process makes no more synced calls for the group (the end of a Ray task, or
        before killing the actor early). The coordinator removes itself once every member has left.
        """
        with _lock:
            key = (self.group, self._rank)
            if _joined.get(key) is self:
                del _joined[key]
        if self._broken is None:
            self._broken = "this member left the group"
        try:
            ray.get(self._coord.leave.remote(self._rank, self._token), timeout=10)
        except Exception:  # the coordinator is gone already
            log.debug("leave(): coordinator of %r unreachable", self.group, exc_info=True)


_lock = threading.Lock()
_joined: dict[tuple[str, int], RayBackend] = {}
_heartbeat_thread: threading.Thread | None = None


def _heartbeat_loop() -> None:
    global _heartbeat_thread
    while True:
        with _lock:
            members = [b for b in _joined.values() if not b._is_actor]
            if not members or not ray.is_initialized():
                _heartbeat_thread = None
                return
        for b in members:
            try:
                b._coord.heartbeat.remote(b.rank, b._token)
            except Exception:  # ray shut down, or the coordinator is gone: the exchange will say so
                log.debug("heartbeat to %r failed", b.group, exc_info=True)
        time.sleep(_HEARTBEAT_S)


def join(
    group: str,
    rank: int,
    world_size: int,
    *,
    timeout: float = _JOIN_TIMEOUT_S,
    _settings: dict[str, float] | None = None,
) -> RayBackend:
    """Join this process to a named Ray group as ``rank`` of ``world_size``; return its backend.

    Call it once in each member (an actor's ``__init__`` is a good place) before the first synced call.
    Afterwards ``@synced_reward(backend="ray")`` (and ``backend="auto"``, when this is the only group this
    process joined and torch.distributed is not initialised) uses this group. Joining the same group and
    rank again in the same process returns the same object. Members need not join at the same time:
    the first synced call waits for the others (bounded by its ``timeout``).

    Args:
        group: the group's name; members of one group must be in the same Ray job.
        rank: this member's rank, ``0 <= rank < world_size``. Batches are concatenated in rank order and
            rank 0 scores in ``mode="main"``.
        world_size: the number of members.
        timeout: seconds to wait for the coordinator actor to be created and to answer.

    Returns:
        The ``RayBackend`` of this member (also usable as ``synced_reward(backend=...)``).

    Raises:
        BackendError: Ray is not initialised, the arguments are invalid, the group exists with another
            size, or this rank is already joined by another live process.
        GroupBrokenError: the group already broke (a member died or timed out); use a new name.
    """
    if not isinstance(group, str) or not group:
        raise BackendError(f"group must be a non-empty string, not {group!r}")
    if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
        raise BackendError(f"need 0 <= rank < world_size, got rank={rank!r}, world_size={world_size!r}")
    if not ray.is_initialized():
        raise BackendError(
            "join() needs a running Ray: call it inside a Ray actor or task, or after ray.init() in the driver"
        )
    with _lock:
        existing = _joined.get((group, rank))
    if existing is not None:
        if existing.world_size != world_size:
            raise BackendError(
                f"this process already joined group {group!r} as rank {rank} of {existing.world_size}, "
                f"not of {world_size}"
            )
        return existing

    ctx = ray.get_runtime_context()
    is_actor = ctx.get_actor_id() is not None
    actor = ctx.current_actor if is_actor else None  # a weak handle: the coordinator does not keep us alive
    token = uuid.uuid4().hex
    settings = dict(_settings or {})
    deadline = time.monotonic() + timeout
    while True:
        coord = (
            coordinator_class()
            .options(
                name=_actor_name(group),
                namespace=_NAMESPACE,
                get_if_exists=True,
                lifetime="detached",
                num_cpus=0,
                max_restarts=0,
                max_concurrency=max(1000, 4 * world_size + 16),
            )
            .remote(group, world_size, settings)
        )
        try:
            status, message = ray.get(
                coord.register.remote(rank, world_size, token, actor), timeout=max(deadline - time.monotonic(), 1.0)
            )
            break
        except RayActorError:  # caught a coordinator that was removing itself; make a fresh one
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)
        except GetTimeoutError as e:
            raise BackendError(f"the coordinator of Ray group {group!r} did not answer within {timeout:.0f}s") from e
    if status == BROKEN:
        raise GroupBrokenError(
            f"Ray group {group!r} is broken ({message}). HINT: join a group with a new name, or remove the old one "
            "with syncreward.backends.ray.destroy()."
        )
    if status != OK:
        raise BackendError(f"cannot join Ray group {group!r}: {message}")
    backend = RayBackend(group, rank, world_size, coord, token, is_actor)
    global _heartbeat_thread
    with _lock:
        _joined[(group, rank)] = backend
        if not is_actor and _heartbeat_thread is None:
            _heartbeat_thread = threading.Thread(target=_heartbeat_loop, name="syncreward-ray-heartbeat", daemon=True)
            _heartbeat_thread.start()
    return backend


# ``_settings`` (test-only knobs) is not part of the API: help() and inspect.signature() show join without it
_signature = inspect.signature(join)
join.__signature__ = _signature.replace(  # type: ignore[attr-defined]
    parameters=[p for p in _signature.parameters.values() if not p.name.startswith("_")]
)


def joined_backends() -> list[RayBackend]:
    """The Ray groups this process has joined and not left."""
    if not _joined:  # the common case, checked on every backend="auto" call: no lock needed
        return []
    with _lock:
        return list(_joined.values())


def current_backend() -> RayBackend:
    """The backend ``backend="ray"`` uses: the one group this process joined.

    Raises:
        BackendError: this process joined no group, or several (then pass the backend object instead).
    """
    members = joined_backends()
    if len(members) == 1:
        return members[0]
    if not members:
        raise BackendError(
            "backend='ray' needs this process to be a member of a Ray group. HINT: call "
            "syncreward.backends.ray.join(group, rank, world_size) in every member (e.g. in the actor's __init__) "
            "before the first synced call."
        )
    raise BackendError(
        f"this process joined several Ray groups ({', '.join(repr(b) for b in members)}), so backend='ray' is "
        "ambiguous. HINT: pass the backend object returned by join() as synced_reward(backend=...)."
    )


def destroy(group: str) -> bool:
    """Remove a group's coordinator now (from any process of the job); return whether one existed.

    Members waiting in an exchange raise :class:`~syncreward.CommunicationError`. Not needed in normal
    use: the coordinator removes itself when every member has left, died or ended with the job.
    """
    try:
        handle = ray.get_actor(_actor_name(group), namespace=_NAMESPACE)
    except ValueError:
        return False
    ray.kill(handle, no_restart=True)
    return True
