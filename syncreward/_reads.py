"""Which keyword arguments a function can read: decided from the code that runs, once per code object.

TRL hands every reward ``prompts``, ``completions``, ``completion_ids`` and every dataset column; most
rewards name two of them and never touch their ``**kwargs``. A column that only reaches a ``**kwargs``
the function never reads need not travel. :func:`readable_keywords` says which keyword names the code
that actually runs can read: its named parameters, or ``None`` -- *any* name -- whenever its ``**kwargs``
might be read. It is conservative; each of these means "may read it" (``None``):

* the ``**kwargs`` local is loaded anywhere in the code (``LOAD_FAST`` and every other opcode that
  loads a fast local or a cell, Python 3.10-3.13): passed on (``helper(**kwargs)``, a decorator's
  ``*args, **kwargs`` wrapper), indexed, iterated, even after being reassigned. Only storing to or
  deleting it is not a read;
* it is captured by a closure, a nested function, a lambda or a comprehension (a cell variable);
* the code, or code nested in it, names something that can reach the frame's locals: ``locals``,
  ``vars``, ``dir``, ``eval``, ``exec``, ``breakpoint``, ``sys._getframe``, ``inspect.currentframe`` and
  ``inspect.stack``/``trace``/``getargvalues``, a frame's or traceback's ``f_locals``/``f_back``/``tb_frame``, ...;
* code that cannot be seen: a builtin or C function, a class, a callable object whose ``__call__`` is
  not a Python function, a ``functools.partial`` of any of those.

What runs is what is inspected: a function made by ``functools.wraps`` is the wrapper's code (its
``__wrapped__`` is what the wrapper calls, and only through what the wrapper passes on); a bound
method, ``staticmethod``, ``classmethod`` or ``functools.partial`` is the function it calls (a subclass
of one of those is a callable object: its ``__call__`` runs first); a callable object is its class's
``__call__``. Generators and ``async def`` functions are inspected like any other. The code that runs
can change: IPython's autoreload assigns an edited function's ``__code__`` to the old function object.
:func:`running_function` names the function object whose ``__code__`` runs, so a caller that keeps
an answer can see when it went stale (``_binding.Binder`` does, at every call).
A call that reaches the frame from code elsewhere (a helper of another module calling
``sys._getframe(1)``) is out of sight; ``include=`` forces a column in.
"""

from __future__ import annotations

import dis
import functools
import inspect
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["readable_in", "readable_keywords", "running_function"]

#: Names that reach a frame's locals without naming them: a code object (or code nested in it) that names
#: one of these (as a global, a builtin, an attribute or a method) may read its ``**kwargs``.
FRAME_READERS = frozenset(
    {
        "locals",
        "vars",
        "dir",
        "eval",
        "exec",
        "breakpoint",
        "set_trace",
        "_getframe",
        "_getframemodulename",
        "currentframe",
        "stack",
        "trace",
        "getouterframes",
        "getinnerframes",
        "getargvalues",
        "f_locals",
        "f_back",
        "tb_frame",
        "gi_frame",
        "cr_frame",
        "ag_frame",
        "settrace",
        "setprofile",
    }
)

#: Opcodes that only store to or delete a local: not a read of its value.
_WRITES = frozenset({"STORE_FAST", "DELETE_FAST", "STORE_FAST_STORE_FAST"})
_LOCAL_OPS = frozenset(dis.haslocal) | frozenset(dis.hasfree)
_LOCAL_WORDS = ("FAST", "DEREF", "CLOSURE", "CELL")  # opcodes of later Pythons that touch a fast local or a cell


def readable_keywords(fn: Any) -> frozenset[str] | None:
    """The keyword names ``fn`` can read when called, or ``None`` if it may read any (see the module).

    A keyword not in the set reaches only a ``**kwargs`` that the function provably never reads.
    """
    function = running_function(fn)
    return None if function is None else readable_in(function.__code__)


@functools.lru_cache(maxsize=1024)
def readable_in(code: types.CodeType) -> frozenset[str] | None:
    """What ``code`` can read (cached per code object: one decision per function, however often wrapped)."""
    named = code.co_argcount + code.co_kwonlyargcount
    names = frozenset(code.co_varnames[:named])
    if not code.co_flags & inspect.CO_VARKEYWORDS:
        return names
    var_kw = code.co_varnames[named + bool(code.co_flags & inspect.CO_VARARGS)]
    if var_kw in code.co_cellvars or _reaches_frames(code) or _loads(code, var_kw):
        return None
    return names


def running_function(fn: Any, depth: int = 0) -> types.FunctionType | None:
    """The Python function whose ``__code__`` runs when ``fn`` is called (``None``: code that cannot be seen).

    Only the exact types are unwrapped: a subclass of ``functools.partial`` or ``staticmethod`` may define
    its own ``__call__``, so it is inspected as the callable object it is.
    """
    if depth > 16:  # a pathological chain of partials and bound methods
        return None
    kind = type(fn)
    if kind is staticmethod or kind is classmethod or kind is types.MethodType:
        return running_function(fn.__func__, depth + 1)
    if kind is functools.partial:
        return running_function(fn.func, depth + 1)
    if isinstance(fn, types.FunctionType):
        return fn
    if isinstance(fn, type) or not callable(fn):
        return None  # a class (its __new__/__init__/metaclass) or something uncallable: not analysed
    call = inspect.getattr_static(kind, "__call__", None)
    return call if isinstance(call, types.FunctionType) else None


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and every code object nested in it (functions, lambdas, comprehensions, classes)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _reaches_frames(code: types.CodeType) -> bool:
    return any(not FRAME_READERS.isdisjoint(c.co_names) for c in _codes(code))


def _loads(code: types.CodeType, name: str) -> bool:
    """Whether any instruction of ``code`` may read the local ``name`` (anything but a plain store or delete)."""
    for ins in dis.get_instructions(code):
        if ins.opcode not in _LOCAL_OPS and not any(w in ins.opname for w in _LOCAL_WORDS):
            continue
        arg = ins.argval
        if (arg == name or (isinstance(arg, tuple) and name in arg)) and ins.opname not in _WRITES:
            return True
    return False
