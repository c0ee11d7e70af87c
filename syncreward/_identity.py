"""What makes two calls the same call: a reward's identity and the place it is called from.

Calls pair across ranks by their order on each rank; every call's header carries a fingerprint, and
ranks whose fingerprints differ raise :class:`~syncreward.MismatchError` together. The fingerprint is
made only of what every rank computes alike from the same program:

Nothing that depends on the process -- what else it decorated, still holds alive or has collected,
the name its script was imported under, the path its code lives at -- enters it:

* :class:`Identity`: the module and qualified name of the function (or the callable instance's class;
  the script's module is ``__main__`` in every process, ``__mp_main__`` included), its configuration
  taken when it is decorated -- a ``functools.partial``'s plain arguments, a closure's captured values,
  the public plain attributes of a callable instance or of a bound method's object (for a method
  decorated in its class body, of the object it is called on: :func:`owner_config`), less every entry
  whose name is private (``_cache``) or says it is placed per rank (``device``, ``local_rank``,
  ``process_index``, ``seed``; a device string such as ``"cuda:3"`` counts as ``<device>``) -- and
  the ``__name__`` of the synced wrapper, read at each call; a lambda's or ``exec``'d function's
  name also carries a digest of its code (:func:`code_digest`). Plain values are written out by
  :func:`plain_repr`, which never includes a memory address, a ``set``'s order or an object's
  ``repr()``; other values stand for their type's name only. That text is shown and compared; beside it,
  :attr:`Identity.digest` compares the configuration whole (the text cuts long values short) under
  ``_canonical``'s :data:`~syncreward._canonical.EXACT` rule (``1``, ``1.0`` and ``True`` differ). So two
  rewards that differ only in non-plain state (two instances holding different models) are not told apart.
* :func:`call_site` (every call): the module, function and line (relative to the function's first
  line, so edits elsewhere in a file do not matter) and the call instruction's offset of the code that
  called the synced function; for code without a file of its own (``exec``, a notebook cell), a
  module's top level and a lambda, also a digest of that code's compiled content. A call made from an
  event loop's task or a thread pool (no user frame directly above it) is the same site on every rank.
  So a call on some ranks only -- a callback that scores under ``if is_main_process`` at the same
  training step -- does not pair with the other ranks' training call. What is compared is that
  path-independent key; messages show ``file:line in function`` (:class:`Site`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import functools
import hashlib
import inspect
import os
import re
import threading
import weakref
from types import FrameType
from typing import Any

from ._canonical import EXACT, Budget, NotPlain, Opaque, to_bytes

__all__ = [
    "NO_CALLER",
    "Identity",
    "Site",
    "call_site",
    "code_digest",
    "config_digest",
    "config_repr",
    "features",
    "innermost",
    "module_name",
    "owner_config",
    "plain_repr",
    "reward_target",
]

MAX_REPR = 2048  # characters of plain configuration written out per reward; the rest is summarised
_MAX_ITEMS = 64  # items of a list/tuple/dict written out; longer ones also carry their length


def plain_repr(value: Any, depth: int = 0) -> str:
    """A representation of ``value`` that is the same in every process running the same program.

    Plain values (``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, and lists, tuples and
    str-keyed dicts of them) are written out; an ``Enum`` member is ``<TypeName.MEMBER>``; anything else is
    ``<TypeName>``.
    """
    return _repr(value, depth, config=False)


def config_repr(value: Any, depth: int = 0) -> str:
    """:func:`plain_repr` of a reward's configuration, without what differs between ranks by design.

    A string that names a device (``"cuda:3"``, ``"cpu"``) is written ``<device>``, as a ``torch.device``
    is, and a dict's entries under a private or per-rank key (:func:`_per_rank`) are left out.
    """
    return _repr(value, depth, config=True)


def _repr(value: Any, depth: int, config: bool) -> str:
    if value is None or isinstance(value, (bool, int, float)):
        try:
            return repr(value)
        except ValueError:  # an int past str()'s digit limit: its size and a digest of its bytes
            big = int(value)  # type: ignore[arg-type]  # only an int's repr raises
            digest = hashlib.blake2b(to_bytes(big, EXACT), digest_size=8).hexdigest()
            return f"<int of {big.bit_length()} bits #{digest}>"
    if isinstance(value, str):
        if config and len(value) <= 32 and _DEVICE.fullmatch(value):
            return "<device>"
        return repr(value) if len(value) <= 256 else f"{value[:256]!r}...<{len(value)} chars>"
    if isinstance(value, bytes):
        return repr(value[:64]) + (f"...<{len(value)} bytes>" if len(value) > 64 else "")
    if depth < 3 and isinstance(value, (list, tuple)):
        items = ", ".join(_repr(v, depth + 1, config) for v in value[:_MAX_ITEMS])
        more = f", ...<{len(value)} items>" if len(value) > _MAX_ITEMS else ""
        if isinstance(value, list):
            return f"[{items}{more}]"
        return f"({items}{more},)" if len(value) == 1 else f"({items}{more})"
    if depth < 3 and isinstance(value, dict) and all(isinstance(k, str) for k in value):
        keys = sorted(k for k in value if not (config and _per_rank(k)))
        items = ", ".join(f"{k}={_repr(value[k], depth + 1, config)}" for k in keys[:_MAX_ITEMS])
        more = f", ...<{len(keys)} keys>" if len(keys) > _MAX_ITEMS else ""
        return f"{{{items}{more}}}"
    if isinstance(value, enum.Enum):  # Mode.STRICT: its name is the same in every process (its value may not be)
        return f"<{type(value).__qualname__}.{value.name}>"
    return f"<{type(value).__qualname__}>"


def _comparable(value: Any, left: list[int], depth: int = 0) -> Any:
    """A reward's configuration value as it is compared between ranks: ``_canonical``'s plain data.

    What :func:`config_repr` writes out, but whole (no value is cut short) and exact (``_canonical``'s
    :data:`~syncreward._canonical.EXACT` rule: ``1``, ``1.0`` and ``True`` differ, as in the text); what
    differs between ranks by design is left out alike (per-rank keys; a device string is ``<device>``), and
    what has no canonical bytes stands for its name (:class:`~syncreward._canonical.Opaque`: an object by its
    type, an enum member by its type and name). ``left``: elements left to convert; past them, :class:`NotPlain`.
    """
    left[0] -= 1
    t = type(value)
    if value is None or t in _EXACT_SCALARS:
        if t is str and len(value) <= 32 and _DEVICE.fullmatch(value):
            return _AT_DEVICE
        return value
    if isinstance(value, enum.Enum):
        return Opaque(f"{type(value).__qualname__}.{value.name}")
    if depth < _MAX_COMPARED_DEPTH and isinstance(value, (list, tuple, dict)):
        left[0] -= len(value)
        if left[0] < 0:
            raise NotPlain("the configuration is too large to compare whole")
        if isinstance(value, list):
            return [_comparable(v, left, depth + 1) for v in value]
        if isinstance(value, tuple):  # a NamedTuple: as a tuple
            return tuple(_comparable(v, left, depth + 1) for v in value)
        if all(isinstance(k, str) for k in value):
            return {str(k): _comparable(v, left, depth + 1) for k, v in value.items() if not _per_rank(k)}
    if isinstance(value, (int, float, str, bytes)):  # a subclass (a str subclass, a numpy scalar): its repr
        return Opaque(f"{type(value).__qualname__}:{value!r}")
    return Opaque(type(value).__qualname__)


_EXACT_SCALARS = frozenset({bool, int, float, str, bytes})
_AT_DEVICE = Opaque("<device>")
_MAX_COMPARED_DEPTH = 16  # deeper values stand for their type (a self-referencing list ends here)
# a configuration larger than this is compared by its text only (a closure over a dataset)
_COMPARED = Budget(items=1 << 16, size=4 << 20, depth=_MAX_COMPARED_DEPTH + 1)


def config_digest(found: dict[str, Any]) -> str:
    """A digest of a configuration (``{name: value}``, as :func:`_comparable` compares it), alike on every rank.

    ``""`` when it is empty or too large to compare whole (then its text, :func:`config_repr`, is compared).
    """
    if not found:
        return ""
    try:
        left = [_COMPARED.items]
        raw = to_bytes({k: _comparable(v, left) for k, v in found.items()}, EXACT, _COMPARED)
    except NotPlain:
        return ""
    return hashlib.blake2b(raw, digest_size=8).hexdigest()


def _per_rank(name: str) -> bool:
    """Whether a configuration name says its value is private or placed per rank (see :func:`config_repr`)."""
    return name.startswith("_") or not _PER_RANK_WORDS.isdisjoint(_WORD.split(name.lower()))


_WORD = re.compile(r"[^a-z0-9]+")
# A name holding one of these words is left out of a reward's identity: its value differs between the ranks
# of one job by design (``device="cuda:{rank}"``, ``local_rank``, accelerate's ``process_index`` and
# ``is_main_process``, a per-rank ``seed``, a Ray ``worker_id``), never between configured copies of a reward.
_PER_RANK_WORDS = frozenset(
    {"rank", "ranks", "device", "devices", "gpu", "gpus", "cuda", "process", "seed", "worker", "pid"}
)
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|npu|hpu|mlu|musa|xla|meta|ipu|mtia|privateuseone)(:\d+)?")


def _attributes(obj: Any) -> dict[str, Any]:
    """An object's configuration: its public instance attributes, as found.

    :func:`config_repr` writes them for the text, :func:`_comparable` for the digest.
    """
    try:
        attrs = vars(obj)
    except TypeError:  # no __dict__ (slots, builtins)
        slots = [s for k in type(obj).__mro__ for s in getattr(k, "__slots__", ()) if isinstance(s, str)]
        attrs = {s: getattr(obj, s) for s in slots if hasattr(obj, s)}
    if not isinstance(attrs, dict):
        return {}
    return {f".{k}": v for k, v in attrs.items() if isinstance(k, str) and not _per_rank(k)}


def module_name(module: Any) -> Any:
    """A module's name as every rank of one program knows it: the script is ``__main__`` everywhere.

    ``multiprocessing``'s spawn and forkserver children import the parent's script as ``__mp_main__``
    (so that its ``if __name__ == "__main__":`` block does not run again); pickle resolves it the same way.
    """
    return "__main__" if module == "__mp_main__" else module


def _qualified(target: Any) -> str:
    module = module_name(getattr(target, "__module__", None))
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


def features(fn: Any) -> tuple[str, dict[str, Any]]:
    """``(qualified name, configuration)`` of a reward: what tells it from another copy of the same code.

    The qualified name is the function's, or the callable instance's class's (module included, the
    script's as ``__main__``). The configuration is a ``functools.partial``'s plain arguments (outermost
    partial first), the values a closure captured (``make_reward(target)``'s inner function) and the
    public attributes of a callable instance or of a bound method's object, as :func:`config_repr`
    writes them, less every entry whose name is private or per rank (:func:`_per_rank`). The values are
    returned as found: :func:`config_repr` writes them for the text, :func:`_comparable` for the digest.
    """
    found: dict[str, Any] = {}
    inner, layer = fn, 0
    while isinstance(inner, functools.partial):
        for i, a in enumerate(inner.args):
            found[f"partial{layer}.arg{i}"] = a
        for k, v in inner.keywords.items():
            if not _per_rank(k):
                found[f"partial{layer}.{k}"] = v
        inner, layer = inner.func, layer + 1
    target, configured = reward_target(inner)
    code = getattr(target, "__code__", None)
    cells = getattr(target, "__closure__", None) or ()
    for name, cell in zip(getattr(code, "co_freevars", ()), cells, strict=False):
        if _per_rank(name):
            continue
        with contextlib.suppress(ValueError):  # an empty cell
            found[f"closure.{name}"] = cell.cell_contents  # a factory's make_reward(target=10)
    if configured is not None:
        found.update(_attributes(configured))
    qualified = _qualified(target)
    if code is not None and ("<lambda>" in qualified or getattr(code, "co_filename", "").startswith("<")):
        # lambdas (reward_funcs=[lambda ...: ..., lambda ...: ...]) and exec'd functions share one name and
        # often no configuration: their code tells them apart
        qualified += f"#{code_digest(code)}"
    return qualified, found


class Identity:
    """A decorated reward's identity: its qualified name, its configuration, the name it is logged by.

    Made only of what every rank running the same program derives alike from the reward itself
    (:func:`features`, taken when it is decorated) -- never of what else this process decorated, still
    holds alive or has collected -- plus the ``__name__`` of the synced wrapper, read at each call
    (:meth:`named_by`): TRL logs rewards by it, and ``judge.__name__ = "judge_small"`` after decorating
    tells two otherwise equal judges apart. :meth:`key` is the text (shown and compared); :attr:`digest`
    (:func:`config_digest`) is compared beside it.
    """

    __slots__ = ("_base", "_key", "_name", "_named", "_short", "digest", "method")

    def __init__(self, fn: Any, display_name: str) -> None:
        base, found = features(fn)
        # a method decorated in its class body: the object it is called on configures it (:func:`owner_config`)
        code = getattr(fn, "__code__", None)
        self.method = bool(
            inspect.isfunction(fn)
            and code is not None
            and code.co_argcount >= 1
            and code.co_varnames[0] == "self"
            and "." in fn.__qualname__
            and not fn.__qualname__.endswith("<locals>." + fn.__name__)
        )
        self._base = base + ("[" + ", ".join(f"{k}={config_repr(v)}" for k, v in found.items()) + "]" if found else "")
        # what is compared beside the text: the configuration whole and exact (the text cuts long values short)
        self.digest = config_digest(found)
        self._short = base.split("#", 1)[0].rsplit(".", 1)[-1]  # the name it is logged by unless renamed
        self._named: Any = None
        self._name = display_name
        self._key = self._compute(display_name)

    def named_by(self, wrapper: Any) -> None:
        """Read the reward's ``__name__`` from ``wrapper`` (the synced function) at every call."""
        self._named = wrapper

    def key(self) -> str:
        """The identity as a string (the same on every rank); recomputed when the wrapper is renamed."""
        named = self._named
        if named is not None:
            name = named.__name__
            if name is not self._name:
                self._key, self._name = self._compute(name), name
        return self._key

    def _compute(self, name: Any) -> str:
        text = self._base if name == self._short else f"{self._base} named {plain_repr(name)}"
        return text if len(text) <= MAX_REPR else f"{text[:MAX_REPR]}...<{len(text)} chars>"


_owners: dict[int, tuple[Any, tuple[str, str]]] = {}  # id(object) -> (a weak reference to it, its configuration)


def owner_config(obj: Any) -> tuple[str, str]:
    """The configuration of the object a method decorated in its class body is called on: ``(text, digest)``.

    The text is ``[.k=v, ...]`` (:func:`config_repr`), the digest :func:`config_digest`'s. Like a callable
    instance's (:func:`features`), taken once per object -- at its first synced call, before any rank has
    scored with it -- so state the method changes later (a call counter, on the scoring rank only) never
    enters it.
    """
    entry = _owners.get(id(obj))
    if entry is not None and entry[0]() is obj:
        return entry[1]  # type: ignore[no-any-return]
    attrs = _attributes(obj)
    text = "[" + ", ".join(f"{k}={config_repr(v)}" for k, v in attrs.items()) + "]" if attrs else ""
    found = (text, config_digest(attrs))
    try:
        ref = weakref.ref(obj)
    except TypeError:  # not weakly referenceable (slots without __weakref__): taken at every call
        return found
    if len(_owners) >= 4096:
        for key in [k for k, (r, _) in _owners.items() if r() is None]:
            _owners.pop(key, None)
    if len(_owners) < 4096:
        _owners[id(obj)] = (ref, found)
    return found


# --------------------------------------------------------------------------------------------- call site

# Frames of these files are the interpreter's scheduling machinery, not a caller: a coroutine run as a
# task, or a function run by a pool's worker. Their line numbers differ between Python versions.
_MACHINERY = tuple(os.path.dirname(m.__file__) + os.sep for m in (asyncio, concurrent.futures) if m.__file__) + (
    (threading.__file__,) if threading.__file__ else ()
)
_NO_CALLER = "<an event loop task or a thread pool>"


class Site:
    """Where a synced call comes from: ``key`` is compared between ranks, ``shown`` is shown to the user.

    ``key`` is path-independent (module import name, qualified name, line relative to the function's first
    line, the call instruction's offset and, for code that has no file of its own, a digest of the
    code), so ranks whose copies of the program live at different paths agree; ``shown`` is
    ``file:line in function`` as this rank sees it.
    """

    __slots__ = ("key", "shown")

    def __init__(self, key: str, shown: str) -> None:
        self.key = key
        self.shown = shown

    def __repr__(self) -> str:
        return f"Site({self.key!r}, {self.shown!r})"


NO_CALLER = Site(_NO_CALLER, _NO_CALLER)
_sites: dict[tuple[int, int], tuple[Any, Site]] = {}  # (id(code), offset) -> (the code, kept alive; its site)


def call_site(frame: FrameType | None) -> Site:
    """Where a synced call comes from: the :class:`Site` of ``frame`` (the caller's frame).

    Cached per call instruction: reading it costs one dict lookup.
    """
    if frame is None:
        return NO_CALLER
    code = frame.f_code
    entry = _sites.get((id(code), frame.f_lasti))  # the call instruction: cheaper to read than the line
    if entry is not None and entry[0] is code:
        return entry[1]  # type: ignore[no-any-return]
    site = _site_of(frame) if not code.co_filename.startswith(_MACHINERY) else NO_CALLER
    if len(_sites) < 4096:  # bounded: generated code could make endless code objects
        _sites[(id(code), frame.f_lasti)] = (code, site)
    return site


def _site_of(frame: FrameType) -> Site:
    code = frame.f_code
    module = module_name(frame.f_globals.get("__name__", "?"))
    name = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python >= 3.11
    line = frame.f_lineno or 0
    key = f"{module}:{name}+{line - code.co_firstlineno}@{frame.f_lasti}"
    if code.co_filename.startswith("<") or name.endswith("<module>") or "<lambda>" in name:
        # exec'd code (a notebook cell), a module's top level, a lambda: many share one name and first line
        key += f"#{code_digest(code)}"
    column = ""
    positions = getattr(code, "co_positions", None)  # Python >= 3.11
    if positions is not None:
        for i, pos in enumerate(positions()):
            if i == frame.f_lasti // 2:
                column = f":{pos[2] + 1}" if pos[2] is not None else ""
                break
    return Site(key, f"{code.co_filename}:{line}{column} in {name}")


def code_digest(code: Any) -> str:
    """A digest of a code object's compiled content, the same in every process running the same program.

    Built from the bytecode, the names and the constants (nested code objects by their own content), never
    from ``hash()`` (salted per process), ``marshal`` (which depends on reference counts) or the file path.
    """
    h = hashlib.blake2b(digest_size=6)
    _digest_into(h, code, 0)
    return h.hexdigest()


def _digest_into(h: Any, value: Any, depth: int) -> None:
    if hasattr(value, "co_code"):
        h.update(b"C")
        h.update(value.co_code)
        for names in (value.co_names, value.co_varnames, value.co_freevars, value.co_cellvars):
            h.update("\0".join(names).encode("utf-8", "backslashreplace") + b"\1")
        if depth < 16:
            for const in value.co_consts:
                _digest_into(h, const, depth + 1)
    elif isinstance(value, (tuple, frozenset)):
        parts = []
        for v in value if depth < 16 else ():
            sub = hashlib.blake2b(digest_size=6)
            _digest_into(sub, v, depth + 1)
            parts.append(sub.digest())
        if isinstance(value, frozenset):
            parts.sort()  # a frozenset's order depends on the process's string hash salt
        h.update((b"T" if isinstance(value, tuple) else b"F") + b"".join(parts) + b"\2")
    else:
        h.update(f"{type(value).__name__}:{value!r}".encode("utf-8", "backslashreplace") + b"\3")
