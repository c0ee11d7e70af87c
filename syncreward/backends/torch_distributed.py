"""The torch.distributed backend: exchanges over a library-owned gloo group.

Works in any initialised ``torch.distributed`` job, gloo or NCCL. syncreward never uses the job's own
process group for its traffic: on first use it creates two gloo groups over the same ranks (one per
channel), so

* NCCL jobs need no ``torch.cuda.set_device`` dance and no CUDA tensors for object exchange;
* a long reward on the scoring rank does not trip the NCCL watchdog of the other ranks;
* the job's collectives and syncreward's cannot be interleaved into a deadlock.

Waiting is done in short slices. Between slices the backend checks an *abort* key in the job's
rendezvous store, which a rank sets as soon as its transport fails (a peer died) or it gives up
waiting, so every rank raises within a fraction of a second instead of waiting for the process-group
timeout. A rank still waiting after the first slice records in the store that it arrived; when
``timeout`` expires, the error names the ranks without such a record (after a short grace, ``_GRACE_S``,
for ranks that arrived a moment ago), so it comes at ``timeout``, not a naming period later. A rank
that starts an exchange after a long pause (longer than half the timeout) first looks at the abort key
too: the others may have given up on it while it was away, and it must raise with them rather than
complete a half-abandoned exchange.

The first synced call of a backend waits the same way before it connects the gloo groups: until every
member has recorded its arrival (``_await_members``), looking at the groups' abort record between
slices. A rank that gives up there leaves that record, so a rank reaching its first call later says
at once that the others gave up on it. A wait that lasts logs a rate-limited warning naming the ranks
not yet arrived (``_waiting``). A peer that leaves right after its part of an exchange (rank 0 exiting
with the store) is no failure of an exchange whose data arrived: a wait that meets a peer's failure
polls its work once more (:func:`_got_through`).

Every failure of the lower layer is translated in one place, the ``_FAILURES`` table applied by
:func:`_translate`, into words about the ranks; the session above (not this backend) adds which call of
which function it was, and remembers that the group broke.

Names every member agrees on
----------------------------
The two gloo groups are built directly (``ProcessGroupGloo`` over a ``PrefixStore`` of the job's
rendezvous store), not with ``dist.new_group``: torch names a locally synchronised group from its ranks
*and* the caller's own ``len(_world.pg_names)``, which differs between ranks that hold different numbers
of torch groups (a subgroup they are not members of, overlapping data-parallel groups, groups of their
own), and then the members never meet. The store prefix of a backend's groups is
``syncreward/<kind>/<scope>/<ranks>/<n>/`` (:func:`_agreed_name`), and each part is the same on every
member:

* ``kind`` (``torch`` or ``accelerate``) and ``scope`` (``world`` for ``process_group=None``, ``group``
  otherwise) come from the ``synced_reward`` declaration, which every rank runs alike;
* ``ranks`` are the group's *global* ranks in group-rank order, as torch records them for the group on
  every member (``get_process_group_ranks``);
* ``n`` counts the backends of this process that set up groups for the same (kind, scope, ranks)
  earlier *in the current job* (the counter is kept per job, i.e. per ``WORLD`` group object, and
  restarts in a re-initialised job, whose store is new). The backend cache holds one backend per (kind,
  job, process group), so a process group sets up its groups once per job; groups over other member
  sets, torch groups of any kind, and groups this rank is not a member of never move the counter. Two
  distinct process groups with the same members are told apart by ``n`` in the order of their first
  synced call, which every member makes in the same order (every rank makes the same synced calls).

Everything the groups keep in the store lives under that prefix: the arrival records of the set-up
itself (a member writes one as it starts; a member that gives up names the members without one), the
arrival records of each exchange and the abort key. So they describe *this* backend's groups: a rank that
set up the whole job's groups earlier has not thereby arrived at a subgroup's set-up.

Other ranks' state never enters the name. Nothing is registered with torch, so ``destroy_process_group``
does not know these groups: the backend cache releases them when the job's ``WORLD`` group (or the
``process_group``) object is destroyed (``backends._cache.cached``).

Leaving
-------
A process's exit never waits on a peer. Two things could make it:

* a thread waiting in an exchange. At interpreter exit the session calls :meth:`abandon` (before
  threading joins the non-daemon workers): every wait returns within one slice (``_POLL_S``), records in
  the abort key that this rank is exiting, so the peers raise at once, and raises;
* gloo's destructor. ``~ProcessGroupGloo`` joins its run-loop threads, and a thread still inside an
  abandoned collective (the rank gave up at ``timeout``, or a peer's failure was seen first) stays there
  until the peers answer or the collective's own timeout (``timeout`` + ``_GLOO_MARGIN_S``) expires:
  neither ``abort()`` nor ``shutdown()`` of a gloo group interrupts it in torch 2.13 (measured: both
  return at once and the collective still waits for its peer). So a released group whose last collective
  is still running is never destroyed while it runs: it waits in ``_abandoned`` until the collective
  ends, and at exit it is leaked on purpose (its destructor never runs; the process's end closes its
  sockets, which is what the peers see).

A rank that leaves the job says so: at interpreter exit, or when the default group is destroyed, it
writes a *left record* in the job's store (:func:`watch_job`, ``_LEFT``): why, and how many exchanges it
entered in each of its groups. A rank waiting in an exchange the leaver never entered, or for its first
synced call, reads it between slices and raises naming it. A rank whose own step fails inside an
exchange (out of memory building a buffer) tells the peers through :meth:`TorchDistributedBackend.abort`
(an ``E`` abort record), so they raise at once instead of at ``timeout``.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import functools
import logging
import math
import os
import re
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, NoReturn

import numpy as np
import torch
import torch.distributed as dist

from .._errors import (
    BackendError,
    CollectiveMismatchError,
    CommunicationError,
    SyncTimeoutError,
    collective_mismatch_message,
    first_line,
    late_message,
    left_message,
    seconds,
    timeout_message,
)
from ._waiting import WaitLog, given

__all__ = ["TorchDistributedBackend"]

log = logging.getLogger(__name__)

_POLL_S = 0.2  # how often a waiting rank looks for an abort from a peer
_NO_ARRIVAL = "0 none"  # a rank's arrival record before it waited past a first slice (exchanges count from 1)
_GRACE_S = 0.25  # after timeout=: how long a rank that gives up waits for ranks that arrived just now to report
_GLOO_MARGIN_S = 10.0  # gloo's own op timeout is ours plus this, so we always report first
_WAITED_FOR = re.compile(r"^Trank (\d+) waited [^ ]+s for rank\(s\) \[([0-9, ]*)\]")  # who waited for whom
_WORK_TIMEOUT_MESSAGE = "Operation timed out!"  # c10d::Work::wait(timeout) when the slice expires

_CPU = torch.device("cpu")  # every buffer names its device: torch.set_default_device must not move it
_ABANDON_WAIT_S = 1.0  # at exit: how long abandon() waits for the threads in this backend's exchanges to leave

# per job (its WORLD group object): how many backends set up groups for each (kind, scope, ranks) so far
_creations: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()
_creations_lock = threading.Lock()


def _agreed_name(kind: str, whole_job: bool, ranks: Sequence[int]) -> str:
    """The store prefix of a backend's gloo groups: the same on every member (see the module docstring)."""
    base = f"syncreward/{kind}/{'world' if whole_job else 'group'}/{','.join(map(str, ranks))}"
    world = dist.group.WORLD
    with _creations_lock:
        counts = _creations.get(world)
        if counts is None:
            counts = _creations[world] = {}
        n = counts.get(base, 0)
        counts[base] = n + 1
    return f"{base}/{n}"


def _setup_arrival(name: str, global_rank: int) -> str:
    """The store key a member sets when it starts setting up the groups named ``name``.

    Under the agreed name, not per job: a rank that set up an earlier backend's groups (the whole job's,
    say) has not arrived at this one's, so the rank that gives up names it.
    """
    return f"{name}/arrived-setup/{global_rank}"


_LAZY = "TORCH_GLOO_LAZY_INIT"
_lazy_lock = threading.Lock()  # the variable is process-wide: set only while one of our groups is built


def _lazy_supported() -> bool:
    """Whether this torch builds gloo groups that connect to a peer on first use (torch >= 2.8)."""
    try:
        major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (2, 8)


def _gloo_group(store: Any, rank: int, size: int, timeout: float, ranks: Sequence[int], name: str) -> Any:
    """A gloo group over ``store`` alone (torch >= 2.3 and 2.13 take ``(store, rank, size, timeout)``).

    Lazy (torch >= 2.8): it connects to a peer on the first operation that needs it, so a ``main`` rank
    that only talks to the scoring rank opens one connection. gloo reads ``TORCH_GLOO_LAZY_INIT`` when
    the group is built: it is set only then, under a lock, and restored at once -- the user's own groups
    are never made lazy by it. Older torch: every pair connects at set-up (the full mesh), which works too.
    """
    if not _lazy_supported():
        return _named(dist.ProcessGroupGloo(store, rank, size, _timedelta(timeout)), ranks, name)
    with _lazy_lock:
        before = os.environ.get(_LAZY)
        os.environ[_LAZY] = "1"
        try:
            group = dist.ProcessGroupGloo(store, rank, size, _timedelta(timeout))
        finally:
            if before is None:
                del os.environ[_LAZY]
            else:
                os.environ[_LAZY] = before
    return _named(group, ranks, name)


def _named(group: Any, ranks: Sequence[int], name: str) -> Any:
    with contextlib.suppress(Exception):  # for torch's own logs only; older torch has no such options
        options: Any = group.options
        options.global_ranks_in_group = list(ranks)
        options.group_name = name
    return group


# Released groups whose last collective is still running inside gloo (see "Leaving" in the module
# docstring): (groups, their running works). Destroyed once the works end; leaked at exit.
_abandoned: list[tuple[list[Any], list[Any]]] = []
_abandoned_lock = threading.Lock()
_exiting = False  # the interpreter is exiting: a group still running a collective is leaked, never destroyed


def _running(works: Sequence[Any]) -> list[Any]:
    """The works of ``works`` that gloo is still running."""
    running = []
    for work in works:
        try:
            done = work is None or work.is_completed()
        except Exception:
            done = True
        if not done:
            running.append(work)
    return running


def _destroy(groups: Sequence[Any]) -> None:
    """Stop gloo's threads of ``groups`` now (idle groups only: see ``_dispose``)."""
    for group in groups:
        # as destroy_process_group() does for the groups it knows: stop gloo's threads now, not in a
        # destructor that may run at interpreter teardown (where it aborts the process)
        shutdown = getattr(group, "shutdown", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):
                shutdown()


def _leak(groups: Sequence[Any]) -> None:
    """Never run the destructors of ``groups``: one more reference, never dropped (not even at teardown)."""
    for group in groups:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))


def _dispose(groups: list[Any], works: Sequence[Any]) -> None:
    """Let go of a released backend's ``groups``, whose last collectives were ``works``.

    Idle groups are destroyed now. Destroying a group that still runs a collective would wait for it
    (up to its timeout): such groups wait in ``_abandoned`` until it ends, or are leaked at exit.
    """
    running = _running(works)
    with _abandoned_lock:
        kept = [(g, w) for g, w in _abandoned if _running(w)]  # finished ones go now (below)
        done = [g for g, w in _abandoned if not _running(w)]
        if running and _exiting:
            _leak(groups)
        elif running:
            kept.append((groups, running))
        else:
            done.append(groups)
        _abandoned[:] = kept
    for gs in done:
        _destroy(gs)


def _on_exit() -> None:
    """Interpreter exit (before threading joins its non-daemon threads): from now on, leak, never wait."""
    global _exiting
    with _abandoned_lock:
        _exiting = True
        for groups, works in _abandoned:
            if _running(works):
                _leak(groups)
        _abandoned.clear()


with contextlib.suppress(RuntimeError):  # imported while the interpreter is already exiting: too late to register
    threading._register_atexit(_on_exit)  # type: ignore[attr-defined]


# ============================================================================================ leaving the job
# A rank that leaves the job (its process exits, or it destroys the default group) writes a *left record*
# in the job's store: ``syncreward/left/<global rank>``, holding why, and for each of its syncreward groups
# (by agreed name) how many exchanges it entered on each channel; ``syncreward/left`` counts the records.
# A rank waiting in an exchange the leaver never entered (or at a set-up it never started) reads it between
# slices and raises at once, naming it; a leaver that made every call it was waited for fails nobody.

_LEFT = "syncreward/left"


class _Job:
    """A job this process has seen (its ``WORLD`` group): the store to leave a record in, and the backends."""

    def __init__(self, store: Any, global_rank: int) -> None:
        self.store = store  # held so that the record can still be written once the default group is destroyed
        self.global_rank = global_rank
        self.backends: weakref.WeakSet[TorchDistributedBackend] = weakref.WeakSet()
        self.left = False


_jobs: dict[int, tuple[Any, _Job]] = {}  # id(WORLD) -> (a weak reference to WORLD, the job)
_jobs_lock = threading.Lock()


def watch_job() -> _Job | None:
    """Remember the current job (the default group), so that leaving it writes a left record; the job.

    Called when a synced reward is made or a torch backend is created, and at exit: a rank that never made
    a synced call is seen too, as long as syncreward saw its job before the default group was destroyed.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    world = dist.group.WORLD
    with _jobs_lock:
        entry = _jobs.get(id(world))
        if entry is not None and entry[0]() is world:
            return entry[1]
        store = TorchDistributedBackend._default_store()
        if store is None:
            return None
        job = _Job(store, dist.get_rank())
        key = id(world)

        def destroyed(_: Any) -> None:  # torch dropped the default group: this rank has left the job
            _leave_job(job, f"rank {job.global_rank} destroyed its process group")
            with _jobs_lock:
                if key in _jobs and _jobs[key][1] is job:
                    del _jobs[key]

        _jobs[key] = (weakref.ref(world, destroyed), job)
        return job


def _leave_job(job: _Job, why: str) -> None:
    """Write ``job``'s left record once (best effort, never waiting: the store's host may be gone), then let go."""
    if job.left:
        return
    job.left = True
    lines = [why]
    for backend in list(job.backends):
        if backend._name is not None:
            lines.append(f"{backend._name} {backend._ops[0]} {backend._ops[1]}")
    with contextlib.suppress(Exception):
        job.store.set(f"{_LEFT}/{job.global_rank}", "\n".join(lines))
        job.store.add(_LEFT, 1)
    job.store = None


def left_at_exit() -> None:
    """Interpreter exit (threading's exit hook, ``_cache``): every job this process is still in gets its left record."""
    watch_job()
    error = getattr(sys, "last_value", None)  # the main thread's uncaught exception, if that is why it ends
    with _jobs_lock:
        jobs = [job for _, job in _jobs.values()]
    for job in jobs:
        why = f"rank {job.global_rank} exited"
        if isinstance(error, BaseException):
            why += f" (an uncaught {type(error).__name__}: {first_line(error)})"
        _leave_job(job, why)


class _Left(NamedTuple):
    """A member's left record, as this backend reads it."""

    why: str
    ops: tuple[int, int] | None  # the exchanges it entered on each channel of this backend's groups (None: no groups)


def _read_left(store: Any, global_rank: int, name: str | None) -> _Left | None:
    if not store.check([f"{_LEFT}/{global_rank}"]):
        return None
    why, *groups = bytes(store.get(f"{_LEFT}/{global_rank}")).decode(errors="replace").split("\n")
    for line in groups:
        group, ops0, ops1 = line.rsplit(" ", 2)
        if group == name:
            return _Left(why, (int(ops0), int(ops1)))
    return _Left(why, None)


# ============================================================================================ failure table
# How a failure of torch.distributed / gloo becomes a syncreward error: the one mapping, applied by
# _translate. gloo reports almost every failure as a RuntimeError whose only distinguishing mark is its
# text, so a row matches an exception type *or* a substring of the lowercased message; rows are tried in
# order, the first match wins, and the last row catches everything else. The words say what happened
# between the ranks; the session adds which call it was and on which rank.
#
# To add a row: insert a _Failure above the catch-all (more specific texts before broader ones). Its
# template may use {message}, the first line of the lower layer's message.


class _Failure(NamedTuple):
    types: tuple[type[BaseException], ...]  # the lower layer's exception types this row matches
    texts: tuple[str, ...]  # ... or lowercase substrings of its message
    error: type[CommunicationError]
    template: str

    def matches(self, e: BaseException, lowered: str) -> bool:
        return isinstance(e, self.types) or any(text in lowered for text in self.texts)


_FAILURES: tuple[_Failure, ...] = (
    _Failure(
        (),
        ("too many open files",),
        CommunicationError,
        "the process ran out of file descriptors ({message}). HINT: syncreward's two gloo groups hold about "
        "2 x world_size sockets per rank (docs/scale.md): raise `ulimit -n`. The group is now unusable.",
    ),
    _Failure(
        (),
        ("connection closed by peer", "connection reset by peer"),
        CommunicationError,
        "another rank closed its connection to this one: it exited, crashed or was killed. HINT: a rank that made "
        "fewer synced calls than the others and then finished is one cause (every rank must make the same synced "
        "calls); otherwise look for a traceback or an OOM kill in the other ranks' logs. The group is now unusable.",
    ),
    _Failure(
        (TimeoutError,),
        ("timed out", "timeout"),
        SyncTimeoutError,
        "the ranks did not finish within timeout= ({message}). HINT: a rank did not arrive in time (hung, still "
        "busy, dead, or it made fewer synced calls); raise timeout= if it legitimately takes longer to get there. "
        "The group is now unusable.",
    ),
    _Failure(  # the catch-all: keep it last
        (BaseException,),
        (),
        CommunicationError,
        "the connection to the other ranks failed ({message}). HINT: a peer process probably died or was killed "
        "(look for its traceback or an OOM kill); the group is now unusable.",
    ),
)


_TIMEOUT = next(row for row in _FAILURES if row.error is SyncTimeoutError)


def _is_timeout(e: BaseException) -> bool:
    """Whether ``e`` says the lower layer timed out (the table's timeout row matches it on its own)."""
    return _TIMEOUT.matches(e, str(e).lower())


def _translate(e: BaseException) -> CommunicationError:
    """The syncreward error for a failure of torch.distributed / gloo: the first row of ``_FAILURES`` it matches."""
    lowered = str(e).lower()
    row = next(row for row in _FAILURES if row.matches(e, lowered))
    return row.error(row.template.format(message=first_line(e)))


def _error_message(reason: str) -> str:
    """What a peer raises when a rank's step failed on that rank (its ``abort`` record holds ``reason``)."""
    return (
        f"another rank failed in this exchange: {reason}. HINT: that rank's own error is in its traceback (out of "
        "memory while building a buffer is a common cause: a smaller batch per call, or more memory); its exchange "
        "was left half done, so the group is now unusable."
    )


def _mismatch_record(kinds: Mapping[int, str]) -> str:
    """The abort record of ranks met in different collectives: ``M``, then each rank's (``M0:gather 2:all_to_all``)."""
    return "M" + " ".join(f"{r}:{k}" for r, k in sorted(kinds.items()))


def _mismatch_error(record: str, rank: int, kind: str | None) -> CommunicationError:
    """What a rank raises on reading a mismatch record (:func:`_mismatch_record`) while it waits in ``kind``.

    A ``CollectiveMismatchError`` naming every rank the record names, and this one (``main``'s non-scoring
    ranks wait for their results in a scatter on the other channel: only the ranks left waiting in the
    mismatched collectives see the mismatch themselves).
    """
    try:
        kinds = {int(r): k for r, k in (item.split(":", 1) for item in record[1:].split())}
    except ValueError:  # not a record this version writes
        return CommunicationError(f"another rank reported a failure ({record[1:]}). HINT: the group is now unusable.")
    if kind is not None:
        kinds.setdefault(rank, kind)
    return CollectiveMismatchError(collective_mismatch_message(kinds))


@functools.lru_cache(maxsize=64)  # a call's few timeouts (its own, a wait's first slice): made once each
def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def _got_through(work: Any) -> bool:
    """Whether ``work`` completed after all: asked when a peer's failure, or its exit, is seen mid-wait.

    A peer that leaves right after its part of an exchange (rank 0 exiting after its last call takes the
    rendezvous store with it) looks like a failure to a rank whose data is already arriving: the data is
    in this rank's socket buffers and gloo completes the work a moment later. One more poll slice tells.
    """
    try:
        work.wait(_timedelta(_POLL_S))
    except RuntimeError:
        return False
    return True


@functools.lru_cache(maxsize=64)
def _all_to_all_options(timeout: float) -> Any:
    """The options of a gloo collective of ``timeout`` (read when it is issued, never changed: shared)."""
    opts = dist.AllToAllOptions()
    opts.timeout = _timedelta(timeout + _GLOO_MARGIN_S)
    return opts


@functools.lru_cache(maxsize=64)
def _rooted_options(kind: Any, root: int, timeout: float) -> Any:
    """The options of a gloo ``scatter`` or ``gather`` (``kind``: their options class) from or to ``root``."""
    opts = kind()
    opts.rootRank = root
    opts.timeout = _timedelta(timeout + _GLOO_MARGIN_S)
    return opts


class TorchDistributedBackend:
    """Exchange over ``torch.distributed`` (any initialised process group, gloo or NCCL).

    Args:
        process_group: the data-parallel group whose ranks hold *different* samples. ``None`` means all
            ranks. Under tensor/context parallelism, ranks that share the same samples must not be in
            the same synced group (they would be counted twice): pass the data-parallel group.
    """

    name = "torch"

    def __init__(self, process_group: Any = None) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise BackendError(
                "backend='torch' needs an initialised torch.distributed process group. "
                "HINT: call torch.distributed.init_process_group() first (torchrun does not do it for you)."
            )
        self._pg = process_group
        self._rank = dist.get_rank(process_group)
        if self._rank < 0:
            raise BackendError("this rank is not a member of the process_group passed to synced_reward")
        self._world_size = dist.get_world_size(process_group)
        self._ranks: list[int] = (
            list(range(dist.get_world_size())) if process_group is None else dist.get_process_group_ranks(process_group)
        )
        self._groups: list[Any] | None = None
        self._store: Any = None
        self._job_store: Any = None  # the job's default store: where members that left the job say so
        self._left_seen = 0  # how many left records of the job this backend has read
        self._left: dict[int, _Left] = {}  # group rank -> its left record
        self._released = False
        self._name: str | None = None  # the agreed store prefix of its groups, once set up
        self._ops = [0, 0]
        self._last_done = time.monotonic()
        self._init_lock = threading.Lock()
        self._works: list[Any] = [None, None]  # per channel: its last collective, until it completed here
        self._pid = os.getpid()
        self._leaving: str | None = None  # why this process abandoned its exchanges (it is exiting)
        self._waiting = 0  # threads inside _wait
        self._waiting_lock = threading.RLock()  # (an RLock: its re-take after a wait is not interruptible)
        self._waiting_cv = threading.Condition(self._waiting_lock)  # notified only while abandon() waits on it
        self._abandoning = 0  # threads inside abandon(), waiting for _waiting to reach 0
        job = watch_job()
        if job is not None:
            job.backends.add(self)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def __repr__(self) -> str:
        return f"TorchDistributedBackend(rank={self._rank}, world_size={self._world_size}, ranks={self._ranks})"

    # ------------------------------------------------------------------------------------------ setup

    def release(self) -> None:
        """Drop the gloo groups (their sockets and threads go with them); a later call on this backend raises.

        Called when the job (or the process group) this backend was made for is destroyed, and at exit. It
        never waits for a collective still running in gloo (see "Leaving" in the module docstring).
        """
        with self._init_lock:
            self._released = True
            groups, self._groups = self._groups, None
            self._store = self._job_store = None
            works, self._works = self._works, [None, None]
        if groups:
            _dispose(groups, works)

    def abandon(self, reason: str) -> None:
        """Stop waiting for the peers: every exchange in progress, or started later, raises at once.

        The session calls it at interpreter exit (``reason``: ``rank 0 is exiting``) so that no thread of
        this process waits on a peer. A rank abandoned inside an exchange records ``reason`` in the abort
        key, and the peers waiting with it raise :class:`~syncreward.CommunicationError` with it. Returns
        once no thread waits in this backend's exchanges (at most ``_ABANDON_WAIT_S``).
        """
        if os.getpid() != self._pid:  # a forked child: the parent's exchanges are not ours to abandon
            return
        self._leaving = reason
        deadline = time.monotonic() + _ABANDON_WAIT_S
        with self._waiting_lock:
            self._abandoning += 1
            try:
                while self._waiting and time.monotonic() < deadline:
                    self._waiting_cv.wait(max(deadline - time.monotonic(), 0.0))
            finally:
                self._abandoning -= 1

    def abort(self, reason: str) -> None:
        """This rank failed inside a step (its own error, not the transport's): the peers raise with ``reason``.

        Recorded in the groups' abort key (``E``), which every peer waiting in an exchange reads between
        slices, and a peer reaching its first synced call reads before it connects. Where this rank has not
        set up its groups yet (it failed building its first send buffer), the record goes where they would
        have been, under the name every member agrees on.
        """
        if os.getpid() != self._pid:
            return
        records = self._store
        if records is None and self._groups is None and not self._released:
            store = self._default_store()
            if store is None:
                return
            with self._init_lock:
                if self._name is None:
                    self._name = _agreed_name(self.name, self._pg is None, self._ranks)
                    self._released = True  # never set up now: the session that aborted is broken for good
            records = dist.PrefixStore(f"{self._name}/", store)  # type: ignore[attr-defined]
        if records is not None:
            with contextlib.suppress(Exception):
                records.set("abort", f"E{reason}")

    def _leave(self) -> NoReturn:
        """This rank abandoned its exchange (it is exiting): tell the peers, raise."""
        reason = self._leaving or "this rank abandoned the exchange"
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.set("abort", f"F{reason} while a synced call was in flight")
        raise CommunicationError(
            f"{reason}: this rank's exchange was abandoned. HINT: the process is ending (an exception, sys.exit or "
            "a signal in its main thread); the group is now unusable."
        )

    def _channel(self, channel: int, timeout: float) -> Any:
        groups = self._groups
        if groups is None:
            with self._init_lock:
                if self._released:
                    raise BackendError(
                        f"{self!r} was released: the torch.distributed job (or process group) it was made for was "
                        "destroyed. HINT: synced calls resolve a fresh backend for the current job; do not keep a "
                        "backend object across destroy_process_group()."
                    )
                if self._groups is None:
                    self._groups = self._create_groups(timeout)
                groups = self._groups
        return groups[channel]

    def _create_groups(self, timeout: float) -> list[Any]:
        t0 = time.perf_counter()
        store = self._default_store()
        if store is None:
            raise BackendError(
                "syncreward found no rendezvous store of the torch.distributed job to set up its gloo groups over"
            )
        name = _agreed_name(self.name, self._pg is None, self._ranks)
        self._job_store = store
        records = dist.PrefixStore(f"{name}/", store)  # type: ignore[attr-defined]  # the groups' abort record
        with contextlib.suppress(Exception):
            for c in (0, 1):  # every rank's arrival records exist from the set-up on: read in one go (_records)
                records.set(f"arrived/{c}/{self._rank}", _NO_ARRIVAL)
            store.set(_setup_arrival(name, self._ranks[self._rank]), "1")  # a rank that gives up names who never came
        self._await_members(store, records, timeout, name)
        try:
            # the rendezvous has no wait loop of ours around it: its own timeout is the user's
            groups = [
                _gloo_group(
                    dist.PrefixStore(f"{name}/gloo{c}/", store),  # type: ignore[attr-defined]
                    self._rank,
                    self._world_size,
                    timeout,
                    self._ranks,
                    f"{name}/{c}",
                )
                for c in (0, 1)
            ]
        except Exception as e:
            self._raise_if_given_up(records, timeout)  # the others gave up on this rank while it connected
            if not _is_timeout(e):
                raise _translate(e) from e
            raise self._setup_timed_out(store, records, timeout, name) from e
        self._store = records
        self._name = name
        log.debug("created syncreward gloo groups %s in %.3fs", name, time.perf_counter() - t0)
        return groups

    @staticmethod
    def _default_store() -> Any:
        try:
            from torch.distributed.distributed_c10d import _get_default_store

            return _get_default_store()
        except Exception:  # pragma: no cover - private API moved
            log.debug("no rendezvous store available", exc_info=True)
            return None

    def _await_members(self, store: Any, records: Any, timeout: float, name: str) -> None:
        """Wait (in slices) until every member has made its first synced call, before connecting to them.

        A rank that arrives after the others gave up on it learns so from their abort record at once and
        says so (:func:`late_message`), instead of waiting out its own timeout in gloo's rendezvous; a rank
        that waits long names the ranks not yet arrived (``_waiting``); at ``timeout`` it raises naming
        them and leaves the abort record for the late ones.
        """
        waits: WaitLog | None = None
        deadline = time.monotonic() + timeout
        pause = 0.002
        while True:
            self._raise_if_given_up(records, timeout, store, name)
            missing = self._missing_at_setup(store, name)
            if not missing:
                return
            self._raise_if_left(None, 0, records)
            if time.monotonic() >= deadline:
                raise self._setup_timed_out(store, records, timeout, name)
            if waits is None:
                waits = WaitLog(timeout, started=deadline - timeout)
            elif waits.due():
                waits.warn(missing, "make their first synced call")
            time.sleep(min(pause, max(deadline - time.monotonic(), 0.0)))
            pause = min(pause * 2, _POLL_S)

    def _raise_if_given_up(self, records: Any, timeout: float, store: Any = None, name: str = "") -> None:
        """Raise if the group's abort record says the others gave up (``T``) or failed (``F``, ``E``) already.

        A rank that gave up names the ranks it waited for (``missing``): one of them arrived too late; any
        other rank (given ``store`` and ``name``) was waiting with it and times out with it, naming them.
        """
        try:
            record = bytes(records.get("abort")).decode(errors="replace") if records.check(["abort"]) else None
            if record is not None and record.startswith("T") and records.check(["missing"]):
                waited_for = [int(r) for r in bytes(records.get("missing")).decode().split(",") if r]
            else:
                waited_for = None
        except Exception:  # the store is unreachable: the connection attempt itself will say so
            return
        if record is None:
            return
        if record.startswith("T"):
            if store is not None and waited_for is not None and self._rank not in waited_for:
                raise self._setup_timed_out(store, records, timeout, name, waited_for)
            raise CommunicationError(late_message(record[1:]))
        if record.startswith("E"):
            raise CommunicationError(_error_message(record[1:]))
        if record.startswith("M"):
            raise _mismatch_error(record, self._rank, None)
        raise CommunicationError(
            f"the other ranks' group failed before this rank arrived ({record[1:]}). HINT: a peer process probably "
            "exited, crashed or was killed; see its log. The group is now unusable."
        )

    def _setup_timed_out(
        self, store: Any, records: Any, timeout: float, name: str, missing: list[int] | None = None
    ) -> SyncTimeoutError:
        """The error of a rank that waited ``timeout`` for the others' first synced call; leaves the abort record.

        ``missing``: the ranks another rank gave up on (this rank waited with it); else the ranks without a
        set-up record now, written (before the abort record) for the ranks still waiting.
        """
        if missing is None:
            missing = self._missing_at_setup(store, name)
        said = seconds(given(timeout))  # the call's timeout=, not the seconds it had left (_waiting.given)
        with contextlib.suppress(Exception):  # a rank arriving later then says at once that it came too late
            if not records.check(["abort"]):
                who = f"rank(s) {missing}" if missing else "the other ranks"
                records.set("missing", ",".join(map(str, missing)))
                records.set("abort", f"Trank {self._rank} waited {said}s for {who} to make their first synced call")
        who = f"rank(s) {missing} did not make their first synced call" if missing else "the others did not arrive"
        return SyncTimeoutError(
            f"{who} within timeout={said}s, so syncreward could not connect ranks {self._ranks}. HINT: every "
            "rank of the group must make the same synced calls; raise timeout= if some ranks legitimately start "
            "much later.",
            missing,
        )

    def _missing_at_setup(self, store: Any, name: str) -> list[int]:
        """The group ranks that did not start setting up the groups named ``name`` (this set-up, not an earlier one)."""
        if store is None:
            return []
        try:
            return [r for r, g in enumerate(self._ranks) if not store.check([_setup_arrival(name, g)])]
        except Exception:
            return []

    # ------------------------------------------------------------------------------------------ collectives

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        # An all_to_all of the row to every rank: gloo's ring all_gather takes world_size - 1 dependent
        # steps, the pairwise exchange is faster for these small rows (docs/internals.md, "Which
        # collectives a call makes").
        raw = np.ascontiguousarray(row, dtype=np.int64).view(np.uint8)
        n, w = raw.size, self._world_size
        out = self._all_to_all(np.tile(raw, w), [n] * w, [n] * w, channel, timeout)
        return out.view(np.int64).reshape(w, -1)

    def all_to_all(
        self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], *, channel: int, timeout: float
    ) -> np.ndarray:
        return self._all_to_all(send, send_counts, recv_counts, channel, timeout)

    def _all_to_all(
        self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], channel: int, timeout: float
    ) -> np.ndarray:
        group = self._begin(channel, timeout)
        out = torch.empty(int(sum(recv_counts)), dtype=torch.uint8, device=_CPU)  # never the user's default
        opts = _all_to_all_options(math.ceil(timeout))  # whole seconds: the call's time left varies per call
        if not send.flags.writeable:  # torch.from_numpy warns on read-only arrays (gloo only reads it)
            send = send.copy()
        try:
            work = group.alltoall_base(
                out, torch.from_numpy(send), [int(c) for c in recv_counts], [int(c) for c in send_counts], opts
            )
        except RuntimeError as e:
            self._fail(e, channel, self._ops[channel] + 1)
        self._wait(work, channel, timeout, "all_to_all")
        self._last_done = time.monotonic()
        return out.numpy()

    def scatter(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        """Rank ``root`` sends each rank its ``size``-byte block of ``send`` (W blocks, in rank order).

        gloo's scatter sends W - 1 messages; an ``alltoallv`` with the same bytes sends W(W - 1), empty ones
        included (slower from W = 4 on: docs/scale.md).
        """
        group = self._begin(channel, timeout)
        out = torch.empty(size, dtype=torch.uint8, device=_CPU)
        opts = _rooted_options(dist.ScatterOptions, root, math.ceil(timeout))
        if self._rank == root and not send.flags.writeable:
            send = send.copy()
        try:
            # W views of one tensor (one C call; Tensor.split's Python wrapper costs more at small W)
            inputs = [list(torch.from_numpy(send).view(self._world_size, size).unbind(0))] if self._rank == root else []
            work = group.scatter([out], inputs, opts)
        except RuntimeError as e:
            self._fail(e, channel, self._ops[channel] + 1)
        self._wait(work, channel, timeout, "scatter")
        self._last_done = time.monotonic()
        return out.numpy()

    def gather(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        """Every rank sends rank ``root`` its ``size``-byte block; ``root`` returns the W blocks in rank order.

        gloo's gather sends W - 1 messages and, unlike its point-to-point operations, can be waited on in
        slices (docs/scale.md).
        """
        group = self._begin(channel, timeout)
        opts = _rooted_options(dist.GatherOptions, root, math.ceil(timeout))  # whole seconds, as above
        if not send.flags.writeable:
            send = send.copy()
        out = torch.empty(size * self._world_size if self._rank == root else 0, dtype=torch.uint8, device=_CPU)
        try:
            outputs = [list(out.view(self._world_size, size).unbind(0))] if self._rank == root else []
            work = group.gather(outputs, [torch.from_numpy(send)], opts)
        except RuntimeError as e:
            self._fail(e, channel, self._ops[channel] + 1)
        self._wait(work, channel, timeout, "gather")
        self._last_done = time.monotonic()
        return out.numpy()

    def send(self, data: np.ndarray, dst: int, *, channel: int, timeout: float) -> None:
        """Send rank ``dst`` exactly ``data`` (gloo point to point on the channel's group).

        A gloo point-to-point wait cannot be sliced (docs/scale.md): one wait, bounded by ``timeout``.
        """
        group = self._begin(channel, timeout)
        if not data.flags.writeable:
            data = data.copy()
        try:
            work = group.send([torch.from_numpy(data)], dst, channel)
        except RuntimeError as e:
            self._fail(e, channel, self._ops[channel] + 1)
        self._wait_whole(work, channel, timeout)

    def recv(self, size: int, src: int, *, channel: int, timeout: float) -> np.ndarray:
        """Receive exactly ``size`` bytes from rank ``src`` (gloo point to point; one wait, as :meth:`send`)."""
        return self.recv_many({src: size}, channel=channel, timeout=timeout)[src]

    def recv_many(self, sizes: Mapping[int, int], *, channel: int, timeout: float) -> dict[int, np.ndarray]:
        """Receive ``sizes[src]`` bytes from each rank ``src``: every receive posted first, then each waited on.

        A gloo point-to-point send waits for its receive to be posted: posted one after another, each
        sender would wait for the ones before it. ``timeout`` bounds the whole.
        """
        group = self._begin(channel, timeout)
        end = time.monotonic() + timeout
        outs: dict[int, torch.Tensor] = {}
        works = []
        for src, size in sizes.items():
            out = outs[src] = torch.empty(size, dtype=torch.uint8, device=_CPU)
            try:
                works.append(group.recv([out], src, channel))
            except RuntimeError as e:
                self._fail(e, channel, self._ops[channel] + 1)
        for work in works:
            self._wait_whole(work, channel, end - time.monotonic())
        return {src: out.numpy() for src, out in outs.items()}

    def _wait_whole(self, work: Any, channel: int, timeout: float) -> None:
        """Wait for a point-to-point ``work`` in one wait of ``timeout``; a failure in syncreward's words."""
        self._works[channel] = work
        op = self._ops[channel]  # part of the collective before it: every rank counts the same exchanges
        try:
            work.wait(_timedelta(max(timeout, 0.001)))
        except RuntimeError as e:
            # a point-to-point wait that runs out says so in gloo's words ("Timed out waiting ...ms for recv
            # operation to complete"), not c10d's: a timeout all the same
            if _WORK_TIMEOUT_MESSAGE not in str(e) and not _is_timeout(e):
                self._fail(e, channel, op)
            self._check_peers()
            self._raise_if_left(channel, op, self._store)
            self._timed_out(channel, timeout)
        finally:
            self._works[channel] = None
        self._last_done = time.monotonic()

    def _begin(self, channel: int, timeout: float) -> Any:
        """The channel's gloo group, once this rank has checked that the others did not give up on it."""
        if self._leaving is not None:
            self._leave()
        group = self._channel(channel, timeout)
        if time.monotonic() - self._last_done > timeout / 2 and self._check_peers():
            # the others gave up on this rank while it was away: raise with them, never complete the exchange
            raise CommunicationError(late_message(self._abort_text()))
        return group

    # ------------------------------------------------------------------------------------------ waiting

    def _wait(self, work: Any, channel: int, timeout: float, kind: str) -> None:
        """Wait for ``work`` until ``timeout``, in slices; a rank waiting past the first slice says it arrived.

        The arrival record (one store write per wait that lasts) lets a rank that gives up at ``timeout``
        name the missing ranks at once, instead of waiting for the ones that did arrive to report. Until
        ``work`` completes here it counts as running (``release`` never destroys its group under it).
        """
        self._works[channel] = work
        with self._waiting_lock:
            self._waiting += 1
        try:
            self._wait_slices(work, channel, timeout, kind)
        finally:
            with self._waiting_lock:
                self._waiting -= 1
                if self._abandoning:
                    self._waiting_cv.notify_all()
        self._works[channel] = None

    def _wait_slices(self, work: Any, channel: int, timeout: float, kind: str) -> None:
        op = self._ops[channel] = self._ops[channel] + 1
        deadline = time.monotonic() + timeout
        slice_s = 0.02
        waits: WaitLog | None = None
        while True:
            try:
                work.wait(_timedelta(max(min(slice_s, deadline - time.monotonic()), 0.001)))
                return
            except RuntimeError as e:
                if _WORK_TIMEOUT_MESSAGE not in str(e):
                    self._fail(e, channel, op)
            if self._leaving is not None:
                self._leave()
            if waits is None:
                slice_s = _POLL_S
                self._mark_arrived(channel, op, kind)
                waits = WaitLog(timeout, started=deadline - timeout)
            elif waits.due():
                waits.warn(self._not_arrived(channel, op), "arrive in this exchange")
            try:
                gave_up = self._check_peers(kind)
                self._raise_if_left(channel, op, self._store)
                self._raise_if_other_kind(channel, op, kind)
            except CommunicationError:
                if _got_through(work):  # its data arrived: a peer that left after its part fails nothing
                    return
                raise
            if gave_up or time.monotonic() >= deadline:  # a peer gave up: so do we, naming who
                self._timed_out(channel, timeout)

    def _mark_arrived(self, channel: int, op: int, kind: str) -> None:
        # Best effort, and never a reason to fail: the store lives in rank 0's process, which may have left
        # right after its part of this exchange (the data then still arrives; see _got_through).
        if self._store is not None:
            with contextlib.suppress(Exception):  # best effort: it only helps name the missing ranks
                self._store.set(f"arrived/{channel}/{self._rank}", f"{op} {kind}")
                # and the other channel's exchanges it entered: a non-scoring rank of main completes its gather
                # without waiting (so without a record), then waits for its results on the other channel
                other = 1 - channel
                if self._ops[other] and self._works[other] is None:  # (not waiting there: its own record says more)
                    self._store.set(f"arrived/{other}/{self._rank}", f"{self._ops[other]} done")

    def _raise_if_other_kind(self, channel: int, op: int, kind: str) -> None:
        """Raise if a peer waits in exchange ``op`` of ``channel`` in another collective.

        ``main``'s gather beside another mode's all_to_all: gloo never matches them, both would wait until
        ``timeout``. Read from the peers' arrival records, which name the collective; once one differs, the
        others' records are given a moment (``_GRACE_S`` x 4), so that every rank's message names every rank.
        The group cannot recover (both collectives stay pending inside gloo): the error breaks the session.
        """
        kinds = self._kinds(channel, op, kind)
        if len(set(kinds.values())) < 2:
            return
        end = time.monotonic() + 4 * _GRACE_S
        while len(kinds) < self._world_size and time.monotonic() < end:
            time.sleep(0.05)
            kinds = self._kinds(channel, op, kind)
        if self._store is not None:  # the ranks waiting elsewhere (main's non-scoring ones) raise it too
            with contextlib.suppress(Exception):
                if not self._store.check(["abort"]):
                    self._store.set("abort", _mismatch_record(kinds))
        raise CollectiveMismatchError(collective_mismatch_message(kinds))

    def _kinds(self, channel: int, op: int, kind: str) -> dict[int, str]:
        """The collective each rank waits in, in exchange ``op`` of ``channel``, as far as the arrival records say."""
        kinds = {self._rank: kind}
        if self._store is None:
            return kinds
        try:
            for r, (at, what) in self._records(channel).items():
                if at == op and what not in ("", "timeout", "done"):  # ("timeout", "done": not waiting in it)
                    kinds[r] = what
        except Exception:  # the store is unreachable: the wait says so by itself
            pass
        return kinds

    def _records(self, channel: int) -> dict[int, tuple[int, str]]:
        """The peers' arrival records on ``channel``, ``rank -> (exchange, what)``: two store reads, whatever W.

        Every rank waiting past its first slice reads them at each poll: one read per peer made that
        O(W^2) store requests per poll in all (at W=16 the store, which rank 0's process serves, slowed a
        3-reward step by a fifth). Every rank writes its records at set-up, so they all exist once every rank
        set up (one ``check``), and one ``multi_get`` reads them; before that (a rank still setting up, or a
        torch without ``multi_get``), one by one.
        """
        store = self._store
        peers = [r for r in range(self._world_size) if r != self._rank]
        keys = [f"arrived/{channel}/{r}" for r in peers]
        if hasattr(store, "multi_get") and store.check(keys):
            raw = dict(zip(peers, store.multi_get(keys), strict=True))
        else:
            raw = {r: store.get(k) for r, k in zip(peers, keys, strict=True) if store.check([k])}
        out = {}
        for r, value in raw.items():
            got = bytes(value).decode().split()
            out[r] = (int(got[0]), got[1] if len(got) == 2 else "")
        return out

    def _fail(self, e: BaseException, channel: int | None = None, op: int = 0) -> NoReturn:
        """Raise the lower layer's failure ``e`` in syncreward's words; first, tell the peers.

        A peer that left the job without entering this exchange (``op`` of ``channel``) closed its connection
        as it went: its left record says so in the user's words, and that is what is raised.
        """
        if channel is not None:
            reason = self._peer_abort()
            if reason is not None and reason.startswith("E"):  # a peer's own failure, told before it left: the cause
                raise CommunicationError(_error_message(reason[1:])) from e
            if reason is not None and reason.startswith("M"):  # the ranks met in different collectives: the cause
                raise _mismatch_error(reason, self._rank, None) from e
            try:
                self._raise_if_left(channel, op, self._store)
            except CommunicationError as left:
                raise left from e
        error = _translate(e)
        if self._store is not None:
            # the store lives in rank 0's process; it may be the one that died
            with contextlib.suppress(Exception):
                what = first_line(error).split(" HINT:")[0].rstrip(". ")
                self._store.set("abort", f"Frank {self._rank} lost its connection to the others ({what})")
        raise error from e

    def _check_peers(self, kind: str | None = None) -> bool:
        """Raise if a peer's transport or step failed, or the ranks met in different collectives.

        ``kind``: the collective this rank waits in (a mismatch's message names it); returns whether a peer
        gave up waiting (timed out).
        """
        reason = self._peer_abort()
        if reason is None:
            return False
        if reason.startswith("T"):
            return True
        if reason.startswith("E"):
            raise CommunicationError(_error_message(reason[1:]))
        if reason.startswith("M"):
            raise _mismatch_error(reason, self._rank, kind)
        raise CommunicationError(
            f"{reason[1:]}. HINT: a peer process probably exited, crashed or was killed; see its log. The group is "
            "now unusable."
        )

    def _peer_abort(self) -> str | None:
        """The abort record of the group: ``F`` (a transport failed) or ``T`` (a rank gave up), then what happened."""
        if self._store is None:
            return None
        try:
            if self._store.check(["abort"]):
                return bytes(self._store.get("abort")).decode(errors="replace")
        except Exception:  # store unreachable: rank 0 is gone
            return "Fthe rendezvous store hosted by rank 0 is unreachable (rank 0 exited, crashed or was killed)"
        return None

    def _raise_if_left(self, channel: int | None, op: int, records: Any) -> None:
        """Raise if a member left the job without entering exchange ``op`` of ``channel``.

        ``channel`` ``None``: the set-up of the groups (the first synced call), which such a member never
        started. One store read while no member has left (the count of left records).
        """
        store = self._job_store
        if store is None:
            return
        try:
            count = int(store.add(_LEFT, 0))
            if count != self._left_seen:
                self._left_seen = count
                for r, g in enumerate(self._ranks):
                    if r != self._rank and r not in self._left:
                        left = _read_left(store, g, self._name)
                        if left is not None:
                            self._left[r] = left
        except Exception:  # the store's host left: the wait says so by itself
            return
        gone = [
            (r, left)
            for r, left in sorted(self._left.items())
            if left.ops is None or (channel is not None and left.ops[channel] < op)
        ]
        if not gone:
            return
        message = left_message([left.why for _, left in gone], first=channel is None)
        if records is not None:
            with contextlib.suppress(Exception):  # the ranks still waiting raise with this rank
                if not records.check(["abort"]):
                    records.set("abort", f"F{message.split(' HINT:')[0].rstrip('. ')}")
        raise CommunicationError(message)

    def _abort_text(self) -> str:
        return (self._peer_abort() or "T?")[1:]

    def _timed_out(self, channel: int, timeout: float) -> NoReturn:
        op = self._ops[channel]
        said = given(timeout)  # what the records and the error name: the call's timeout= (_waiting.given)
        missing: list[int] = []
        if self._store is not None:
            try:
                # first of all, so that a rank arriving now raises with us instead of completing the exchange
                if self._peer_abort() is None:
                    self._store.set("abort", f"Trank {self._rank} gave up after waiting {seconds(said)}s")
                self._store.set(f"arrived/{channel}/{self._rank}", f"{op} timeout")
                # the ranks that waited have said so already; give the ones that arrived just now a moment
                end = time.monotonic() + _GRACE_S
                while True:
                    missing = self._not_in(channel, op)
                    if not missing or time.monotonic() >= end:
                        break
                    time.sleep(0.05)
                # a rank missing here but waiting in the exchange this rank passed on the other channel is not
                # missing: it waits for others (main: rank 0 in the gather, while this rank waits for its
                # results). The ranks it names are the missing ones.
                blocked = self._blocked_elsewhere(channel, missing)
                named = self._named_missing(blocked) if blocked else None
                if named is not None:
                    missing = named
                elif (self._peer_abort() or "T").startswith("T"):
                    # a rank that arrives later must not wait out its own timeout for ranks that gave up
                    self._store.set("abort", f"Trank {self._rank} waited {seconds(said)}s for rank(s) {missing}")
            except Exception:
                missing = []
        raise SyncTimeoutError(timeout_message(missing, said), missing)

    def _blocked_elsewhere(self, channel: int, missing: Sequence[int]) -> list[int]:
        """The ``missing`` ranks whose record shows them in the exchange this rank passed last on the other channel."""
        other, passed = 1 - channel, self._ops[1 - channel]
        if not passed:
            return []
        records = self._records(other)
        return [r for r in missing if r in records and records[r][0] == passed and records[r][1] not in ("", "done")]

    def _named_missing(self, blocked: Sequence[int]) -> list[int] | None:
        """The ranks one of the ``blocked`` ranks waited for, once its abort record names them (within a grace)."""
        end = time.monotonic() + 4 * _GRACE_S
        while True:
            found = _WAITED_FOR.search(self._peer_abort() or "")
            if found is not None and int(found.group(1)) in blocked:
                return [int(r) for r in found.group(2).split(",") if r.strip()]
            if time.monotonic() >= end:
                return None
            time.sleep(0.05)

    def _not_arrived(self, channel: int, op: int) -> list[int] | None:
        """The ranks without an arrival record for this exchange (``None``: the store cannot tell)."""
        if self._store is None:
            return None
        try:
            return self._not_in(channel, op)
        except Exception:
            return None

    def _not_in(self, channel: int, op: int) -> list[int]:
        """The peers whose arrival record on ``channel`` is not yet at exchange ``op`` (or that have none)."""
        records = self._records(channel)
        return [r for r in range(self._world_size) if r != self._rank and records.get(r, (0, ""))[0] < op]
