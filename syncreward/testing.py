"""Run code on N local ranks: a test double for distributed reward functions.

:func:`run_ranks` starts ``world_size`` fresh processes on this machine, joins them into a
``torch.distributed`` gloo job on a free localhost port (with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set, so ``accelerate.PartialState()`` works inside too), calls
``fn(rank, world_size, *args)`` on each, and returns the per-rank return values in rank order. It never
hangs: every wait has a deadline, and a failure raises :class:`RanksFailed` with the traceback (or, for a
hung rank, the stack dump) of every rank that did not finish. The ranks are spawned (seconds each on a small
machine), or with ``start_method="forkserver"`` forked from a fork server that imported torch once (about a
tenth of a second per ``run_ranks``; Linux).

Example:
    Test that a synced reward on 3 ranks equals the plain function on the concatenated batch::

        from syncreward import synced_reward
        from syncreward.testing import run_ranks

        def normalised(completions, **kwargs):
            lengths = [len(c) for c in completions]
            mean = sum(lengths) / len(lengths)
            return [x - mean for x in lengths]

        synced = synced_reward(normalised)

        def body(rank, world_size, batches):
            return synced(completions=batches[rank])

        def test_normalised():
            batches = [["a", "bb"], ["ccc"], ["dddd", "e", "ff"]]
            expected = normalised([c for b in batches for c in b])
            got = run_ranks(body, 3, batches)
            assert [x for part in got for x in part] == expected

    ``fn``, its arguments and its return values must be picklable (define ``fn`` at module level). An
    ``async def`` ``fn`` (or one that returns a coroutine) is run to completion with :func:`asyncio.run`
    in the rank.

:func:`run_threads` has the same contract but runs the ranks as ``world_size`` *threads* of this process,
each with its own :class:`ThreadBackend` (an in-memory implementation of :class:`syncreward.Backend`):
no processes, no ports, a few milliseconds per call -- fast enough for property tests. Inside ``fn``,
synced rewards with the default ``backend="auto"`` use that thread's rank. The fake exchange checks the
protocol too (receive counts must match the senders' send counts), times out with
:class:`~syncreward.SyncTimeoutError`, and a rank that raises breaks the group so the others fail fast.
It fails where real ranks fail rather than quietly succeed: a thread that ``fn`` starts itself (a
``ThreadPoolExecutor``, ``threading.Thread``) starts with an empty context and belongs to no rank, so
while any ``run_threads`` runs, a synced call from it with ``backend="auto"`` raises
:class:`~syncreward.BackendError` instead of scoring its batch alone. Run such a helper in the rank's
context (``pool.submit(contextvars.copy_context().run, reward, ...)``; ``asyncio.to_thread`` does it) and
the call is that rank's, as a helper thread's call is on a real rank -- two such threads calling at once
then raise :class:`~syncreward.MismatchError`, as in production. Async rewards work at any world size:
each step of an async call gets a worker thread at once, never one queued behind other ranks' steps.
Use :func:`run_ranks` for what needs real processes (``torch.distributed``, fork, signals).

Example:
    The same test on 3 thread-ranks; ``fn`` may be a closure::

        from syncreward import synced_reward
        from syncreward.testing import run_threads

        @synced_reward
        def centred(completions, **kwargs):
            mean = sum(map(len, completions)) / len(completions)
            return [len(c) - mean for c in completions]

        batches = [["a", "bb"], [], ["ccc", "dddd", "eeeee"]]
        got = run_threads(lambda rank, world_size: centred(batches[rank]), 3, timeout=10)
        assert got == [[-2.0, -1.0], [], [0.0, 1.0, 2.0]]
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import inspect
import multiprocessing as mp
import multiprocessing.connection
import multiprocessing.forkserver
import multiprocessing.reduction
import os
import pickle
import queue
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from ._errors import (
    CollectiveMismatchError,
    CommunicationError,
    SyncTimeoutError,
    collective_mismatch_message,
    late_message,
    left_message,
    seconds,
    timeout_message,
)
from .backends._cache import release
from .backends._resolve import as_thread_rank, thread_ranks
from .backends._waiting import given

__all__ = ["RanksFailed", "ThreadBackend", "ThreadGroup", "free_port", "run_ranks", "run_threads"]

_DIST_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


class RanksFailed(AssertionError):
    """Some ranks raised, crashed or hung. ``failures`` maps each such rank to what it printed."""

    def __init__(self, message: str, failures: Mapping[int, str]) -> None:
        self.failures = dict(failures)
        details = "\n".join(f"----- rank {r} -----\n{text.rstrip()}" for r, text in sorted(self.failures.items()))
        super().__init__(f"{message}\n{details}")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Fd:
    """One of the parent's file descriptors, as a rank process receives it however it was started.

    A spawned process inherits the parent's descriptors as they are when it starts; a fork server's child
    inherits the server's, as they were when the server started (under pytest: another test's capture). The
    descriptor travels with the process's arguments instead (``multiprocessing.reduction.DupFd``), and the
    rank puts it in place of its own.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        return _Fd._received, (multiprocessing.reduction.DupFd(self.fd),)

    @staticmethod
    def _received(dup: Any) -> int:
        return int(dup.detach())


def _stdout() -> _Fd | int:
    """This process's standard output as a rank receives it; ``-1`` where it has none (a closed descriptor 1)."""
    try:
        os.fstat(1)
    except OSError:
        return -1
    return _Fd(1)


def _child(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    body: bytes,
    log_path: str,
    env: Mapping[str, str],
    stdout: int,
    forked: bool,
) -> None:
    if stdout not in (1, -1):  # fn's prints go where the parent's standard output goes now (see _Fd)
        os.dup2(stdout, 1)
        os.close(stdout)
    log = open(log_path, "w", buffering=1)  # noqa: SIM115 - lives as long as the process
    os.dup2(log.fileno(), 2)
    sys.stderr = log
    import faulthandler

    faulthandler.enable(log)
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)
    # the parent's environment as it is now (a fork server's child has the server's, from when it started)
    os.environ.clear()
    os.environ.update(env)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    if forked:  # what the server's interpreter read from its own environment once: read again from this one
        if hasattr(time, "tzset"):
            time.tzset()  # TZ
        tempfile.tempdir = None  # TMPDIR (tempfile keeps what it found first)
    import torch.distributed as dist

    try:
        # fn and its arguments arrive as bytes and are read here, where a failure to import fn's module is
        # this rank's error, with its traceback, rather than a process that dies before it could say why
        fn, args = pickle.loads(body)
        if backend != "none":
            dist.init_process_group(backend, rank=rank, world_size=world_size)
        open(log_path + _RUNNING, "w").close()  # (a file, not the queue: an os._exit() would lose a queued note)
        value = _finish(fn(rank, world_size, *args))
        # plain pickle: torch's multiprocessing reductions would share tensors through file descriptors
        # that die with this process before the parent reads them
        _post(log_path, ("ok", pickle.dumps(value)))
    except BaseException as e:
        text = "".join(traceback.format_exception(e))
        print(text, file=log)
        _post(log_path, ("error", text))
    finally:
        with contextlib.suppress(Exception):
            if dist.is_initialized():
                dist.destroy_process_group()
        log.flush()
        if forked:  # a fork server's child ends with os._exit(): the atexit handlers would never run
            atexit._run_exitfuncs()


_RESULT = ".result"  # beside a rank's log: what it returned or raised, (status, value) pickled


def _post(log_path: str, outcome: tuple[str, Any]) -> None:
    """This rank's outcome, for the parent: written whole, then renamed into place (never read half written).

    A file, not a pipe: a rank killed while it writes (out of memory, SIGKILL) leaves no result, where a
    pipe would leave the parent blocked reading the rest of a message that never comes.
    """
    part = log_path + _RESULT + ".part"
    with open(part, "wb") as f:
        pickle.dump(outcome, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(part, log_path + _RESULT)


def _posted(log_path: str) -> tuple[str, Any] | None:
    try:
        with open(log_path + _RESULT, "rb") as f:
            return pickle.load(f)  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


_START_METHOD_ENV = "SYNCREWARD_START_METHOD"
_START_METHODS = ("spawn", "forkserver")
_PRELOAD = ["torch", "torch.distributed", "syncreward.testing"]  # what a rank imports first: most of its start
# Environment variables read when an interpreter, the dynamic loader, the allocator, the BLAS/OpenMP runtimes or
# torch start: a forked rank has the fork server's. Any other variable (PYTHONBREAKPOINT, which ray.init()
# sets in its driver, is read at each breakpoint()) a rank reads when it runs, from the environment it is given.
_READ_AT_START = frozenset(
    {
        "PYTHONHASHSEED", "PYTHONHOME", "PYTHONWARNINGS", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
        "PYTHONOPTIMIZE", "PYTHONDEVMODE", "PYTHONFAULTHANDLER", "PYTHONMALLOC", "PYTHONUTF8", "PYTHONIOENCODING",
        "PYTHONNOUSERSITE", "PYTHONSAFEPATH", "PYTHONINTMAXSTRDIGITS", "PYTHONTRACEMALLOC", "PYTHONVERBOSE",
        "LANG", "LC_ALL", "LC_CTYPE", "LD_PRELOAD", "LD_LIBRARY_PATH",
    }
)  # fmt: skip
_READ_AT_START_PREFIXES = ("MALLOC_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH_", "PYTORCH_")
_server_env: dict[str, str] | None = None  # the variables read at start-up, as the fork server started with them
_STARTING = threading.Lock()  # one run_ranks at a time changes this process's environment to start its ranks


def _read_at_start(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in _READ_AT_START or k.startswith(_READ_AT_START_PREFIXES)}


def _start_method(start_method: str | None) -> str:
    """The start method asked for: ``start_method``, else ``$SYNCREWARD_START_METHOD``, else ``"spawn"``."""
    method = start_method if start_method is not None else (os.environ.get(_START_METHOD_ENV) or "spawn")
    if method not in _START_METHODS:
        origin = "start_method" if start_method is not None else f"${_START_METHOD_ENV}"
        raise ValueError(f"run_ranks(): {origin}={method!r} is not one of {', '.join(map(repr, _START_METHODS))}")
    return method


def _context(method: str, rank_env: Mapping[str, str]) -> Any:
    """The multiprocessing context that starts the ranks: ``method``'s, where it gives them what spawning does.

    ``"forkserver"`` forks each rank from multiprocessing's fork server, which imported torch once, when the
    first such ``run_ranks`` started it. It is used on Linux only (elsewhere forking a process that
    imported torch is not safe), and only while the ranks' start-up variables (:func:`_read_at_start`) are the
    ones the server started with; otherwise the ranks are spawned.
    """
    global _server_env
    if method != "forkserver" or sys.platform != "linux" or "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    wanted = _read_at_start(rank_env)
    server = _server_env
    if server is None:  # the server will start now, with this process's environment as it is
        server = _read_at_start({k: v for k, v in os.environ.items() if k not in _DIST_ENV})
    if wanted != server:
        return mp.get_context("spawn")
    _server_env = server
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # (read when the server starts: a running one is used as it is)
    # started here, before the ranks' env= is applied, importing what this process's sys.path finds (the
    # server's interpreter would otherwise preload syncreward from its default path: another checkout)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + ([saved] if saved else []))
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    return ctx


def _finish(value: Any) -> Any:
    """A rank body's result; a coroutine (an ``async def`` body) is run to completion in this thread."""
    return asyncio.run(value) if inspect.iscoroutine(value) else value


def _tail(path: str, limit: int = 8000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-limit:]
    except OSError:
        return ""


_DIED_STARTING = (
    "it died while starting, before it could import fn: most often importing the main module failed (the "
    "error is on this process's stderr, above). HINT: a script that calls run_ranks needs an "
    "`if __name__ == '__main__':` guard around it (each rank imports the script again)."
)
_DIED_RUNNING = (
    "it ended while running fn, without returning or raising and without printing anything: os._exit(), a "
    "signal (a negative exit code names it) or a crash in native code ended the process."
)
_RUNNING = ".running"  # beside a rank's log: the rank got as far as calling fn


def _check_spawnable(fn: Callable[..., Any], args: tuple[Any, ...]) -> bytes:
    """``fn`` and ``args`` pickled; ``TypeError`` for an ``fn`` (or arguments) fresh processes cannot receive."""
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and main is not None and getattr(main, "__spec__", None) is None:
        path = getattr(main, "__file__", None)
        if path is None or not os.path.isfile(path):
            raise TypeError(
                f"run_ranks() cannot send {fn!r} to its ranks: it is defined in a __main__ read from stdin, "
                "`python -c` or an interactive session, which the fresh rank processes cannot import. HINT: put "
                "fn in a file and import it from there (or run the file itself, with an "
                "`if __name__ == '__main__':` guard); run_threads runs any callable, closures included."
            )
    try:
        return pickle.dumps((fn, args))
    except Exception as e:
        raise TypeError(
            f"run_ranks() cannot send fn or its arguments to its ranks: {type(e).__name__}: {e}. HINT: fn must be "
            "a function defined at module level (not a lambda, a closure or one made by exec) and its arguments "
            "picklable; run_threads runs any callable, closures included."
        ) from e


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 120.0,
    backend: str = "gloo",
    env: Mapping[str, str] | None = None,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` local processes and return their results.

    Each rank is a fresh process: it imports ``fn`` by name and has this process's environment (time zone and
    temporary directory included), working directory, ``sys.path`` and standard output as they are when
    ``run_ranks`` starts it, and none of its other state; its ``atexit`` handlers run when it ends. What ``fn``
    prints appears here; what it writes to standard error is shown if it fails.

    Args:
        fn: a picklable (module-level) function; an ``async def`` one is run with :func:`asyncio.run`.
        world_size: number of ranks (processes).
        *args: extra picklable arguments passed to every rank.
        timeout: seconds for the whole run, start-up included; a rank still running after it is dumped
            (its stack is shown) and killed.
        backend: ``torch.distributed`` backend to initialise (``"gloo"``), or ``"none"`` to leave it to ``fn``.
        env: extra environment variables for the ranks.
        start_method: how the ranks start; ``None`` reads ``$SYNCREWARD_START_METHOD``, else ``"spawn"``.

            * ``"spawn"``: each rank starts its own interpreter and imports torch: seconds per
              ``run_ranks`` on a small machine, and each rank draws its own ``str`` hash seed, as the
              ranks of a real job do.
            * ``"forkserver"`` (Linux): the ranks are forked from multiprocessing's fork server, which
              imports torch once, when the first such ``run_ranks`` starts it: about a tenth of a second
              per ``run_ranks`` after that. The ranks share the server's ``str`` hash seed (set and
              ``hash()`` order is the same on every rank, unlike real ranks). Where ``env`` or this
              process's environment changes a variable read when an interpreter or torch starts
              (``PYTHONHASHSEED``, ``LD_PRELOAD``, ``OMP_*``, ``TORCH_*``, ...), or on another platform,
              the ranks are spawned.
              A test suite can set it for every test: ``os.environ["SYNCREWARD_START_METHOD"] =
              "forkserver"`` in ``conftest.py``.

    Returns:
        The values ``fn`` returned, in rank order.

    Raises:
        RanksFailed: a rank raised, died or did not finish in time; holds every failing rank's output.
        TypeError: ``fn`` or its arguments cannot reach fresh processes (a lambda, a closure, a function
            defined in ``python -c`` or stdin, an unpicklable argument).
        ValueError: ``start_method`` (or ``$SYNCREWARD_START_METHOD``) is neither ``"spawn"`` nor
            ``"forkserver"``.
    """
    body = _check_spawnable(fn, args)
    method = _start_method(start_method)
    stdout = _stdout()
    port = free_port()
    tmp = tempfile.mkdtemp(prefix="syncreward-ranks-")
    logs = [os.path.join(tmp, f"rank{r}.log") for r in range(world_size)]
    with _STARTING:
        # this process's environment as it is now, without a distributed job's variables, and env on top
        rank_env = {k: v for k, v in os.environ.items() if k not in _DIST_ENV}
        rank_env.update(env or {})
        ctx = _context(method, rank_env)
        forked = ctx.get_start_method() == "forkserver"
        # the ranks start with rank_env: a spawned interpreter reads its start-up variables (PYTHONHASHSEED) itself
        saved = {k: os.environ.get(k) for k in {*_DIST_ENV, *(env or {})}}
        try:
            for k in _DIST_ENV:
                os.environ.pop(k, None)
            os.environ.update(env or {})
            procs = [
                ctx.Process(
                    target=_child,
                    args=(r, world_size, port, backend, body, logs[r], rank_env, stdout, forked),
                    name=f"syncreward-rank{r}",
                    daemon=True,
                )
                for r in range(world_size)
            ]
            for p in procs:
                p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    deadline = time.monotonic() + timeout
    outcome: dict[int, tuple[str, Any]] = {}
    try:
        while True:
            for r, p in enumerate(procs):
                if r in outcome:
                    continue
                exited = p.exitcode is not None  # (first: a rank posts its outcome before it exits)
                posted = _posted(logs[r])
                if posted is not None:
                    outcome[r] = posted
                elif exited:
                    ran = os.path.exists(logs[r] + _RUNNING)
                    log = _tail(logs[r]) or (_DIED_RUNNING if ran else _DIED_STARTING)
                    outcome[r] = ("died", f"process exited with code {p.exitcode}\n{log}")
            left = deadline - time.monotonic()
            if len(outcome) == world_size or left <= 0:
                break
            # until a rank ends (each posts its outcome just before), or a tenth of a second for a slow exit
            pending = [p.sentinel for r, p in enumerate(procs) if r not in outcome]
            multiprocessing.connection.wait(pending, min(left, 0.1))
    finally:
        hung = [r for r in range(world_size) if r not in outcome]
        for r in hung:
            pid = procs[r].pid
            if procs[r].is_alive() and pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGUSR1)
        if hung:
            time.sleep(0.5)
        for p in procs:
            p.join(timeout=max(0.0, min(5.0, deadline + 5.0 - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
    failures = {r: f"rank did not finish within {timeout:.0f}s; its stack:\n{_tail(logs[r])}" for r in hung}
    for r, (status, value) in outcome.items():
        if status != "ok":
            failures[r] = value if status == "error" else str(value)
    if failures:
        raise RanksFailed(f"{len(failures)} of {world_size} ranks failed", failures)
    return [pickle.loads(outcome[r][1]) for r in range(world_size)]


# --------------------------------------------------------------------------------------------- thread-ranks


class _Channel:
    def __init__(self, world_size: int) -> None:
        self.barrier = threading.Barrier(world_size)
        self.slots: list[Any] = [None] * world_size
        self.ops = [0] * world_size  # exchanges entered, per rank: who is missing at a timeout
        self.broken: tuple[str, str] | None = None  # ("T", who waited for whom) or ("F", why it was aborted)


class ThreadGroup:
    """The shared state of ``world_size`` thread-ranks: per channel, one barrier and one slot table.

    Attributes:
        violations: protocol violations seen (``(rank, message)``); :func:`run_threads` fails on any.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.violations: list[tuple[int, str]] = []
        self._channels = (_Channel(world_size), _Channel(world_size))
        self._aborted: str | None = None
        self._left: dict[int, tuple[str, tuple[int, int]]] = {}  # rank -> (why, exchanges it entered per channel)
        self._lock = threading.Lock()  # entering an exchange vs. a rank leaving: one sees the other
        self._mail: dict[tuple[int, int, int], queue.Queue[np.ndarray]] = {}  # (channel, src, dst) -> what src sent

    def backends(self) -> list[ThreadBackend]:
        """One :class:`ThreadBackend` per rank."""
        return [ThreadBackend(self, r) for r in range(self.world_size)]

    def abort(self, reason: str) -> None:
        """Break the group: every rank waiting in (or later entering) an exchange raises."""
        self._aborted = self._aborted or reason
        for ch in self._channels:
            ch.barrier.abort()

    def leave(self, rank: int, why: str) -> None:
        """Thread-rank ``rank`` left (its body returned): ranks waiting in an exchange it never entered raise.

        As a real rank's left record does: a rank that made every exchange the others wait in fails nobody.
        """
        with self._lock:
            self._left[rank] = (why, (self._channels[0].ops[rank], self._channels[1].ops[rank]))
            for ch in self._channels:
                if self._aborted is not None:  # a rank's own failure broke the group first: that is the cause
                    break
                if any(n > ch.ops[rank] for n in ch.ops):  # someone entered an exchange this rank never will
                    ch.broken = ch.broken or ("L", self._left_message(ch, max(ch.ops)) or why)
                    ch.barrier.abort()

    def _left_message(self, ch: _Channel, op: int) -> str | None:
        """Why the ranks that left before entering exchange ``op`` of ``ch`` will never arrive (None: none did)."""
        channel = self._channels.index(ch)
        whys = [why for _, (why, ops) in sorted(self._left.items()) if ops[channel] < op]
        return left_message(whys) if whys else None

    def exchange(self, channel: int, rank: int, item: Any, timeout: float, kind: str = "all_to_all") -> list[Any]:
        """Post ``item`` and return every rank's item, in rank order (all ranks must call it).

        Failures read as the torch backend's do (the same words, from ``syncreward._errors``): a timeout
        names the ranks that did not arrive, and a rank arriving after the others gave up on it says so,
        with the same hint. Ranks in different collectives (``kind``: gloo never matches a gather with an
        all_to_all) raise ``CollectiveMismatchError`` (a ``MismatchError``) at once, and the channel is
        then broken, as the torch backend's group is.
        """
        ch = self._channels[channel]
        if ch.broken is not None:
            kind, what = ch.broken
            if kind == "T":
                raise CommunicationError(late_message(what))
            if kind == "L":
                raise CommunicationError(what)
            raise CommunicationError(f"{what}. HINT: see that rank's traceback; the group is now unusable.")
        with self._lock:
            ch.slots[rank] = (kind, item)
            ch.ops[rank] += 1
            op = ch.ops[rank]
            left = None if self._aborted is not None else self._left_message(ch, op)
            if left is not None:
                ch.broken = ch.broken or ("L", left)
                ch.barrier.abort()
        if left is not None:
            raise CommunicationError(left)
        try:
            ch.barrier.wait(timeout)
            tagged = list(ch.slots)
            ch.barrier.wait(timeout)  # nobody overwrites a slot before everyone has read it
        except threading.BrokenBarrierError:
            if self._aborted is not None:  # a rank's own failure: the cause, even if that rank has left since
                ch.broken = ch.broken or ("F", f"the group was aborted: {self._aborted}")
                raise CommunicationError(
                    f"the group was aborted: {self._aborted}. HINT: see that rank's traceback; the group is now "
                    "unusable."
                ) from None
            left = self._left_message(ch, op)
            if left is not None:
                raise CommunicationError(left) from None
            missing = [r for r in range(self.world_size) if ch.ops[r] < op]
            said = given(timeout)  # the call's timeout=, not the seconds it had left (as the torch backend)
            ch.broken = ch.broken or ("T", f"rank {rank} waited {seconds(said)}s for rank(s) {missing}")
            raise SyncTimeoutError(timeout_message(missing, said), missing) from None
        kinds = {r: k for r, (k, _) in enumerate(tagged)}
        if len(set(kinds.values())) > 1:
            message = collective_mismatch_message(kinds)
            ch.broken = ch.broken or ("F", message.split("\nHINT:")[0])
            raise CollectiveMismatchError(message)
        return [got for _, got in tagged]

    def mailbox(self, channel: int, src: int, dst: int) -> queue.Queue[np.ndarray]:
        """What ``src`` sent ``dst`` point to point on ``channel``, in order."""
        with self._lock:
            return self._mail.setdefault((channel, src, dst), queue.Queue())

    def receive(self, channel: int, src: int, dst: int, timeout: float) -> np.ndarray:
        """The next bytes ``src`` sent ``dst`` on ``channel``; raises as :meth:`exchange` does when none come."""
        box = self.mailbox(channel, src, dst)
        end = time.monotonic() + timeout
        while True:
            if self._aborted is not None:
                raise CommunicationError(
                    f"the group was aborted: {self._aborted}. HINT: see that rank's traceback; the group is now "
                    "unusable."
                )
            try:
                return box.get(timeout=min(0.05, max(end - time.monotonic(), 0.001)))
            except queue.Empty:
                pass
            with self._lock:
                left = self._left.get(src)
            if left is not None:
                raise CommunicationError(left_message([left[0]]))
            if time.monotonic() >= end:
                raise SyncTimeoutError(timeout_message([src], given(timeout)), [src])

    def violation(self, rank: int, message: str) -> CommunicationError:
        self.violations.append((rank, message))
        return CommunicationError(f"protocol violation on rank {rank}: {message}")


class ThreadBackend:
    """One thread-rank's view of a :class:`ThreadGroup`; implements :class:`syncreward.Backend`."""

    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self.group = group
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def __repr__(self) -> str:
        return f"ThreadBackend(rank={self._rank}, world_size={self.world_size})"

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        if row.dtype != np.int64 or row.ndim != 1:
            raise self.group.violation(self._rank, f"all_gather of a {row.dtype} array of shape {row.shape}")
        rows = self.group.exchange(channel, self._rank, row.copy(), timeout)
        if len({len(r) for r in rows}) != 1:
            raise self.group.violation(self._rank, f"all_gather rows of lengths {[len(r) for r in rows]}")
        return np.stack(rows)

    def all_to_all(
        self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], *, channel: int, timeout: float
    ) -> np.ndarray:
        me, w = self._rank, self.world_size
        if send.dtype != np.uint8 or len(send) != sum(send_counts) or len(send_counts) != w or len(recv_counts) != w:
            raise self.group.violation(me, f"all_to_all of {send.dtype}[{len(send)}], send counts {list(send_counts)}")
        item = (send.copy(), [int(c) for c in send_counts])
        parts = []
        for s, (buf, counts) in enumerate(self.group.exchange(channel, me, item, timeout)):
            if counts[me] != int(recv_counts[s]):
                raise self.group.violation(
                    me, f"rank {s} sends {counts[me]} bytes to rank {me}, which expects {int(recv_counts[s])}"
                )
            start = sum(counts[:me])
            parts.append(buf[start : start + counts[me]])
        return np.concatenate(parts)

    def scatter(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        """The optional collective of :class:`syncreward.Backend`: ``root``'s ``size``-byte block for each rank."""
        me, w = self._rank, self.world_size
        if me == root and (send.dtype != np.uint8 or len(send) != size * w):
            raise self.group.violation(me, f"scatter of {send.dtype}[{len(send)}] in blocks of {size} to {w} ranks")
        item = (root, int(size), send.copy() if me == root else None)
        items = self.group.exchange(channel, me, item, timeout, "scatter")
        if {(r, n) for r, n, _ in items} != {(root, size)}:
            raise self.group.violation(me, f"scatter with (root, block size) {[(r, n) for r, n, _ in items]}")
        block: np.ndarray = items[root][2][me * size : (me + 1) * size]
        return block

    def gather(self, send: np.ndarray, size: int, *, root: int, channel: int, timeout: float) -> np.ndarray:
        """The optional collective of :class:`syncreward.Backend`: every rank's ``size``-byte block to ``root``."""
        me = self._rank
        if send.dtype != np.uint8 or len(send) != size:
            raise self.group.violation(me, f"gather of {send.dtype}[{len(send)}] in blocks of {size}")
        items = self.group.exchange(channel, me, (root, int(size), send.copy()), timeout, "gather")
        if {(r, n) for r, n, _ in items} != {(root, size)}:
            raise self.group.violation(me, f"gather with (root, block size) {[(r, n) for r, n, _ in items]}")
        if me != root:
            return np.empty(0, dtype=np.uint8)
        return np.concatenate([block for _, _, block in items])

    def send(self, data: np.ndarray, dst: int, *, channel: int, timeout: float) -> None:
        """The optional point-to-point send of :class:`syncreward.backends.Gathers`: ``data`` to rank ``dst``."""
        if data.dtype != np.uint8 or not 0 <= dst < self.world_size or dst == self._rank:
            raise self.group.violation(self._rank, f"send of {data.dtype}[{len(data)}] to rank {dst}")
        self.group.mailbox(channel, self._rank, dst).put(data.copy())

    def recv(self, size: int, src: int, *, channel: int, timeout: float) -> np.ndarray:
        """The optional point-to-point receive of :class:`syncreward.backends.Gathers`: ``size`` bytes from ``src``."""
        got = self.group.receive(channel, src, self._rank, timeout)
        if len(got) != size:
            raise self.group.violation(self._rank, f"rank {src} sent {len(got)} bytes to a receive of {size}")
        return got

    def abandon(self, reason: str) -> None:
        """The optional exit hook of :class:`syncreward.Backend`: abort the group, so no rank waits in it."""
        self.group.abort(reason)

    def abort(self, reason: str) -> None:
        """The optional capability of :class:`syncreward.Backend`: this rank's step failed; the others raise now."""
        self.group.abort(reason)


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _short_traceback(e: BaseException) -> str:
    """``e``'s traceback without syncreward's own frames (the user's frames and every message are kept)."""
    try:
        te = traceback.TracebackException.from_exception(e)
        seen: set[int] = set()
        todo = [te]
        while todo:
            t = todo.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            kept = [f for f in t.stack if not os.path.abspath(f.filename).startswith(_PACKAGE)]
            if len(kept) < len(t.stack):
                t.stack = traceback.StackSummary.from_list(kept)
            todo.extend(x for x in (t.__cause__, t.__context__) if x is not None)
        return "".join(te.format()) + "(syncreward's own lines are left out)\n"
    except Exception:
        return "".join(traceback.format_exception(e))


def run_threads(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 60.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` threads of this process; return their results.

    Each thread is one rank with its own :class:`ThreadBackend` of a fresh :class:`ThreadGroup`; synced
    rewards called with ``backend="auto"`` inside ``fn`` (also from coroutines it runs, and from threads
    that run in its context: ``contextvars.copy_context().run``, ``asyncio.to_thread``) use it. While
    ``run_threads`` runs, a synced ``backend="auto"`` call from a thread of no rank (a new thread has an
    empty context) raises :class:`~syncreward.BackendError`, where the single-process fallback would
    score it alone.

    Args:
        fn: any callable (a closure is fine: nothing is pickled). If it is an ``async def`` function, or
            returns a coroutine, the coroutine is run to completion with :func:`asyncio.run` on the rank's
            thread (in the rank's context), and its result is the rank's.
        world_size: number of ranks (threads).
        *args: extra arguments passed to every rank.
        timeout: seconds for the whole run; then the group is aborted and the stacks of the ranks still
            running are reported.

    Returns:
        The values ``fn`` returned, in rank order. Nothing of the run stays behind: syncreward forgets its
        ranks' backends and sessions when ``run_threads`` returns (or raises).

    A rank whose ``fn`` returns has left, as a real rank that exits: ranks waiting in a synced call it
    never made raise at once, naming it (``rank 1 exited (its body returned) without making this synced
    call``), instead of waiting for ``timeout``.

    Raises:
        RanksFailed: a rank raised or did not finish in time, or the ranks' synced calls did not match; holds
            every failing rank's traceback, without syncreward's own lines (for a hung rank, its current
            stack).
    """
    group = ThreadGroup(world_size)
    backends = group.backends()
    results: list[Any] = [None] * world_size
    failures: dict[int, str] = {}

    def run(rank: int) -> None:
        try:
            with as_thread_rank(backends[rank]):  # a new thread starts in an empty context
                results[rank] = _finish(fn(rank, world_size, *args))  # asyncio.run copies this context
        except BaseException as e:
            failures[rank] = _short_traceback(e)
            group.abort(f"rank {rank} raised {type(e).__name__}")
        else:  # as a real rank's exit: the others stop waiting for calls it never made
            group.leave(rank, f"rank {rank} exited (its body returned)")

    threads = [
        threading.Thread(target=run, args=(r,), name=f"syncreward-rank{r}", daemon=True) for r in range(world_size)
    ]
    try:
        with thread_ranks():  # from now on a thread that is no rank cannot make a synced call
            for t in threads:
                t.start()
            deadline = time.monotonic() + timeout
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
    finally:
        for backend in backends:  # nothing of this run stays behind: syncreward forgets the ranks' sessions
            release(backend)
    frames = sys._current_frames()
    for r, t in enumerate(threads):
        if t.is_alive():
            stack = "".join(traceback.format_stack(frames[t.ident])) if t.ident in frames else "(no frame)\n"
            failures[r] = f"rank did not finish within {timeout:.0f}s; its stack:\n{stack}"
    if any(t.is_alive() for t in threads):
        group.abort("run_threads gave up")  # releases ranks blocked in an exchange
    for r, message in group.violations:
        failures[r] = f"{failures.get(r, '')}exchange protocol violation: {message}\n"
    if failures:
        raise RanksFailed(f"{len(failures)} of {world_size} ranks failed", failures)
    return results
