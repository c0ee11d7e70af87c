"""Reward groups (``synced_rewards``): several synced rewards of one step share one exchange of their columns.

TRL calls every reward of a step with the same arguments -- the same ``prompts``, ``completions``,
``completion_ids`` and dataset-column *objects* -- one reward after the other (the ``async`` ones
together afterwards). Synced one by one, each reward would gather those columns again. The members of
a group made with :func:`synced_rewards` share what the first call of a step gathered:

* a call is a *hit* when every per-sample column it receives is **the very object** (``is``) an
  earlier call of the group sent, **with the length it had then**, at the same training step, and the
  function needs no column that the earlier call left behind: it skips the inbound exchange and is
  scored on the global columns kept from that call; only its results travel (one collective in
  ``mode="main"``);
* any other call is a *miss*: it gathers its columns as a synced call always does, and what it
  gathered replaces what the group kept.

Identity, not content, recognises the same inputs: nothing is guessed, and no content is hashed. What
makes that decision the same on every rank:

* **only objects that prove identity count.** An empty column, or a tuple (immutable: the empty tuple
  is a singleton, and a constant tuple is the same object every time its code runs), could be "the
  same object" at a later step on one rank while the other ranks pass new lists. Each rank says in the
  miss's header (its mode word) whether its columns prove identity -- non-empty lists, numpy arrays, tensors
  (:func:`proves_identity`) -- and the kept columns serve later calls only if they did **on every
  rank**: every rank reads the same headers, so every rank keeps the same verdict;
* **the rest is the program's own.** Where every rank's columns prove identity, a rank decides
  differently from the others only if its code replaced or resized its column objects differently
  between two members -- code that differs between ranks. Such a divergence cannot be seen from inside
  one rank: the hit waits for its results, the miss in its gather, and the call ends at ``timeout=``
  (docs/concepts.md, "What makes two calls the same call");
* **every hit is checked on every rank.** A hit's result exchange carries every rank's fingerprint,
  sequence number, step and shared-argument digest to every rank (``mode="main"``; ``replicate``'s
  status exchange already does), so members called in a different order on different ranks (or with
  different shared arguments) raise ``MismatchError`` on every rank, the scoring rank included --
  where every rank's call is a hit. A different order that makes one rank's call a miss (it names a
  column the earlier call left behind) and another's a hit leaves them in different exchanges until
  ``timeout=`` (a strict xfail:
  ``test_reward_group_members_in_another_order_where_one_rank_misses_raise_mismatch_on_every_rank_at_once``).

An inbound exchange that fails (on every rank) makes every rank forget what was kept.

Members pickle (``pickle``, ``copy.deepcopy``, cloudpickle: how Ray ships a class defined in the driver
script) and stay one group: a :class:`RewardGroup` travels as its token alone, and every copy of a
group's members unpickled in one process -- together or one by one -- finds the same group there
(:func:`reward_group`). What a group kept belongs to the process that gathered it and never travels.
"""

from __future__ import annotations

import array
import collections
import secrets
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .._binding import Bound
from .._call import Call, Payload
from .._exchange import Inbound
from .._outcome import Error, Outcome, Value
from .._session import Session
from .._transfers import exchange
from ._base import GatherMode, GatherScoring, Mode, local

__all__ = ["GroupMode", "RewardGroup", "reward_group"]


_PROVING = (list, collections.deque, array.array, np.ndarray, torch.Tensor)


def proves_identity(values: Any) -> bool:
    """Whether ``values`` being the same object as before shows, on every rank, that it is the same input.

    Non-empty mutable containers do: each is a new object unless the program hands over the same one.
    Empty ones and tuples do not: the interpreter shares them (``() is ()``, constant tuples).
    """
    return isinstance(values, _PROVING) and len(values) > 0


@dataclass
class _Kept:
    """What one call of the group gathered, as seen on this rank."""

    step: int
    local: dict[str, Any]  # column name -> the local object that was sent (kept alive: ids stay unique)
    lengths: dict[str, int]  # column name -> its length then: a list appended to since is new input
    inbound: Inbound  # its ``all_prove``: every rank's columns proved identity (from the headers: agreed)
    values: Value[dict[str, Any]] | Error | None  # the global columns where this rank scores (or why it has none)

    def matches(self, bound: Bound) -> bool:
        if not self.inbound.all_prove or bound.step != self.step:
            return False
        for c in bound.columns:
            if self.lengths.get(c.name) != len(c.values) or self.local.get(c.name) is not c.values:
                return False
            if c.name in self.inbound.dropped and c.name not in bound.droppable:
                return False  # this member names a column the earlier call left behind: it must travel now
        return True

    def values_copy(self) -> Value[dict[str, Any]] | Error | None:
        """Each member gets its own lists, so one that edits its input in place cannot change another's."""
        if not isinstance(self.values, Value):
            return self.values
        return Value({k: list(v) if isinstance(v, list) else v for k, v in self.values.value.items()})


class RewardGroup:
    """What the members of one group keep, per session (the group may be used over several backends).

    It pickles as its ``token`` (made when the group is): unpickled in a process, it is that process's
    group of this token (:func:`reward_group`), so members pickled one by one are one group again.
    """

    def __init__(self, token: str | None = None) -> None:
        self.token = token if token is not None else secrets.token_hex(16)
        self._kept: weakref.WeakKeyDictionary[Session, _Kept] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return reward_group, (self.token,)

    def kept(self, session: Session) -> _Kept | None:
        with self._lock:
            return self._kept.get(session)

    def keep(self, session: Session, kept: _Kept) -> None:
        with self._lock:
            self._kept[session] = kept

    def forget(self, session: Session) -> None:
        with self._lock:
            self._kept.pop(session, None)


_GROUPS: weakref.WeakValueDictionary[str, RewardGroup] = weakref.WeakValueDictionary()
_GROUPS_LOCK = threading.Lock()


def reward_group(token: str | None = None) -> RewardGroup:
    """This process's reward group named ``token`` (a new group where none is): how a group unpickles."""
    with _GROUPS_LOCK:
        group = _GROUPS.get(token) if token is not None else None
        if group is None:
            group = RewardGroup(token)
            _GROUPS[group.token] = group
        return group


class GroupMode(Mode[GatherScoring]):
    """A gathering mode whose calls reuse the columns an earlier call of the group gathered (see the module)."""

    def __init__(self, base: GatherMode, group: RewardGroup) -> None:
        self.base = base
        self.group = group
        self.name = base.name
        self.shares_arguments = base.shares_arguments
        self.options = base.options

    def prepare(self, call: Call) -> Payload:
        return Payload()  # encoding waits for the inbound turn: a hit sends nothing

    def route_inputs(self, call: Call, payload: Outcome[Payload]) -> Value[GatherScoring] | Error:
        base, session = self.base, call.session
        kept = self.group.kept(session)
        if kept is not None and kept.inbound.all_prove is None:  # gathered to rank 0: known with its results
            session.results_done(kept.inbound.seq, call.deadline, call.spec.name)
        if call.bound is not None and kept is not None and kept.matches(call.bound):
            self.group.hits += 1
            # no inbound exchange checked this call: its result exchange must (``reused``)
            if isinstance(payload, Error):  # a failure only this rank knows of: the hit's result exchange tells
                return Value(base.failed_scoring(call, kept.inbound, payload))
            return Value(base.scoring_for(call, kept.inbound, kept.values_copy(), reused=True))
        self.group.misses += 1
        if isinstance(payload, Value):  # encoded in this turn: any failure (a KeyboardInterrupt too) travels
            payload = local(base.prepare, call)
        proves = call.bound is not None and all(proves_identity(c.values) for c in call.bound.columns)
        got = exchange(call, payload, base.route(call.world_size), mode_word=int(proves), root=base.root)
        if isinstance(got, Error):
            self.group.forget(session)
            return got
        inbound = got.value
        values = base.gather(call, inbound)
        if call.bound is not None:
            # kept on every rank whatever happens next, so that every rank decides the next calls alike (a
            # merge that failed here is kept too: a hit then fails, and fails on every rank)
            objects = {c.name: c.values for c in call.bound.columns}
            lengths = {c.name: len(c.values) for c in call.bound.columns}
            kept = _Kept(call.bound.step, objects, lengths, inbound, values)
            self.group.keep(session, kept)
            values = kept.values_copy()
        return Value(base.scoring_for(call, inbound, values))

    def route_results(self, call: Call, scoring: GatherScoring, result: Outcome[Any]) -> Outcome[Any]:
        return self.base.route_results(call, scoring, result)
