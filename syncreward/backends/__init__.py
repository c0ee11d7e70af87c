"""Transports between ranks, behind the small :class:`Backend` protocol.

``backend="auto"`` (the default) resolves *at call time*, in this order:

1. an explicit backend object or name passed to ``synced_reward`` (``"local"``, ``"torch"``,
   ``"accelerate"``, ``"ray"``); else, inside :func:`syncreward.testing.run_threads`, the thread-rank's
   own backend. While a ``run_threads`` is running, a thread that belongs to none of its ranks (a new
   thread starts with an empty context) gets an error, never the local backend;
2. ``"ray"`` if this process joined exactly one Ray group with ``syncreward.backends.ray.join()``.
   Being inside a Ray actor is never enough on its own (the group, rank and size are unknown until
   ``join()``); and if ``torch.distributed`` (or accelerate) is *also* initialised -- e.g. under Ray
   Train -- auto refuses to guess and asks for ``backend="ray"`` or ``backend="torch"``;
3. ``"accelerate"`` if accelerate's ``PartialState`` is initialised with more than one process;
4. ``"torch"`` if ``torch.distributed`` is initialised;
5. an error if the environment says this is one of several processes (``WORLD_SIZE`` > 1) but nothing
   is initialised -- scoring each rank alone would silently give wrong rewards;
6. ``"local"``: a single process.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from .._errors import BackendError, forked_message
from ._protocol import Backend
from .local import LocalBackend

__all__ = ["Backend", "LocalBackend", "resolve_backend"]

_LOCAL = LocalBackend()
# set by syncreward.testing.run_threads: the thread-rank's backend, which "auto" resolves to first
_context_backend: ContextVar[Backend | None] = ContextVar("syncreward_context_backend", default=None)
_thread_ranks_running = 0  # run_threads calls in progress (they may nest or run at once); see _thread_ranks
_thread_ranks_lock = threading.Lock()
# (kind, id(WORLD), id(process_group)) -> backend, and the weak references that prove those ids are still
# the same objects (a strong reference would keep a destroyed job's groups, sockets and threads alive)
_cache: dict[tuple[str, int, int], Any] = {}
_refs: dict[tuple[str, int, int], tuple[Any, Any]] = {}


def _accelerate_active() -> bool:
    mod = sys.modules.get("accelerate.state")
    if mod is None:
        return False
    shared: dict[str, Any] = getattr(mod.PartialState, "_shared_state", None) or {}
    return int(shared.get("num_processes", 1) or 1) > 1


def _torch_active() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


# os.environ.get costs ~1 us (it encodes the key and decodes the value); the single-process path reads
# WORLD_SIZE on every call, so read the underlying mapping directly where the platform has one.
_ENV_DATA: Any = getattr(os.environ, "_data", None)
_WORLD_SIZE_KEY: Any = os.environ.encodekey("WORLD_SIZE") if _ENV_DATA is not None else "WORLD_SIZE"  # type: ignore[attr-defined]


def _env_world_size() -> str:
    if _ENV_DATA is None:  # pragma: no cover - platforms without os.environ._data
        return os.environ.get("WORLD_SIZE", "1")
    raw = _ENV_DATA.get(_WORLD_SIZE_KEY)
    if raw is None:
        return "1"
    return raw.decode() if isinstance(raw, bytes) else str(raw)


_release_hooks: list[Callable[[Any], None]] = []


def on_release(hook: Callable[[Any], None]) -> Callable[[Any], None]:
    """Call ``hook(backend)`` whenever the backend cache releases a backend; returns ``hook`` (a decorator).

    A backend is released when its job or process group is destroyed, or at exit. The layers above
    register here what they hold per backend (``_session`` drops the backend's session), so that this
    package never reaches up into them.
    """
    _release_hooks.append(hook)
    return hook


def _release_backend(backend: Any) -> None:
    release = getattr(backend, "release", None)
    if release is not None:
        release()
    for hook in _release_hooks:
        hook(backend)


def _release() -> None:
    """Drop syncreward's references to its gloo groups while the interpreter is still whole.

    Left to interpreter teardown, a gloo group's destructor joins its worker threads at a point where
    they may need the GIL; releasing them from an ``atexit`` hook (which runs first) avoids that.
    """
    for backend in list(_cache.values()):
        _release_backend(backend)
    _cache.clear()
    _refs.clear()


def _release_dead(_: Any = None) -> None:
    """Release the backends whose job or process group was destroyed; never one whose job is alive.

    Runs as the finalizer of a cached backend's ``WORLD`` group and ``process_group`` objects (torch drops
    its last references to them in ``destroy_process_group``), and again when a backend is created for a
    new job (in case someone else still held a destroyed job's group object). A job is destroyed once
    its ``WORLD`` object is gone or is no longer the default group (there is one default group at a time).
    """
    dist = sys.modules.get("torch.distributed")
    current = dist.group.WORLD if dist is not None and _torch_active() else None
    dead = []
    for key, (world_ref, pg_ref) in list(_refs.items()):
        world = world_ref()
        if world is None or world is not current or (pg_ref is not None and pg_ref() is None):
            dead.append(key)
    for key in dead:
        backend = _cache.pop(key, None)
        _refs.pop(key, None)
        if backend is not None:
            _release_backend(backend)


atexit.register(_release)


_cache_lock = threading.Lock()
_forked_from: int | None = None  # pid of the parent, when this process was forked from a distributed job


def _after_fork_in_child() -> None:
    global _forked_from, _cache_lock
    _cache_lock = threading.Lock()  # another thread may have held it at the fork
    if _torch_active() or _forked_from is not None:
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
    backend = _cache.get(key)
    if backend is None:
        return None
    refs = _refs.get(key)
    if refs is not None and refs[0]() is world and (refs[1] is None or refs[1]() is process_group):
        return backend
    return None  # the ids were reused (a finalizer would have dropped the entry first): a fresh backend


def _cached(kind: str, process_group: Any, make: Any) -> Any:
    """One backend per (kind, job, process group): a re-initialised job gets fresh groups.

    Created under a lock, so two threads making their first call at once share one backend (two would
    create two sets of gloo groups, which the other ranks would pair up wrongly). The cache holds the job's
    ``WORLD`` group and the ``process_group`` weakly: when either is destroyed, the backend releases its
    gloo groups (:func:`_release_dead`).
    """
    import torch.distributed as dist

    _check_not_forked(kind)
    world = dist.group.WORLD
    key = (kind, id(world), id(process_group))
    backend = _live(key, world, process_group)
    if backend is not None:
        return backend
    with _cache_lock:
        _release_dead()  # earlier jobs' backends go first
        backend = _live(key, world, process_group)
        if backend is None:
            stale = _cache.pop(key, None)
            if stale is not None:
                _release_backend(stale)
            backend = make()
            world_ref = weakref.ref(world, _release_dead)
            pg_ref = None if process_group is None else weakref.ref(process_group, _release_dead)
            _refs[key] = (world_ref, pg_ref)
            _cache[key] = backend
    return backend


def _ray_joined() -> list[Any]:
    mod = sys.modules.get("syncreward.backends.ray")
    return [] if mod is None else mod.joined_backends()  # type: ignore[no-any-return]


def _thread_ranks(delta: int) -> None:
    """Count :func:`syncreward.testing.run_threads` calls in progress (``+1`` on entry, ``-1`` on exit)."""
    global _thread_ranks_running
    with _thread_ranks_lock:
        _thread_ranks_running += delta


def _not_a_thread_rank() -> BackendError:
    return BackendError(
        f"a synced call with backend='auto' was made from thread {threading.current_thread().name!r}, which is not "
        "one of run_threads' ranks (a new thread starts with an empty context, so it belongs to no simulated rank), "
        "while run_threads is running; scoring it alone would give results that real ranks never give. HINT: make "
        "synced calls from the rank's own thread, or run the helper in the rank's context -- "
        "pool.submit(contextvars.copy_context().run, reward, ...) or asyncio.to_thread -- so that the call belongs "
        "to that rank and behaves as on real ranks."
    )


# ============================================================================================ factories
# One per registered name (the registry below): the backend for a call's options.


def _auto(process_group: Any) -> Backend:
    """``backend="auto"``: the first backend in the documented order (the module docstring)."""
    override = _context_backend.get()
    if override is not None:
        return override
    if _thread_ranks_running:  # a thread of this process that belongs to no thread-rank
        raise _not_a_thread_rank()
    if process_group is not None:
        return _torch(process_group)
    if _ray_joined():
        if _accelerate_active() or _torch_active():
            raise BackendError(
                "this process joined a Ray group and torch.distributed is initialised too (e.g. under Ray "
                "Train), so backend='auto' is ambiguous. HINT: pass backend='ray' to sync over the Ray group, "
                "or backend='torch' to sync over the torch.distributed job."
            )
        return _ray(None)
    if _accelerate_active():
        return _accelerate(None)
    if _torch_active():
        return _torch(None)
    ws = _env_world_size()
    if ws != "1" and ws.isdigit() and int(ws) > 1:
        raise BackendError(
            f"WORLD_SIZE={ws} says this is one of several processes, but torch.distributed is not "
            "initialised, so synced rewards cannot see the other ranks. HINT: call "
            "torch.distributed.init_process_group() (or create the Accelerator) before the first synced "
            "call, or pass backend='local' to score each process alone on purpose."
        )
    return _LOCAL


def _local(process_group: Any) -> Backend:
    return _LOCAL


def _torch(process_group: Any) -> Backend:
    from .torch_distributed import TorchDistributedBackend

    if not _torch_active():
        return TorchDistributedBackend(process_group)  # raises the explanatory BackendError
    return _cached("torch", process_group, lambda: TorchDistributedBackend(process_group))  # type: ignore[no-any-return]


def _accelerate(process_group: Any) -> Backend:
    from .accelerate import accelerate_backend

    if process_group is not None:
        raise BackendError("process_group= goes with backend='torch', not 'accelerate'")
    if not _torch_active():
        return accelerate_backend()  # type: ignore[return-value]
    return _cached("accelerate", None, accelerate_backend)  # type: ignore[no-any-return]


def _ray(process_group: Any) -> Backend:
    if process_group is not None:
        raise BackendError("process_group= goes with backend='torch', not 'ray'")
    from .ray import current_backend

    return current_backend()


# ============================================================================================ registry
# The backend names synced_reward(backend=...) accepts, each with the factory that builds (or fetches from
# the cache) the backend for a call's options (``process_group``). The decorator's check of backend=, the
# dispatch in resolve_backend and the "unknown backend" message are all derived from this table. Prose
# names the entries too: this module's docstring, synced_reward's and docs/concepts.md
# (tests/test_backend_registry.py checks that they name every entry).
#
# To add a backend: write backends/<name>.py (the Backend protocol), add its factory above and one line to
# _FACTORIES, and name it in that prose. For "auto" to pick it, add a step to _auto and to the order in
# this module's docstring.

_FACTORIES: dict[str, Callable[[Any], Backend]] = {
    "auto": _auto,
    "local": _local,
    "torch": _torch,
    "accelerate": _accelerate,
    "ray": _ray,
}
BACKEND_NAMES: tuple[str, ...] = tuple(_FACTORIES)
"""The names ``synced_reward(backend=...)`` accepts, in the order the docs list them."""


def unknown_backend_message(spec: object) -> str:
    """What a ``backend=`` that names no registered backend is told."""
    return f"unknown backend {spec!r}; expected one of {BACKEND_NAMES} or a Backend object"


_BACKEND_TYPES: set[type] = set()  # classes whose instances passed the Backend protocol check


def resolve_backend(spec: str | Backend, process_group: Any = None) -> Backend:
    """Return the backend a synced call uses, following the documented order.

    Raises:
        BackendError: the job is distributed but no backend can be used, or an unknown name.
        ImportError: the backend's optional dependency is missing (names the extra to install).
    """
    if not isinstance(spec, str):
        if type(spec) not in _BACKEND_TYPES:  # the Protocol check costs ~10 us; it is made once per class
            if not isinstance(spec, Backend):
                raise BackendError(
                    f"backend={spec!r} is neither a backend name nor an object with the Backend protocol"
                )
            _BACKEND_TYPES.add(type(spec))
        return spec
    factory = _FACTORIES.get(spec)
    if factory is None:
        raise BackendError(unknown_backend_message(spec))
    return factory(process_group)
