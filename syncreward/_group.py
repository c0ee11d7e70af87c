"""Reward groups: several synced rewards of one step share one exchange of the columns they all receive.

TRL calls every reward of a step with the same arguments -- the same ``prompts``, ``completions``,
``completion_ids`` and dataset-column *objects* -- one reward after the other (the ``async`` ones
together afterwards). Synced one by one, each reward would gather those columns again. The members of
a group made with :func:`synced_rewards` share what the first call of a step gathered:

* a call whose per-sample columns are **the very objects** (``is``) an earlier call of the group sent,
  at the same training step, is a *hit*: it skips the inbound exchange and is scored on the global
  columns kept from that call; only its results travel (one collective in ``mode="main"``);
* any other call is a *miss*: it gathers its columns as a synced call always does, and what it
  gathered replaces what the group kept.

Identity, not content, recognises the same inputs: nothing is guessed, and no content is hashed. The
decision is made in the call's inbound turn, from what earlier calls on every rank did, so in SPMD code
every rank decides alike; results still carry their call's fingerprint and sequence number, so a rank
that decided otherwise raises instead of pairing with the wrong call. An inbound exchange that fails
(on every rank) makes every rank forget what was kept.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Any

from ._binding import Bound
from ._exchange import Inbound
from ._modes._base import Call, GatherMode, Mode, Scoring
from ._session import Raise, Session
from ._wire import error_blob

__all__ = ["GroupMode", "RewardGroup"]


@dataclass
class _Kept:
    """What one call of the group gathered, as seen on this rank."""

    step: int
    local: dict[str, Any]  # column name -> the local object that was sent (kept alive: ids stay unique)
    inbound: Inbound
    values: dict[str, Any] | Exception | None  # the global columns where this rank scores (or why it has none)

    def matches(self, bound: Bound) -> bool:
        return bound.step == self.step and all(self.local.get(c.name) is c.values for c in bound.columns)

    def values_copy(self) -> dict[str, Any] | Exception | None:
        """Each member gets its own lists, so one that edits its input in place cannot change another's."""
        if not isinstance(self.values, dict):
            return self.values
        return {k: list(v) if isinstance(v, list) else v for k, v in self.values.items()}


class RewardGroup:
    """What the members of one group keep, per session (the group may be used over several backends)."""

    def __init__(self) -> None:
        self._kept: weakref.WeakKeyDictionary[Session, _Kept] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def kept(self, session: Session) -> _Kept | None:
        with self._lock:
            return self._kept.get(session)

    def keep(self, session: Session, kept: _Kept) -> None:
        with self._lock:
            self._kept[session] = kept

    def forget(self, session: Session) -> None:
        with self._lock:
            self._kept.pop(session, None)


class GroupMode(Mode):
    """A gathering mode whose calls reuse the columns an earlier call of the group gathered (see the module)."""

    def __init__(self, base: GatherMode, group: RewardGroup) -> None:
        self.base = base
        self.group = group
        self.name = base.name

    def prepare(self, call: Call) -> None:
        pass  # encoding waits for the inbound turn: a hit sends nothing

    def inbound(self, call: Call) -> Scoring | Raise:
        base, session = self.base, call.session
        kept = self.group.kept(session)
        if call.error is None and call.bound is not None and kept is not None and kept.matches(call.bound):
            self.group.hits += 1
            call.dropped = kept.inbound.dropped
            return base.scoring_for(call, kept.inbound, kept.values_copy())
        self.group.misses += 1
        if call.error is None:
            try:
                base.prepare(call)
            except Exception as e:
                call.error, call.blob = e, error_blob(e)
        got = call.exchange(call.frame, base.route(call.world_size))
        if isinstance(got, Raise):
            self.group.forget(session)
            return got
        values = base.gather(call, got)
        if call.bound is not None:
            # kept on every rank whatever happens next, so that every rank decides the next calls alike (a
            # merge that failed here is kept too: a hit then fails, and fails on every rank)
            local = {c.name: c.values for c in call.bound.columns}
            kept = _Kept(call.bound.step, local, got, values)
            self.group.keep(session, kept)
            values = kept.values_copy()
        return base.scoring_for(call, got, values)

    def outbound(self, call: Call, scoring: Scoring, result: Any, error: BaseException | None) -> Any:
        return self.base.outbound(call, scoring, result, error)
