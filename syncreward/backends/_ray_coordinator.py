"""The Ray backend's coordinator: the actor every member of a Ray group exchanges its bytes through.

The coordinator's process must stay small and quick to start: it imports neither syncreward nor torch.
So this module imports only the standard library and ``ray``, and :func:`coordinator_class` registers it
with Ray's cloudpickle *by value*: Ray ships the classes' code to the coordinator's process instead of a
reference that process would resolve by importing ``syncreward`` (which imports torch). Nothing here may
import from syncreward, and nothing a user pickles may live here: everything in this module travels by
value. The member side, which does import syncreward, is :mod:`syncreward.backends.ray`.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import ray
import ray.cloudpickle
from ray.exceptions import RayActorError

__all__ = ["ALL_TO_ALL", "BROKEN", "ERROR", "FAILED", "GATHER", "OK", "TIMEOUT", "ZERO_COPY_BYTES", "coordinator_class"]

ZERO_COPY_BYTES = 1 << 20  # buffers this large travel as uint8 arrays, which Ray passes zero-copy
_DEFAULTS = {
    "heartbeat_dead_s": 60.0,  # silence after which a member that is not an actor counts as dead
    "probe_s": 1.0,  # pause between liveness probes of a member actor (one probe is always outstanding)
    "linger_s": 10.0,  # the coordinator removes itself after this long with no joined member
}

GATHER, ALL_TO_ALL = 0, 1  # the kinds of collective
OK, TIMEOUT, FAILED, BROKEN, ERROR = "ok", "timeout", "failed", "broken", "error"  # the statuses it replies


class _Member:
    __slots__ = ("actor", "last_seen", "probe", "state", "token")

    def __init__(self, token: str, actor: Any) -> None:
        self.token = token
        self.actor = actor  # weak handle of the member actor, or None for tasks / drivers
        self.last_seen = time.monotonic()
        self.state = "live"  # live | left | dead
        self.probe: asyncio.Task[None] | None = None


class _Slot:
    """The submissions of one collective (one channel, one operation index)."""

    __slots__ = ("arrived", "event", "failure", "gathered", "kind", "offsets", "parts", "taken")

    def __init__(self, kind: int, world_size: int) -> None:
        self.kind = kind
        self.parts: list[Any] = [None] * world_size  # bytes, or a uint8 array when large
        self.offsets: list[list[int] | None] = [None] * world_size
        self.arrived = 0
        self.taken = 0
        self.event = asyncio.Event()
        self.failure: tuple[str, Any] | None = None
        self.gathered: bytes | None = None


class _Coordinator:
    """The group's meeting point (runs as an async Ray actor; see the module docstring)."""

    def __init__(self, group: str, world_size: int, settings: dict[str, float]) -> None:
        self.group = group
        self.world_size = world_size
        settings = {**_DEFAULTS, **settings}
        self.heartbeat_dead_s = settings["heartbeat_dead_s"]
        self.probe_s = settings["probe_s"]
        self.linger_s = settings["linger_s"]
        self.members: dict[int, _Member] = {}
        self.counters = [[0] * world_size, [0] * world_size]
        self.slots: dict[tuple[int, int], _Slot] = {}
        self.broken: str | None = None
        self.idle_since = time.monotonic()
        self.watchdog: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------ membership

    async def register(self, rank: int, world_size: int, token: str, actor: Any) -> tuple[str, str]:
        if self.watchdog is None:
            self.watchdog = asyncio.get_running_loop().create_task(self._watch())
        if world_size != self.world_size:
            return ERROR, f"group {self.group!r} has world_size {self.world_size}, not {world_size}"
        if not 0 <= rank < self.world_size:
            return ERROR, f"rank {rank} is outside group {self.group!r} of world_size {self.world_size}"
        if self.broken is not None:
            return BROKEN, self.broken
        old = self.members.get(rank)
        if old is not None and old.state == "live":
            if old.token == token:
                return OK, ""
            return ERROR, f"rank {rank} of group {self.group!r} is already joined by another live member"
        member = self.members[rank] = _Member(token, actor)
        if actor is not None:
            member.probe = asyncio.get_running_loop().create_task(self._probe(rank, member))
        self.idle_since = time.monotonic()
        return OK, ""

    async def leave(self, rank: int, token: str) -> None:
        member = self.members.get(rank)
        if member is not None and member.token == token and member.state == "live":
            member.state = "left"
            self._forget(member)

    async def heartbeat(self, rank: int, token: str) -> None:
        member = self.members.get(rank)
        if member is not None and member.token == token:
            member.last_seen = time.monotonic()

    async def info(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "world_size": self.world_size,
            "members": {r: m.state for r, m in sorted(self.members.items())},
            "pending_slots": len(self.slots),
            "broken": self.broken,
            "pid": os.getpid(),
            "imported": sorted(name for name in ("syncreward", "torch") if name in sys.modules),  # none: by value
        }

    def _forget(self, member: _Member) -> None:
        member.actor = None
        if member.probe is not None:
            member.probe.cancel()
            member.probe = None

    def _died(self, rank: int, why: str) -> None:
        member = self.members[rank]
        if member.state != "live":
            return
        member.state = "dead"
        self._forget(member)
        self._break(f"rank {rank} of group {self.group!r} died ({why})", FAILED)

    async def _probe(self, rank: int, member: _Member) -> None:
        unavailable = 0
        while member.state == "live" and member.actor is not None:
            try:
                await member.actor.__ray_ready__.remote()
                unavailable = 0
            except asyncio.CancelledError:
                raise
            except RayActorError as e:
                if type(e).__name__ == "ActorUnavailableError":  # restarting or briefly unreachable
                    unavailable += 1
                    if unavailable < 3:
                        await asyncio.sleep(self.probe_s)
                        continue
                self._died(rank, f"its actor died: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
                return
            except Exception as e:  # pragma: no cover - unexpected; do not let the probe spin
                self._died(rank, f"liveness probe failed: {type(e).__name__}")
                return
            await asyncio.sleep(self.probe_s)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.25)
            now = time.monotonic()
            for rank, member in list(self.members.items()):
                silent = now - member.last_seen > self.heartbeat_dead_s
                if member.state == "live" and member.actor is None and silent:
                    self._died(rank, f"no heartbeat for {self.heartbeat_dead_s:.0f}s")
            if self.slots or any(m.state == "live" for m in self.members.values()):
                self.idle_since = now
            elif now - self.idle_since > self.linger_s:
                ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
                return

    # ------------------------------------------------------------------------------------ collectives

    def _break(self, reason: str, status: str, missing_of: Any = None) -> None:
        """Fail every incomplete slot (waking its waiters) and refuse every later operation."""
        if self.broken is None:
            self.broken = reason
        for key, slot in list(self.slots.items()):
            if slot.arrived < self.world_size:
                if missing_of is not None:
                    missing = [r for r in range(self.world_size) if slot.parts[r] is None]
                    slot.failure = (status, (missing, reason))
                else:
                    slot.failure = (status, reason)
                slot.parts = [None] * self.world_size
                slot.event.set()
                del self.slots[key]

    async def exchange(
        self,
        rank: int,
        token: str,
        channel: int,
        kind: int,
        payload: Any,
        counts: Sequence[int] | None,
        timeout: float,
        said: float | None = None,  # the call's timeout=, which a timeout names (the member's ``_waiting.given``)
    ) -> tuple[str, Any]:
        member = self.members.get(rank)
        if member is None or member.token != token or member.state != "live":
            return ERROR, f"rank {rank} is not a joined member of group {self.group!r} (it left, or was replaced)"
        member.last_seen = time.monotonic()
        if self.broken is not None:
            return BROKEN, self.broken
        index = self.counters[channel][rank]
        self.counters[channel][rank] = index + 1
        key = (channel, index)
        slot = self.slots.get(key)
        if slot is None:
            slot = self.slots[key] = _Slot(kind, self.world_size)
        if slot.kind != kind:
            self._break("the members' synced calls went out of step (they sent different kinds of data)", FAILED)
            return ERROR, self.broken
        slot.parts[rank] = payload
        if counts is not None:
            slot.offsets[rank] = [0, *itertools.accumulate(counts)]
        slot.arrived += 1
        if slot.arrived == self.world_size:
            slot.event.set()
        else:
            try:
                await asyncio.wait_for(slot.event.wait(), timeout if timeout < 1e9 else None)
            except asyncio.TimeoutError:
                if not slot.event.is_set():
                    missing = [r for r in range(self.world_size) if slot.parts[r] is None]
                    self._break(
                        f"rank(s) {missing} of Ray group {self.group!r} did not arrive within "
                        f"timeout={round(timeout if said is None else said, 1):g}s",  # (_errors.seconds)
                        TIMEOUT,
                        missing_of=True,
                    )
        if slot.failure is not None:
            return slot.failure
        out = self._take(slot, rank)
        slot.taken += 1
        if slot.taken == self.world_size:
            slot.parts = []
            slot.gathered = None
            self.slots.pop(key, None)
        return OK, out

    def _take(self, slot: _Slot, rank: int) -> Any:
        if slot.kind == GATHER:
            if slot.gathered is None:
                slot.gathered = b"".join(p for p in slot.parts if p is not None)
            return slot.gathered
        pieces = []
        for src in range(self.world_size):
            payload, offsets = slot.parts[src], slot.offsets[src]
            assert payload is not None
            assert offsets is not None
            pieces.append(memoryview(payload)[offsets[rank] : offsets[rank + 1]])
        out = b"".join(pieces)
        if len(out) < ZERO_COPY_BYTES:
            return out
        import numpy  # only now: small groups never load it

        return numpy.frombuffer(out, dtype=numpy.uint8)


_actor_class: Any = None


def coordinator_class() -> Any:
    """The coordinator as a Ray actor class (made once; its classes registered to travel by value)."""
    global _actor_class
    if _actor_class is None:
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]
        _actor_class = ray.remote(_Coordinator)
    return _actor_class
