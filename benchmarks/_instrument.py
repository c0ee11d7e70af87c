"""Instrumentation for the exchange benchmark, installed inside a rank process.

* :class:`CollectiveCounter` wraps the collective methods of ``torch.distributed.ProcessGroup`` (the
  class, so it sees every group: the default group used by ``all_gather_object`` /
  ``broadcast_object_list`` / ``dist.all_gather``, and the two gloo groups syncreward's torch backend
  creates for itself). Only calls made while the counter is *armed* are counted, so the harness's own
  barriers are not. For each collective it records the logical bytes this rank sends to other ranks and
  the size of the receive buffer the collective fills on this rank.
* :class:`PhaseTimer` attributes the wall time of a synced call to exclusive phases (encode, collectives,
  decode, ...) by wrapping functions inside ``syncreward`` for the duration of a profiling pass.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CollectiveCounter", "PhaseTimer"]


def _nbytes(t: Any) -> int:
    return int(t.numel() * t.element_size())


class CollectiveCounter:
    """Counts collectives, bytes sent and receive buffers of this rank (while armed)."""

    METHODS = (
        "allgather",
        "alltoall_base",
        "all_to_all_single",
        "broadcast",
        "allgather_into_tensor_coalesced",
        "gather",
        "scatter",
        "send",
        "recv",
    )

    def __init__(self) -> None:
        self.armed = False
        self.reset()
        self._saved: dict[tuple[type, str], Any] = {}

    def reset(self) -> None:
        self.calls: list[tuple[str, int, int]] = []  # (op, bytes sent to other ranks, receive buffer bytes)

    def snapshot(self) -> dict[str, Any]:
        return {
            "collectives": len(self.calls),
            "ops": [c[0] for c in self.calls],
            "detail": [list(c) for c in self.calls],
            "sent": sum(c[1] for c in self.calls),
            "recv_total": sum(c[2] for c in self.calls),
            "recv_peak": max((c[2] for c in self.calls), default=0),
        }

    # the job's process groups (ProcessGroup) and syncreward's own gloo groups (ProcessGroupGloo objects,
    # whose collectives are methods of c10d's Backend class); a ProcessGroup's collective reaches its
    # backend in C++, so nothing is counted twice
    CLASSES = (dist.ProcessGroup, torch._C._distributed_c10d.Backend)

    def install(self) -> None:
        for cls in self.CLASSES:
            for name in self.METHODS:
                if (cls, name) in self._saved or name not in cls.__dict__:
                    continue
                # keep the raw class attribute (pybind11's instancemethod): getattr() would return the unbound
                # builtin, which does not bind ``self`` when put back
                self._saved[(cls, name)] = cls.__dict__.get(name)
                setattr(cls, name, self._wrap(name, getattr(cls, name)))

    def uninstall(self) -> None:
        for (cls, name), raw in self._saved.items():
            if raw is None:
                delattr(cls, name)
            else:
                setattr(cls, name, raw)
        self._saved.clear()

    @contextmanager
    def armed_for(self) -> Iterator[None]:
        self.reset()
        self.armed = True
        try:
            yield
        finally:
            self.armed = False

    def _wrap(self, name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        counter = self

        def wrapper(group: Any, *args: Any, **kwargs: Any) -> Any:
            if counter.armed:
                counter.calls.append((name, *_account(name, group, args)))
            return orig(group, *args, **kwargs)

        wrapper.__name__ = name
        return wrapper


def _account(name: str, group: Any, args: tuple[Any, ...]) -> tuple[int, int]:
    """(bytes this rank sends to the others, receive-buffer bytes on this rank) of one collective."""
    w = group.size()
    me = group.rank()
    if name == "allgather":  # allgather(output_lists, input_tensors, opts)
        outputs, inputs = args[0], args[1]
        sent = sum(_nbytes(t) for t in inputs) * (w - 1)
        recv = sum(_nbytes(t) for lst in outputs for t in lst)
        return sent, recv
    if name in ("alltoall_base", "all_to_all_single"):  # (out, in, out_splits, in_splits, opts)
        out, inp, in_splits = args[0], args[1], args[3]
        itemsize = inp.element_size()
        if in_splits:
            sent = sum(int(c) for d, c in enumerate(in_splits) if d != me) * itemsize
        else:
            sent = _nbytes(inp) * (w - 1) // w
        return sent, _nbytes(out)
    if name == "broadcast":  # broadcast(tensors, opts)
        tensors, opts = args[0], args[1] if len(args) > 1 else None
        root = getattr(opts, "rootRank", 0)
        size = sum(_nbytes(t) for t in tensors)
        return (size * (w - 1), 0) if me == root else (0, size)
    if name == "scatter":  # scatter(outputs, inputs, opts): inputs holds the root's list of blocks
        outputs, inputs = args[0], args[1]
        blocks = inputs[0] if inputs else []
        sent = sum(_nbytes(t) for i, t in enumerate(blocks) if i != me)
        return sent, sum(_nbytes(t) for t in outputs)
    if name == "gather":  # gather(outputs, inputs, opts): outputs holds the root's list of blocks
        outputs, inputs = args[0], args[1]
        blocks = outputs[0] if outputs else []
        if blocks:  # the root: its own block stays here
            return 0, sum(_nbytes(t) for t in blocks)
        return sum(_nbytes(t) for t in inputs), 0
    if name == "send":  # send(tensors, dst, tag): main's payload past its gather block
        return sum(_nbytes(t) for t in args[0]), 0
    if name == "recv":  # recv(tensors, src, tag)
        return 0, sum(_nbytes(t) for t in args[0])
    return 0, 0


class PhaseTimer:
    """Exclusive wall-time phases of a call: time is charged to the innermost wrapped function."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = defaultdict(int)
        self._stack: list[str] = []
        self._mark = 0
        self._patches: list[tuple[Any, str, Any]] = []

    # ---------------------------------------------------------------------------- timing
    def _switch(self, now: int) -> None:
        if self._stack:
            self.totals[self._stack[-1]] += now - self._mark
        self._mark = now

    def start(self, label: str = "other") -> None:
        self.totals.clear()
        self._stack = [label]
        self._mark = time.perf_counter_ns()

    def stop(self) -> dict[str, int]:
        self._switch(time.perf_counter_ns())
        self._stack = []
        return dict(self.totals)

    def stage(self) -> str:
        """The outermost stage label (setup/pre/score/post) the current point is inside."""
        for label in reversed(self._stack):
            if label in ("setup", "pre", "score", "post"):
                return label
        return "other"

    def wrap(self, fn: Callable[..., Any], label: str | Callable[[], str]) -> Callable[..., Any]:
        timer = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not timer._stack:
                return fn(*args, **kwargs)
            name = label if isinstance(label, str) else label()
            timer._switch(time.perf_counter_ns())
            timer._stack.append(name)
            try:
                return fn(*args, **kwargs)
            finally:
                timer._switch(time.perf_counter_ns())
                timer._stack.pop()

        try:
            return functools.wraps(fn)(wrapper)
        except (AttributeError, TypeError):  # pragma: no cover - exotic callables
            return wrapper

    def patch(self, owner: Any, attr: str, label: str | Callable[[], str]) -> None:
        orig = getattr(owner, attr)
        self._patches.append((owner, attr, orig))
        setattr(owner, attr, self.wrap(orig, label))

    def unpatch(self) -> None:
        for owner, attr, orig in reversed(self._patches):
            setattr(owner, attr, orig)
        self._patches.clear()

    def staged(self, leaf: str) -> Callable[[], str]:
        return lambda: f"{self.stage()}:{leaf}"
