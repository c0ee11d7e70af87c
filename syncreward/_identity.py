"""What makes two calls the same call: a reward's identity and the place it is called from.

Calls pair across ranks by their order on each rank; every call's header carries a fingerprint, and
ranks whose fingerprints differ raise :class:`~syncreward.MismatchError` together. The fingerprint is
made only of what every rank computes alike from the same program:

* :class:`Identity` (computed at decoration time, refreshed when a sibling is decorated): the module
  and qualified name of the function (or the callable instance's class), and those features that tell
  it from a *sibling* -- its ``__name__`` (TRL logs rewards by it), a ``functools.partial``'s plain
  arguments, a closure's captured values, the plain attributes of a callable instance or of a bound
  method's object -- whose values differ between the siblings this process decorated. Plain values
  are written out by :func:`plain_repr`, which never includes a memory address, a ``set``'s order or
  an object's ``repr()``; other values stand for their type's name only. So two rewards that differ
  only in non-plain state (two instances holding different models) are not told apart.
* :func:`call_site` (every call): the module, function and line (relative to the function's first
  line, so edits elsewhere in a file do not matter) of the code that called the synced function. A call
  made from an event loop's task or a thread pool (no user frame directly above it) is the same site on
  every rank. So a call on some ranks only -- a callback that scores under ``if is_main_process`` at
  the same training step -- does not pair with the other ranks' training call.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import os
import threading
import weakref
from types import FrameType
from typing import Any

from .backends import _context_backend

__all__ = ["Identity", "call_site", "features", "plain_repr", "innermost", "reward_target"]

MAX_REPR = 2048  # characters of plain configuration written out per reward; the rest is summarised
_MAX_ITEMS = 64  # items of a list/tuple/dict written out; longer ones also carry their length


def plain_repr(value: Any, depth: int = 0) -> str:
    """A representation of ``value`` that is the same in every process running the same program.

    Plain values (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, and lists, tuples and
    str-keyed dicts of them) are written out; anything else is ``<TypeName>``.
    """
    if value is None or isinstance(value, (bool, int, float)):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 256 else f"{value[:256]!r}...<{len(value)} chars>"
    if isinstance(value, bytes):
        return repr(value[:64]) + (f"...<{len(value)} bytes>" if len(value) > 64 else "")
    if depth < 3 and isinstance(value, (list, tuple)):
        items = ", ".join(plain_repr(v, depth + 1) for v in value[:_MAX_ITEMS])
        more = f", ...<{len(value)} items>" if len(value) > _MAX_ITEMS else ""
        if isinstance(value, list):
            return f"[{items}{more}]"
        return f"({items}{more},)" if len(value) == 1 else f"({items}{more})"
    if depth < 3 and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        keys = sorted(value)
        items = ", ".join(f"{k}={plain_repr(value[k], depth + 1)}" for k in keys[:_MAX_ITEMS])
        more = f", ...<{len(keys)} keys>" if len(keys) > _MAX_ITEMS else ""
        return f"{{{items}{more}}}"
    return f"<{type(value).__qualname__}>"


def _attributes(obj: Any) -> dict[str, str]:
    """An object's configuration: each instance attribute (private ones too), as :func:`plain_repr` writes it."""
    try:
        attrs = vars(obj)
    except TypeError:  # no __dict__ (slots, builtins)
        slots = [s for k in type(obj).__mro__ for s in getattr(k, "__slots__", ()) if isinstance(s, str)]
        attrs = {s: getattr(obj, s) for s in slots if hasattr(obj, s)}
    if not isinstance(attrs, dict):
        return {}
    return {f".{k}": plain_repr(v) for k, v in attrs.items() if isinstance(k, str)}


def _qualified(target: Any) -> str:
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if not isinstance(name, str):
        name = type(target).__qualname__
    return f"{module}.{name}" if isinstance(module, str) else name


def innermost(fn: Any) -> Any:
    """The callable behind ``functools.partial`` layers."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def reward_target(fn: Any) -> tuple[Any, Any]:
    """``(what names the reward, what configures it)``, the same in every process.

    A function names itself; a bound method, its function (configured by its object); a callable
    instance, its class (configured by the instance). Never ``repr()``: that holds a memory address.
    """
    inner = innermost(fn)
    owner = getattr(inner, "__self__", None)
    target = getattr(inner, "__func__", inner)  # bound method -> its function
    if owner is not None and not inspect.ismodule(owner):
        return target, owner
    if not (inspect.isfunction(target) or inspect.isbuiltin(target) or inspect.isclass(target)):
        return type(target), target
    return target, None


def features(fn: Any, display_name: str) -> tuple[str, dict[str, str]]:
    """``(qualified name, features)`` of a reward: what could tell it apart from a sibling.

    The qualified name is the function's, or the callable instance's class's (module included). The
    features are its ``__name__``, a ``functools.partial``'s plain arguments (outermost partial first),
    the values a closure captured (``make_reward(target)``'s inner function) and the plain attributes
    of a callable instance or of a bound method's object.
    """
    found: dict[str, str] = {"__name__": repr(display_name)}
    inner, layer = fn, 0
    while isinstance(inner, functools.partial):
        for i, a in enumerate(inner.args):
            found[f"partial{layer}.arg{i}"] = plain_repr(a)
        for k, v in inner.keywords.items():
            found[f"partial{layer}.{k}"] = plain_repr(v)
        inner, layer = inner.func, layer + 1
    target, configured = reward_target(inner)
    code = getattr(target, "__code__", None)
    cells = getattr(target, "__closure__", None) or ()
    for name, cell in zip(getattr(code, "co_freevars", ()), cells, strict=False):
        with contextlib.suppress(ValueError):  # an empty cell
            found[f"closure.{name}"] = plain_repr(cell.cell_contents)  # a factory's make_reward(target=10)
    if configured is not None:
        found.update(_attributes(configured))
    return _qualified(target), found


class _Member:
    __slots__ = ("__weakref__", "base", "features", "scope")

    def __init__(self, base: str, found: dict[str, str], scope: int) -> None:
        self.base = base
        self.features = found
        self.scope = scope


def _scope() -> int:
    """The simulated rank a reward is decorated on (``run_threads``), else 0: the process.

    Thread-ranks share one process, but each must see only its own siblings (and the process's), as a
    real rank would: otherwise state that differs between ranks would look like state that differs
    between siblings.
    """
    backend = _context_backend.get()
    return 0 if backend is None else id(backend)


class Identity:
    """A decorated reward's identity: its qualified name plus the features that tell it from its siblings.

    *Siblings* are the rewards of this process decorated from the same function or class (two
    ``functools.partial`` of one function, two instances of one class). Only the features whose values
    differ between siblings enter the identity -- ``target=10`` vs ``target=20`` -- never the ones they
    share. So state that differs between ranks but not between siblings (a ``device="cuda:1"`` or a
    ``rank`` attribute every instance on that rank holds) never makes the ranks disagree, while two
    siblings called in a different order on two ranks do. Every rank that runs the same program
    decorates the same siblings, so every rank computes the same identity.
    """

    __slots__ = ("_key", "_member", "_version")

    def __init__(self, fn: Any, display_name: str) -> None:
        base, found = features(fn, display_name)
        scope = _scope()
        self._member = _Member(base, found, scope)
        self._key = ""
        self._version = -1
        with _lock:
            siblings = _registry.setdefault((scope, base), weakref.WeakSet())
            siblings.add(self._member)
            weakref.finalize(self._member, _bump)
            _bump()

    def key(self) -> str:
        """The identity as a string (the same on every rank); recomputed when a sibling comes or goes."""
        if self._version != _version[0]:
            self._key, self._version = self._compute(), _version[0]
        return self._key

    def _compute(self) -> str:
        me = self._member
        with _lock:
            scopes = {0, me.scope}
            others = [m.features for sc in scopes for m in _registry.get((sc, me.base), ()) if m is not me]
        absent = "<absent>"
        differing = sorted(
            name
            for name in set(me.features).union(*others)
            if any(o.get(name, absent) != me.features.get(name, absent) for o in others)
        )
        text = me.base
        if differing:
            text += "[" + ", ".join(f"{k}={me.features.get(k, absent)}" for k in differing) + "]"
        return text if len(text) <= MAX_REPR else f"{text[:MAX_REPR]}...<{len(text)} chars>"


_lock = threading.Lock()
_registry: dict[tuple[int, str], weakref.WeakSet[_Member]] = {}  # (scope, qualified name) -> siblings
_version = [0]  # bumped whenever a reward is decorated or released: identities are recomputed


def _bump() -> None:
    _version[0] += 1


# --------------------------------------------------------------------------------------------- call site

# Frames of these files are the interpreter's scheduling machinery, not a caller: a coroutine run as a
# task, or a function run by a pool's worker. Their line numbers differ between Python versions.
_MACHINERY = tuple(os.path.dirname(m.__file__) + os.sep for m in (asyncio, concurrent.futures) if m.__file__) + (
    (threading.__file__,) if threading.__file__ else ()
)
_NO_CALLER = "<an event loop task or a thread pool>"
_sites: dict[tuple[Any, int], str] = {}


def call_site(frame: FrameType | None) -> str:
    """Where a synced call comes from: ``module:function+line`` of ``frame`` (the caller's frame).

    The line is counted from the function's first line, and the module is its import name, so ranks
    whose copies of the code live at different paths agree.
    """
    if frame is None:
        return _NO_CALLER
    code = frame.f_code
    key = (code, frame.f_lasti)  # the call instruction: cheaper to read than the line number
    site = _sites.get(key)
    if site is None:
        if code.co_filename.startswith(_MACHINERY):
            site = _NO_CALLER
        else:
            module = frame.f_globals.get("__name__", "?")
            name = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python >= 3.11
            site = f"{module}:{name}+{(frame.f_lineno or 0) - code.co_firstlineno}"
        if len(_sites) < 4096:  # bounded: generated code could make endless code objects
            _sites[key] = site
    return site
