"""The backend cache: one backend per job (and process group), released when that job is gone.

A torch or accelerate backend owns gloo groups of its own, so every call of a job must get the same
backend object (two would create two sets of groups, which the other ranks would pair up wrongly), and a
re-initialised job must get a fresh one. :func:`cached` keeps one backend per (kind, job, process group),
holding the job's ``WORLD`` group and the ``process_group`` weakly: when either is destroyed (or at exit)
the backend is released (:func:`release`): its own ``release()`` runs (``_protocol.Releases``), then
every hook registered with :func:`on_release` (the layers above drop what they hold per backend; this
package never reaches up into them). A process forked from a distributed job gets a clear error instead
of its parent's groups.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from .._errors import BackendError, forked_message
from ._protocol import releases

__all__ = ["cached", "note_job", "on_release", "release", "torch_active"]

# (kind, id(WORLD), id(process_group)) -> backend, and the weak references that prove those ids are still
# the same objects (a strong reference would keep a destroyed job's groups, sockets and threads alive)
_backends: dict[tuple[str, int, int], Any] = {}
_refs: dict[tuple[str, int, int], tuple[Any, Any]] = {}
_release_hooks: list[Callable[[Any], None]] = []
_lock = threading.Lock()
_forked_from: int | None = None  # pid of the parent, when this process was forked from a distributed job


_c10d: Any = None  # torch's ``distributed_c10d``, once its record of the default group was found
_world: Any = None  # that record (``distributed_c10d._world``) as found


def torch_active() -> bool:
    """Whether ``torch.distributed`` is initialised in this process (never imports torch).

    ``dist.is_initialized()`` is ``GroupMember.WORLD is not None``: two properties that read
    ``distributed_c10d._world._default_pg``. This runs on every single-process call, so where torch keeps
    that record it is read directly (found once, used while it is still the record torch holds: torch lets
    it be replaced, and its multi-threaded process group does); elsewhere ``GroupMember.WORLD`` is.
    ``distributed_c10d`` is loaded exactly where ``torch.distributed`` is loaded and available.
    """
    if _c10d is not None and _c10d._world is _world:
        return _world._default_pg is not None
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None:
        return False
    member = getattr(c10d, "GroupMember", None)
    if member is None:  # pragma: no cover - a torch that keeps its default group elsewhere
        return bool(c10d.is_initialized())
    active = member.WORLD is not None
    _find_world(c10d, active)
    return active


def _find_world(c10d: Any, active: bool) -> None:
    """Keep ``c10d._world`` where its ``_default_pg`` says what ``GroupMember.WORLD`` says (torch >= 2.0)."""
    global _c10d, _world
    world = getattr(c10d, "_world", None)
    if "_default_pg" in getattr(world, "__dict__", {}) and (world._default_pg is not None) == active:  # type: ignore[union-attr]
        _c10d, _world = c10d, world


def on_release(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """Call ``hook(backend)`` whenever a backend is released; returns ``hook`` (a decorator).

    A backend is released when its job or process group is destroyed, or at exit. The layers above
    register here what they hold per backend (``_session`` drops the backend's session), so that this
    package never reaches up into them.
    """
    _release_hooks.append(hook)
    return hook


def release(backend: Any) -> None:
    """Release ``backend``: its own ``release()`` if it has one, then every :func:`on_release` hook.

    The cache calls it for the backends it drops; :func:`syncreward.testing.run_threads` calls it for its
    thread-ranks' backends when it returns.
    """
    releasing = releases(backend)
    if releasing is not None:
        releasing.release()
    for hook in _release_hooks:
        hook(backend)


def _release_all() -> None:
    """Drop syncreward's references to its gloo groups while the interpreter is still whole.

    Left to interpreter teardown, a gloo group's destructor joins its worker threads at a point where
    they may need the GIL; releasing them from an ``atexit`` hook (which runs first) avoids that.
    """
    for backend in list(_backends.values()):
        release(backend)
    _backends.clear()
    _refs.clear()


def _release_dead(_: Any = None) -> None:
    """Release the backends whose job or process group was destroyed; never one whose job is alive.

    Runs as the finalizer of a cached backend's ``WORLD`` group and ``process_group`` objects (torch drops
    its last references to them in ``destroy_process_group``), and again when a backend is created for a
    new job (in case someone else still held a destroyed job's group object). A job is destroyed once
    its ``WORLD`` object is gone or is no longer the default group (there is one default group at a time).
    """
    dist = sys.modules.get("torch.distributed")
    current = dist.group.WORLD if dist is not None and torch_active() else None
    dead = []
    for key, (world_ref, pg_ref) in list(_refs.items()):
        world = world_ref()
        if world is None or world is not current or (pg_ref is not None and pg_ref() is None):
            dead.append(key)
    for key in dead:
        backend = _backends.pop(key, None)
        _refs.pop(key, None)
        if backend is not None:
            release(backend)


atexit.register(_release_all)


def note_job() -> None:
    """A synced reward was made: remember the running torch.distributed job, if any (never imports torch).

    So that this rank, leaving the job without ever making a synced call, can tell the others
    (``torch_distributed.watch_job``).
    """
    if torch_active():
        from .torch_distributed import watch_job

        watch_job()


def _left_at_exit() -> None:
    """Threading's exit hook: a rank that leaves a torch.distributed job says so in the job's store."""
    if torch_active() or "syncreward.backends.torch_distributed" in sys.modules:
        from .torch_distributed import left_at_exit

        left_at_exit()


threading._register_atexit(_left_at_exit)  # type: ignore[attr-defined]  # registered at import: no call needed


def _after_fork_in_child() -> None:
    global _forked_from, _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    if torch_active() or _forked_from is not None:
        _forked_from = os.getppid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_not_forked(kind: str) -> None:
    if _forked_from is not None:
        raise BackendError(
            forked_message(
                f"a synced call (backend {kind!r})", os.getpid(), _forked_from, "a rank of a distributed job"
            )
        )


def _live(key: tuple[str, int, int], world: Any, process_group: Any) -> Any:
    """The cached backend under ``key`` if its ids still name ``world`` and ``process_group``."""
    backend = _backends.get(key)
    if backend is None:
        return None
    refs = _refs.get(key)
    if refs is not None and refs[0]() is world and (refs[1] is None or refs[1]() is process_group):
        return backend
    return None  # the ids were reused (a finalizer would have dropped the entry first): a fresh backend


def cached(kind: str, process_group: Any, make: Callable[[], Any]) -> Any:
    """One backend per (kind, job, process group), made by ``make()``: a re-initialised job gets a fresh one.

    Created under a lock, so two threads making their first call at once share one backend. The cache
    holds the job's ``WORLD`` group and the ``process_group`` weakly: when either is destroyed, the
    backend is released (:func:`release`).

    Raises:
        BackendError: this process was forked from a distributed job.
    """
    import torch.distributed as dist

    _check_not_forked(kind)
    world = dist.group.WORLD
    key = (kind, id(world), id(process_group))
    backend = _live(key, world, process_group)
    if backend is not None:
        return backend
    with _lock:
        _release_dead()  # earlier jobs' backends go first
        backend = _live(key, world, process_group)
        if backend is None:
            stale = _backends.pop(key, None)
            if stale is not None:
                release(stale)
            backend = make()
            world_ref = weakref.ref(world, _release_dead)
            pg_ref = None if process_group is None else weakref.ref(process_group, _release_dead)
            _refs[key] = (world_ref, pg_ref)
            _backends[key] = backend
    return backend
