"""The backend names and how a call's ``backend=`` becomes a backend object (``"auto"``'s order included).

:data:`_FACTORIES` is the one registry: backend name -> factory that builds (or fetches from the cache,
``_cache``) the backend for a call's options (``process_group``). The decorator's check of ``backend=``
(:data:`BACKEND_NAMES`), the dispatch in :func:`resolve_backend` and the "unknown backend" message are all
derived from it. ``"auto"``'s factory follows the order in the package docstring (``backends/__init__.py``).

:func:`syncreward.testing.run_threads` makes its threads simulated ranks through two seams:
:func:`thread_ranks` (while it is active, a thread that belongs to no rank cannot make a ``"auto"`` call)
and :func:`as_thread_rank` (in it, ``"auto"`` resolves to the thread-rank's own backend).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

from .._errors import BackendError
from ._cache import cached, torch_active
from ._protocol import Backend
from .local import LocalBackend

__all__ = [
    "BACKEND_NAMES",
    "as_thread_rank",
    "resolve_backend",
    "resolver",
    "thread_ranks",
    "unknown_backend_message",
]

_LOCAL = LocalBackend()

# ============================================================================================ thread-ranks

_thread_rank: ContextVar[Backend | None] = ContextVar("syncreward_thread_rank", default=None)
_thread_ranks_running = 0  # thread_ranks() in progress (run_threads calls may nest or run at once)
_thread_ranks_lock = threading.Lock()


@contextlib.contextmanager
def as_thread_rank(backend: Backend) -> Iterator[None]:
    """In this context (and contexts copied from it), ``backend="auto"`` resolves to ``backend``."""
    token = _thread_rank.set(backend)
    try:
        yield
    finally:
        _thread_rank.reset(token)


@contextlib.contextmanager
def thread_ranks() -> Iterator[None]:
    """While this is active (anywhere in the process), an ``"auto"`` call from no thread-rank raises ``BackendError``.

    A thread that belongs to no :func:`as_thread_rank` context would otherwise score its batch alone.
    """
    global _thread_ranks_running
    with _thread_ranks_lock:
        _thread_ranks_running += 1
    try:
        yield
    finally:
        with _thread_ranks_lock:
            _thread_ranks_running -= 1


def _not_a_thread_rank() -> BackendError:
    return BackendError(
        f"a synced call with backend='auto' was made from thread {threading.current_thread().name!r}, which is not "
        "one of run_threads' ranks (a new thread starts with an empty context, so it belongs to no simulated rank), "
        "while run_threads is running; scoring it alone would give results that real ranks never give. HINT: make "
        "synced calls from the rank's own thread, or run the helper in the rank's context -- "
        "pool.submit(contextvars.copy_context().run, reward, ...) or asyncio.to_thread -- so that the call belongs "
        "to that rank and behaves as on real ranks."
    )


# ============================================================================================ detection


def _accelerate_active() -> bool:
    # accelerate has no public way to ask whether a PartialState exists without creating one (which
    # initialises the process group): docs/internals.md, "Backends".
    mod = sys.modules.get("accelerate.state")
    if mod is None:
        return False
    shared: dict[str, Any] = getattr(mod.PartialState, "_shared_state", None) or {}
    return int(shared.get("num_processes", 1) or 1) > 1


# The single-process path reads WORLD_SIZE on every call; os.environ.get is slow for a missing key (it
# raises and catches KeyError), so read the underlying mapping where the platform has one
# (docs/internals.md, "Backends").
_ENV_DATA: Any = getattr(os.environ, "_data", None)
_WORLD_SIZE_KEY: Any = os.environ.encodekey("WORLD_SIZE") if _ENV_DATA is not None else "WORLD_SIZE"  # type: ignore[attr-defined]


def _env_world_size() -> str:
    if _ENV_DATA is None:  # pragma: no cover - platforms without os.environ._data
        return os.environ.get("WORLD_SIZE", "1")
    raw = _ENV_DATA.get(_WORLD_SIZE_KEY)
    if raw is None:
        return "1"
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _ray_joined() -> list[Any]:
    mod = sys.modules.get("syncreward.backends.ray")
    return [] if mod is None else mod.joined_backends()  # type: ignore[no-any-return]


# ============================================================================================ factories
# One per registered name (the registry below): the backend for a call's options.


_ONE_PROCESS = (None, b"1", "1")  # WORLD_SIZE as _ENV_DATA holds it where it says one process (or nothing)


def _auto(process_group: Any) -> Backend:
    """``backend="auto"``: the first backend in the documented order (the package docstring)."""
    override = _thread_rank.get()
    if override is not None:
        return override
    if _thread_ranks_running:  # a thread of this process that belongs to no thread-rank
        raise _not_a_thread_rank()
    if process_group is not None:
        return _torch(process_group)
    # Each step asks first whether its library is loaded at all (a dict lookup): a single process pays
    # little more than that on every call.
    modules = sys.modules
    if "syncreward.backends.ray" in modules and _ray_joined():
        if _accelerate_active() or torch_active():
            raise BackendError(
                "this process joined a Ray group and torch.distributed is initialised too (e.g. under Ray "
                "Train), so backend='auto' is ambiguous. HINT: pass backend='ray' to sync over the Ray group, "
                "or backend='torch' to sync over the torch.distributed job."
            )
        return _ray(None)
    if "accelerate.state" in modules and _accelerate_active():
        return _accelerate(None)
    if torch_active():
        return _torch(None)
    if _ENV_DATA is not None and _ENV_DATA.get(_WORLD_SIZE_KEY) in _ONE_PROCESS:
        return _LOCAL
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

    if not torch_active():
        return TorchDistributedBackend(process_group)  # raises the explanatory BackendError
    return cached("torch", process_group, lambda: TorchDistributedBackend(process_group))  # type: ignore[no-any-return]


def _accelerate(process_group: Any) -> Backend:
    from .accelerate import accelerate_backend

    if process_group is not None:
        raise BackendError("process_group= goes with backend='torch', not 'accelerate'")
    if not torch_active():
        return accelerate_backend()  # type: ignore[return-value]
    return cached("accelerate", None, accelerate_backend)  # type: ignore[no-any-return]


def _ray(process_group: Any) -> Backend:
    if process_group is not None:
        raise BackendError("process_group= goes with backend='torch', not 'ray'")
    from .ray import current_backend

    return current_backend()


# ============================================================================================ registry
# The backend names synced_reward(backend=...) accepts, each with its factory. Prose names the entries
# too: the package docstring, synced_reward's and docs/concepts.md (tests/test_backend_registry.py
# checks that they name every entry).
#
# To add a backend: write backends/<name>.py (the Backend protocol), add its factory above and one line to
# _FACTORIES, and name it in that prose. For "auto" to pick it, add a step to _auto and to the order in
# the package docstring.

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
        if type(spec) not in _BACKEND_TYPES:  # the Protocol check is slow next to a call: once per class
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


def resolver(spec: str | Backend, process_group: Any = None) -> Callable[[], Backend]:
    """What :func:`resolve_backend` does for these options, as a callable made once (at decoration).

    A registered name goes straight to its factory (a single-process call pays for no dispatch); a
    backend object still goes through :func:`resolve_backend`, which checks it on its first call.
    """
    factory = _FACTORIES.get(spec) if isinstance(spec, str) else None
    if factory is None:
        return functools.partial(resolve_backend, spec, process_group)
    return functools.partial(factory, process_group)
