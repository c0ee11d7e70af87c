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

This package's face re-exports the two halves behind it: ``_resolve`` (the registry of names and
factories, and ``"auto"``'s order) and ``_cache`` (one backend per job or process group, released when
it is gone). ``_protocol`` holds the contract (:class:`Backend`) and its optional capabilities.
"""

from __future__ import annotations

from ._protocol import Backend
from ._resolve import resolve_backend
from .local import LocalBackend

__all__ = ["Backend", "LocalBackend", "resolve_backend"]
