"""Every transfer a mode makes, over a backend: one :class:`Link` per call and channel.

A mode never names a channel, a timeout or a collective's sizes: it asks the call's :class:`Link` (made
by ``_transfers.link``: the session, the channel, the timeout, the function's name and the call's
description and shared arguments) for a transfer, and gets back an outcome (``_outcome``): ``Value``
of what was received, or an ``Error`` that every rank raises -- because every rank decided it from the
same gathered rows. The arithmetic (sizes, offsets, predictions) lives in ``_wire``.

The transfers:

* :meth:`Link.inbound` -- headers and payloads; every rank raises together if a rank failed, runs
  another version, or makes another call;
* :meth:`Link.gathered` -- ``main``'s inbound over a backend with a gather: every rank's header and payload
  to rank 0 alone, whose verdict on them every rank learns (and raises) with the results
  (:func:`exchange_results`);
* :meth:`Link.status_round` -- after work only some ranks did (scoring, planning): every rank says
  whether it failed, and every rank raises together if any did (:meth:`Link.report_failures`);
* :meth:`Link.sized_exchange` -- a status round in which every rank also says how many bytes it sends
  each rank, then one ``all_to_all`` of exactly those bytes;
* :meth:`Link.disagreement` -- whether every rank's :class:`~syncreward._wire.CallCheck` names the same
  call: where not, every rank learns every rank's description (:meth:`Link.mismatch`) or, for the same
  call with different shared arguments, every rank's values of them (:meth:`Link.shared_mismatch`);
* :meth:`Link.scatter`, :meth:`Link.gather`, :meth:`Link.broadcast_blobs` -- from one rank to each, from each
  to one, from each to every one;
* :func:`exchange_results` -- one rank's result bodies to every rank, in blocks sized by the previous
  call (``mode="main"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, NamedTuple

import numpy as np

from ._codec import decode_value
from ._deadline import Deadline
from ._description import Description
from ._errors import CodecError, CommunicationError, MismatchError, RemoteError, column_differences
from ._outcome import Error, Value, add_note
from ._session import Session
from ._shared import SharedValues, differing_shared, read_report, shared_values_by_rank
from ._wire import (
    F_ALL_PROVE,
    FAILED,
    HEADER_BYTES,
    INBOUND,
    NO_DROPS,
    OK,
    OUTBOUND,
    V_FAILED,
    V_MISMATCH,
    V_OK,
    V_SHARED,
    V_VERSION,
    CallCheck,
    FailedCheck,
    Headers,
    ResultBlocks,
    ResultChunk,
    drop_words,
    dropped_names,
    error_blob,
    offsets,
    remainder_counts,
    split,
    verdict_of,
)
from .backends._protocol import Gathers, gathers, receives_many, scatters

__all__ = [
    "INBOUND",
    "OUTBOUND",
    "SAME_CALLS",
    "Inbound",
    "Link",
    "Sized",
    "exchange_results",
]

_UNREADABLE = "<a description that cannot be read>"
SAME_CALLS = "every rank must call the same synced functions in the same order"  # the root of every mismatch HINT


@dataclass
class Inbound:
    """What this rank knows after the inbound exchange of a call.

    After an ``all_to_all`` inbound every rank knows every header. After a gathered one (``main`` on a
    backend with a gather: :meth:`Link.inbound` with ``root``) only the scoring rank does: it holds the
    ``verdict`` every rank will raise from; a non-scoring rank's inbound is ``pending`` -- no headers, its
    own count only -- until the call's result block brings the verdict and what a reward group keeps
    (:meth:`settle`).
    """

    headers: Headers | None  # None: a gathered inbound on a non-scoring rank
    counts: list[int]  # a pending inbound: this rank's own count at its index, 0 elsewhere
    offsets: list[int]
    dropped: frozenset[str]
    frames: dict[int, Any] = field(default_factory=dict)  # rank -> its complete payload, for the ranks sent here
    all_prove: bool | None = None  # every rank's mode word was non-zero (None: not known here yet)
    gathered: bool = False  # a gathered inbound: the result block carries the verdict
    verdict: int = V_OK  # on the scoring rank of a gathered inbound: what every rank raises (``_wire.verdict_of``)
    text: str = ""  # the verdict's message (another wire version, an unreadable header)
    error: BaseException | None = None  # this rank's own failure, sent in its header
    seq: int = -1
    next_block: int = 0  # on the scoring rank: the inbound block size this call announces
    drops: tuple[int, ...] = ()  # on the scoring rank: the OR of every rank's drop mask
    names: Sequence[str] = ()  # a pending inbound: what :meth:`settle` needs to name the columns left behind
    droppable: frozenset[str] = frozenset()

    @property
    def total(self) -> int:
        return self.offsets[-1]

    @property
    def ok(self) -> bool:
        """Whether this rank may score from it: no rank failed, every rank makes the same call (known here)."""
        return self.verdict == V_OK and self.headers is not None

    def settle(self, all_prove: bool, drops: Sequence[int]) -> None:
        """A pending inbound learns, from the call's result block, what the scoring rank saw in the headers."""
        self.all_prove = all_prove
        if any(drops) and self.droppable:
            self.dropped = dropped_names(self.names, self.droppable, np.asarray([drops], dtype=np.int64))


class Sized(NamedTuple):
    """What a :meth:`Link.sized_exchange` gave this rank."""

    parts: list[np.ndarray]  # what each rank sent this one, in rank order (this rank's own: empty)
    extra: np.ndarray  # every rank's extra numbers, rows in rank order


@dataclass(eq=False, slots=True)  # a record never changed (frozen would cost a call per field at each link)
class Link:
    """One call's transfers on one channel: every collective a mode needs, with the call's context bound.

    ``description`` and ``shared`` are the call's (what a mismatch shows every rank); ``function`` is
    the synced function's name, which every error names.
    """

    session: Session
    channel: int
    deadline: Deadline  # the call's: each collective gets the seconds left
    function: str
    description: Description | None = None
    shared: SharedValues | None = None

    @property
    def rank(self) -> int:
        return self.session.rank

    @property
    def world_size(self) -> int:
        return self.session.world_size

    # ------------------------------------------------------------------------------------- collectives

    def all_to_all(
        self, send: bytes | bytearray | np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int]
    ) -> np.ndarray:
        arr = send if isinstance(send, np.ndarray) else np.frombuffer(send, dtype=np.uint8)
        return self.session.backend.all_to_all(
            arr, send_counts, recv_counts, channel=self.channel, timeout=self.deadline.left()
        )

    def all_gather(self, row: Sequence[int]) -> np.ndarray:
        return self.session.backend.all_gather(
            np.asarray(row, dtype=np.int64), channel=self.channel, timeout=self.deadline.left()
        )

    def scatter(self, blocks: bytes | bytearray, size: int, root: int) -> np.ndarray:
        """Rank ``root`` sends every rank (itself included) its ``size``-byte block of ``blocks``; return this rank's.

        A backend with the optional ``scatter`` method sends W - 1 messages; otherwise an ``all_to_all``
        (gloo's ``alltoallv`` sends W(W - 1), empty ones included: docs/scale.md).
        """
        w, me = self.world_size, self.rank
        backend = self.session.backend
        if (scattering := scatters(backend)) is not None:
            data = np.frombuffer(blocks, dtype=np.uint8)
            return scattering.scatter(data, size, root=root, channel=self.channel, timeout=self.deadline.left())
        if me == root:
            mine = bytes(blocks[root * size : (root + 1) * size])
            rest = blocks[: root * size] + blocks[(root + 1) * size :]
            self.all_to_all(rest, [0 if d == root else size for d in range(w)], [0] * w)
            return np.frombuffer(mine, dtype=np.uint8)
        return self.all_to_all(b"", [0] * w, [size if s == root else 0 for s in range(w)])

    def gather(self, block: bytes | bytearray | np.ndarray, size: int, root: int) -> np.ndarray:
        """Every rank sends rank ``root`` its ``size``-byte ``block``; ``root`` gets the W blocks in rank order.

        ``block`` holds exactly ``size`` bytes on every rank; every other rank gets an empty array. A backend
        with the optional ``gather`` sends W - 1 messages; otherwise an ``all_to_all`` carries the same bytes
        (gloo's ``alltoallv`` sends W(W - 1)).
        """
        w, me = self.world_size, self.rank
        data = block if isinstance(block, np.ndarray) else np.frombuffer(block, dtype=np.uint8)
        if (gathering := gathers(self.session.backend)) is not None:
            return gathering.gather(data, size, root=root, channel=self.channel, timeout=self.deadline.left())
        if me == root:
            got = self.all_to_all(b"", [0] * w, [0 if s == root else size for s in range(w)])
            return np.concatenate([got[: root * size], data, got[root * size :]])
        self.all_to_all(data, [size if d == root else 0 for d in range(w)], [0] * w)
        return np.empty(0, dtype=np.uint8)

    def broadcast_blobs(self, blob: bytes, sizes: Sequence[int]) -> list[bytes]:
        """Every rank sends its ``blob`` (``sizes[rank]`` bytes, may be empty) to every rank."""
        w = self.world_size
        buf = self.all_to_all(blob * w, [len(blob)] * w, sizes)
        return [b.tobytes() for b in split(buf, sizes)]

    # ---------------------------------------------------------------------------------------- failures

    def report_failures(
        self, statuses: Sequence[int], sizes: Sequence[int], mine: BaseException | None, blob: bytes
    ) -> Error:
        """Every rank learns every failure: the origin re-raises its own, the others a :class:`RemoteError`."""
        function = self.function
        failed = [r for r, s in enumerate(statuses) if s]
        sizes = [int(sizes[r]) if statuses[r] else 0 for r in range(self.world_size)]
        blobs = self.broadcast_blobs(blob if mine is not None else b"", sizes)
        if mine is not None:
            others = [r for r in failed if r != self.rank]
            if others:
                add_note(mine, f"syncreward: {function!r} also failed on rank(s) {others}")
            return Error(mine)
        origin = failed[0]
        try:
            info = decode_value(blobs[origin])
            error = RemoteError(origin, info["type"], info["message"], info["traceback"], function=function)
        except (CodecError, KeyError, TypeError):
            error = RemoteError(origin, "?", "<undecodable error report>", "", function=function)
        if len(failed) > 1:
            add_note(error, f"syncreward: {function!r} also failed on rank(s) {failed[1:]}")
        return Error(error)

    def status_round(
        self, mine: BaseException | None, *, extra: Sequence[int] = (), record: CallCheck | None = None
    ) -> Value[np.ndarray] | Error:
        """Every rank says whether it failed (``mine``), with ``extra`` numbers; every rank raises if any failed.

        One ``all_gather`` of ``[status, error bytes, (record), *extra]`` per rank, then, only if a rank
        failed, its error to every rank (:meth:`report_failures`). With ``record`` (the call's
        :class:`CallCheck`, where no inbound header checked the call: a reward group's hit), the ranks'
        records are compared first (:meth:`disagreement`). Returns every rank's ``extra`` (rows in rank
        order).
        """
        blob = error_blob(mine) if mine is not None else b""
        head = [OK if mine is None else FAILED, len(blob), *(record.fields() if record is not None else ())]
        rows = self.all_gather([*head, *extra])
        if record is not None:
            checks = [CallCheck.of_fields(row[2 : 2 + CallCheck.FIELDS]) for row in rows.tolist()]
            wrong = self.disagreement(checks)
            if wrong is not None:
                return wrong
        statuses = [int(x) for x in rows[:, 0]]
        if any(statuses):
            return self.report_failures(statuses, rows[:, 1].tolist(), mine, blob)
        return Value(rows[:, len(head) :])

    def sized_exchange(
        self, mine: BaseException | None, frames: Sequence[bytes | bytearray], extra: Sequence[int] = ()
    ) -> Value[Sized] | Error:
        """A status round in which every rank says how many bytes it sends each rank, then one ``all_to_all``.

        ``frames[d]`` goes to rank ``d`` (this rank's own is not sent); ``mine`` is this rank's failure
        (its frames are then empty). Every rank raises if any failed; else every rank receives exactly
        what was announced for it, and every rank's ``extra`` numbers.
        """
        w, me = self.world_size, self.rank
        done = self.status_round(mine, extra=[*extra, *(len(f) for f in frames)])
        if isinstance(done, Error):
            return done
        rows, k = done.value, len(extra)
        send_counts = [0 if d == me else len(frames[d]) for d in range(w)]
        recv_counts = [0 if s == me else int(rows[s, k + me]) for s in range(w)]
        buf = self.all_to_all(b"".join(frames[d] for d in range(w) if d != me), send_counts, recv_counts)
        return Value(Sized(split(buf, recv_counts), rows[:, :k]))

    # -------------------------------------------------------------------------------------- mismatches

    def disagreement(self, checks: Sequence[CallCheck]) -> Error | None:
        """Whether the ranks' :class:`CallCheck` records (every rank's, in rank order) name different calls.

        Every rank holds every record, so every rank returns the same answer; on a disagreement every rank
        learns every rank's description (:meth:`mismatch`), or, for the same call with different shared
        arguments, every rank's values of them (:meth:`shared_mismatch`).
        """
        if not all(c.same_call(checks[0]) for c in checks[1:]):
            return self.mismatch()
        if self.shared is not None and not all(c.same_shared(checks[0]) for c in checks[1:]):
            return self.shared_mismatch()
        return None

    def mismatch(self) -> Error:
        """Every rank learns what every rank called: every rank's :class:`~syncreward._description.Description`.

        Every rank enters it alike (from the headers or check records every rank received). One
        ``all_gather`` of the encoded descriptions' sizes, then the descriptions; every rank raises the same
        :class:`MismatchError`, one line per rank, naming the column that differs and what to do.
        """
        mine = self.description.encode() if self.description is not None else b""
        sizes = self.all_gather([len(mine)])[:, 0].tolist()
        found = [Description.decode(b) for b in self.broadcast_blobs(mine, sizes)]
        lines = [f"  rank {r}: {d.text if d is not None else _UNREADABLE}" for r, d in enumerate(found)]
        hint = (
            f"{SAME_CALLS}, with the same per-sample columns (same names and container types), at the same training "
            "step (a call made on some ranks only, e.g. under `if rank == 0`, shifts every later call)."
        )
        known = [d for d in found if d is not None]  # a rank's that cannot be read: its line says so, no more
        rewards = len({d.rewarded for d in known}) if len(known) == len(found) else 0
        if rewards == 1:  # the same reward: say which column differs, and how
            lines += [f"  {d}" for d in column_differences([d.columns for d in known])]
            if len({d.call for d in known}) == 1:  # the same call, made from different places
                hint = (
                    "the ranks made the same call from different places in the code. If that is a call some ranks "
                    "make on their own (a callback or an evaluation under `if rank == 0`), make it on every rank or "
                    "not at all; if the ranks run different code on purpose (a Ray driver and a task), make every "
                    "rank call the synced function through one shared function."
                )
        elif rewards > 1 and len({d.columns for d in known}) == 1:
            hint = (
                "the ranks called different rewards, or copies of one reward configured differently (the part in "
                "brackets), at the same point: call them in the same order on every rank. Where a reward's "
                "configuration differs between ranks on purpose (a path or a seed per rank), keep it in a private "
                "attribute (`self._log_path`): private names and per-rank ones (`device`, `rank`, `seed`) are not part "
                "of a reward's identity."
            )
        return Error(
            MismatchError(
                "ranks made different synced calls at the same point, so their batches cannot be combined:\n"
                + "\n".join(lines)
                + f"\nHINT: {hint}"
            )
        )

    def shared_mismatch(self) -> Error:
        """The ranks made the same call with different shared arguments: every rank learns every rank's values.

        Every rank enters it alike (the digests it compares are in the headers or check records every rank
        received), with its own shared arguments. One ``all_gather`` of the reports' sizes, then the
        reports; every rank raises the same :class:`MismatchError`, naming the arguments, how each rank
        passed them, and what to do.
        """
        assert self.shared is not None
        function = self.function
        report = self.shared.report()
        sizes = self.all_gather([len(report)])[:, 0].tolist()
        blobs = self.broadcast_blobs(report, sizes)
        reports = [read_report(b) for b in blobs]
        bad = [r for r, got in enumerate(reports) if got is None]
        readable = [got if got is not None else {} for got in reports]
        names = differing_shared(readable)
        lines = []
        for name in names:
            shown = "; ".join(f"{text} on rank(s) {ranks}" for text, ranks in shared_values_by_rank(readable, name))
            lines.append(f"  {name}: {shown}")
        if bad:
            lines.append(f"  (rank(s) {bad} sent an unreadable report of their shared arguments)")
        which = ", ".join(map(repr, names)) if names else "(which ones could not be told)"
        first = names[0] if names else "<name>"
        return Error(
            MismatchError(
                f"ranks called synced function {function!r} with different values of the shared argument(s) {which}. "
                "A shared argument (anything but a list, tuple, numpy array or tensor) is one value for the whole "
                "batch: the batch would be scored with one rank's value, for every rank's samples:\n"
                + "\n".join(lines)
                + "\nHINT: if it holds one entry per sample, pass it as a list; if it is one value, make it the same "
                f"on every rank (a sequence that is one value also needs shared=[{first!r}]); if it differs between "
                f"ranks on purpose (a device, a rank index), pass exclude=[{first!r}]: it is then not checked, and "
                "the scoring rank uses its own."
            )
        )

    # ----------------------------------------------------------------------------------------- inbound

    def inbound(
        self,
        *,
        header: bytes,
        payload: bytes | bytearray,
        route: np.ndarray | None,
        error: BaseException | None,
        blob: bytes,
        names: Sequence[str],
        droppable: frozenset[str],
        seq: int = -1,
        root: int | None = None,
        n: int = 0,
    ) -> Value[Inbound] | Error:
        """Send every rank this rank's header plus the start of its payload where ``route`` says; complete the payloads.

        ``route[src, dst]`` says whether ``src``'s payload goes to ``dst`` (``None``: no payload travels).
        ``root``: every payload goes to rank ``root`` alone (``main``; ``n``: this rank's sample count, as its
        header says); where the backend has a gather
        (``Gathers``), the call's inbound is :meth:`gathered` instead: a non-scoring rank talks to ``root`` only.

        One ``all_to_all``: the block to rank ``d`` is the header followed by an *eager* chunk of the size the
        session's predictor gives every rank for this pair (sizes every rank computes alike, so the collective
        always matches). In the steady state the whole payload rides in it; the part that does not fit moves
        in one more exact-size ``all_to_all``. Then, from the headers, every rank raises together if any rank
        failed, the ranks are not making the same call, or they pass different shared arguments.
        """
        session = self.session
        if root is not None and gathers(session.backend) is not None:
            return self.gathered(header, payload, error, blob, names, droppable, seq, root, n)
        w, me = session.world_size, session.rank
        eager = session.predictor.predict()
        mine = frozenset(_where(route[me])) if route is not None and error is None else frozenset()
        send_counts = (eager[me] + HEADER_BYTES).tolist()
        send = _blocks(header, payload, send_counts, mine)
        recv_counts = (eager[:, me] + HEADER_BYTES).tolist()
        buf = self.all_to_all(send, send_counts, recv_counts)
        starts = list(accumulate(recv_counts, initial=0))
        headers = Headers.gather(buf, starts[:-1])
        session.predictor.update(headers, route)
        verdict, text = verdict_of(headers)  # what rank 0 decides alone in a gathered inbound, here on every rank
        if verdict == V_FAILED:  # every rank holds every header: the errors follow at once
            return self.report_failures(headers.statuses, headers.sizes, error, blob)
        if verdict != V_OK:
            return _verdict_error(self, verdict, text, error)
        counts = headers.counts
        dropped = dropped_names(names, droppable, headers.masks) if droppable and headers.any_dropped else frozenset()
        inbound = Inbound(headers, counts, offsets(counts), dropped, all_prove=all(headers.mode_words))
        if route is None:
            return Value(inbound)
        sizes = headers.sizes
        senders = _where(route[:, me])
        for s in senders:
            at = starts[s] + HEADER_BYTES
            inbound.frames[s] = buf[at : min(at + sizes[s], starts[s + 1])]  # (the eager part, if it did not fit)
        if not (route & (np.asarray(sizes)[:, None] > eager)).any():
            return Value(inbound)  # every payload rode whole in its eager chunk, on every rank
        rest = remainder_counts(sizes, eager, route)
        if rest.any():
            out = b"".join(payload[int(eager[me, d]) :] if rest[me, d] else b"" for d in range(w) if d in mine)
            recv = rest[:, me].tolist()
            parts = split(self.all_to_all(out, rest[me].tolist(), recv), recv)
            for s in range(w):
                if recv[s]:
                    inbound.frames[s] = inbound.frames[s].tobytes() + parts[s].tobytes()
        return Value(inbound)

    def gathered(
        self,
        header: bytes,
        payload: bytes | bytearray,
        error: BaseException | None,
        blob: bytes,
        names: Sequence[str],
        droppable: frozenset[str],
        seq: int,
        root: int,
        n: int,
    ) -> Value[Inbound]:
        """``main``'s inbound on a gathering backend: every rank's header and payload to ``root``, and nothing back.

        One ``gather`` of one B-byte block per rank (header, then the payload or this rank's error report
        where it fits; B: :class:`~syncreward._wire.InboundBlocks`, the same on every rank); a rank whose
        payload does not fit sends all of it to ``root`` point to point, and ``root`` receives it, from each
        such rank in rank order, into a buffer of its size. Only ``root`` reads the headers: it decides the
        verdict (``_wire.verdict_of``)
        and announces the next block size, and the call's result block carries both to every rank
        (:func:`exchange_results`), so this never fails on its own -- every rank raises together there.
        """
        session, w, me = self.session, self.world_size, self.rank
        gathering = gathers(session.backend)
        assert gathering is not None
        blocks = session.inbound_blocks
        source = blocks.gathered(seq)
        size = blocks.size(source)
        if size is None:  # concurrent async calls: the result block that announced it has not come yet
            assert source is not None
            session.results_done(source, self.deadline, self.function)
            size = blocks.size(source)
            if size is None:
                raise CodecError(
                    f"call #{source}'s result block announced no inbound block size. HINT: every rank must run the "
                    "same syncreward version."
                )
        body = np.frombuffer(blob if error is not None else payload, dtype=np.uint8)
        room = size - HEADER_BYTES
        fits = body.size <= room
        block = _gather_block(header, body if fits else body[:0], size)
        got = gathering.gather(block, size, root=root, channel=self.channel, timeout=self.deadline.left())
        if me != root:
            if not fits:  # all of it, point to point: root receives it whole, with no copy to join parts
                gathering.send(body, root, channel=self.channel, timeout=self.deadline.left())
            counts = [n if r == me else 0 for r in range(w)]
            return Value(
                Inbound(
                    None, counts, offsets(counts), frozenset(), gathered=True, error=error, seq=seq, names=names,
                    droppable=droppable,
                )
            )  # fmt: skip
        headers = Headers.blocks(got, w, size)
        verdict, text = verdict_of(headers)
        frames: dict[int, Any] = {}
        if verdict in (V_OK, V_FAILED, V_MISMATCH, V_SHARED):  # sizes to be believed: receive what was sent
            sizes = headers.sizes
            whole = {s: sizes[s] for s in range(w) if s != root and sizes[s] > room}  # sent point to point
            received = self._receive(whole) if whole else {}
            for s in range(w):
                if s != root:
                    at = s * size + HEADER_BYTES
                    frames[s] = received[s] if s in whole else got[at : at + sizes[s]]
        ok = verdict == V_OK
        announced = blocks.announce(seq, headers.sizes if ok else None)
        counts = headers.counts
        dropped: frozenset[str] = frozenset()
        if ok and droppable and headers.any_dropped:
            dropped = dropped_names(names, droppable, headers.masks)
        return Value(
            Inbound(
                headers, counts, offsets(counts), dropped, frames, all_prove=ok and all(headers.mode_words),
                gathered=True, verdict=verdict, text=text, error=error, seq=seq, next_block=announced,
                drops=(drop_words(headers.masks) if headers.any_dropped else NO_DROPS) if ok else (),
            )
        )  # fmt: skip

    def _receive(self, sizes: dict[int, int]) -> dict[int, np.ndarray]:
        """``sizes[src]`` bytes from each rank ``src``, sent point to point: at once where the backend can."""
        backend, channel = self.session.backend, self.channel
        many = receives_many(backend)
        if many is not None:
            return many.recv_many(sizes, channel=channel, timeout=self.deadline.left())
        one = gathers(backend)
        assert one is not None
        return {s: one.recv(n, s, channel=channel, timeout=self.deadline.left()) for s, n in sizes.items()}


def _gather_block(header: bytes, body: np.ndarray, size: int) -> np.ndarray:
    """A gathered inbound's block of ``size`` bytes: the header, then ``body`` (all of it, or none), then zeros."""
    block = np.zeros(size, dtype=np.uint8)
    block[:HEADER_BYTES] = np.frombuffer(header, dtype=np.uint8)
    first = body[: size - HEADER_BYTES]
    block[HEADER_BYTES : HEADER_BYTES + first.size] = first
    return block


def _where(row: np.ndarray) -> list[int]:
    """The indices where a route's row (or column) is true (for W-element rows: cheaper than ``np.flatnonzero``)."""
    return [i for i, x in enumerate(row.tolist()) if x]


def _blocks(header: bytes, payload: bytes | bytearray, counts: Sequence[int], mine: frozenset[int]) -> np.ndarray:
    """The send buffer of the inbound exchange, built with one copy of the payload.

    To each rank ``d``, a block of ``counts[d]`` bytes: the header, then the start of the payload where
    ``mine`` says, then zeros.
    """
    send = np.empty(sum(counts), dtype=np.uint8)
    data = np.frombuffer(payload, dtype=np.uint8)
    head = np.frombuffer(header, dtype=np.uint8)
    pos = 0
    for d, count in enumerate(counts):
        end = pos + count
        send[pos : pos + HEADER_BYTES] = head
        body = data[: count - HEADER_BYTES] if d in mine else data[:0]
        at = pos + HEADER_BYTES + body.size
        send[pos + HEADER_BYTES : at] = body
        send[at:end] = 0  # the unused part of the chunk: never this process's stale memory on the wire
        pos = end
    return send


# ------------------------------------------------------------------------------------------------ results


def exchange_results(
    link: Link,
    fp: int,
    seq: int,
    inbound: Inbound,
    bodies: Mapping[int, bytes | bytearray] | BaseException | None,
    *,
    record: CallCheck | None = None,
    root: int = 0,
) -> Value[bytes] | Error:
    """Rank ``root`` sends every other rank its result body, or its failure; return this rank's body.

    ``bodies`` is, on ``root``, the encoded body for every other rank, or ``root``'s failure; ``None``
    elsewhere (and on ``root`` where its gathered ``inbound`` holds a verdict: nothing was scored).
    ``fp`` and ``seq`` name the call (every receiver checks them); ``inbound`` is what the call's inputs
    gave (its counts size the next blocks). With ``record`` (this rank's :class:`CallCheck`, where no
    inbound exchange checked the call: a reward group's hit) every rank also sends every rank its record,
    and every rank raises together if the records name different calls; a rank other than ``root`` may
    then pass its own failure as ``bodies`` (its call failed before its turn), and every rank raises it
    (:meth:`Link.report_failures`).

    After a gathered inbound (:meth:`Link.gathered`) the block also carries ``root``'s verdict on the
    headers only it read, and every rank acts on it alike: a rank's failure (:meth:`Link.status_round`:
    the origin raises its own exception, the others a :class:`RemoteError`), different calls
    (:meth:`Link.mismatch`) or shared arguments (:meth:`Link.shared_mismatch`), another wire version or an
    unreadable header (``root``'s text); and the inbound block size of a later call.

    Every body rides in a block of the size the previous call's blocks announced, one size for every
    rank (:class:`~syncreward._wire.ResultBlocks`), in one scatter (with ``record``: one ``all_to_all``);
    a body that outgrew its block sends its tail in one more exchange (point to point where the backend
    has them). Returns, on ``root``, ``Value(b"")`` or its own failure; elsewhere the body, or an
    ``Error`` every rank raises (``root`` failed: a :class:`RemoteError`), or this rank's own (``root``
    sent another call's results).
    """
    blocks = link.session.result_blocks
    if link.rank == root:
        return _send_results(link, blocks, fp, seq, inbound, bodies, record, root)
    mine = bodies if isinstance(bodies, BaseException) and record is not None else None
    return _receive_results(link, blocks, fp, seq, inbound, record, root, mine)


def _send_results(
    link: Link,
    blocks: ResultBlocks,
    fp: int,
    seq: int,
    inbound: Inbound,
    outgoing: Mapping[int, bytes | bytearray] | BaseException | None,
    record: CallCheck | None,
    root: int,
) -> Value[bytes] | Error:
    w, cap = link.world_size, blocks.capacity  # what the previous blocks announced (one size for every rank)
    gathered = record is None and inbound.gathered
    verdict = inbound.verdict if gathered else V_OK
    error = outgoing if isinstance(outgoing, BaseException) else None
    bodies: Mapping[int, bytes | bytearray] = {}
    blob = b""
    if verdict != V_OK:
        text = inbound.text.encode("utf-8", "backslashreplace")
        bodies = {r: text for r in range(w) if r != root}
    elif isinstance(outgoing, BaseException):
        blob = error_blob(outgoing)
        bodies = {r: blob for r in range(w) if r != root}
    elif outgoing is not None:
        bodies = outgoing
    status = OK if error is None else FAILED
    learn = status == OK and verdict == V_OK
    nxt = blocks.announce(fp, {r: len(b) for r, b in bodies.items()} if learn else None, inbound.counts)
    room = cap - ResultChunk.HEADER
    overflow = any(len(body) > room for body in bodies.values())
    flags = F_ALL_PROVE if gathered and inbound.all_prove else 0
    drops = inbound.drops if gathered and inbound.drops else NO_DROPS
    send = bytearray(w * cap)
    for r in range(w):  # the root's own block is a header and no body: a scatter sends every rank one block
        body = bodies.get(r, b"")
        chunk = ResultChunk(status, overflow, nxt, len(body), fp, seq, verdict, inbound.next_block, flags, drops)
        chunk.pack_into(send, r * cap, body, cap)
    checks = _blocks_exchange(link, send, cap, record, root, blob)[1]
    if overflow:
        tails = [bodies[r][room:] if r in bodies else b"" for r in range(w)]
        if (p2p := _point_to_point(link, record)) is not None:
            for r, tail in enumerate(tails):
                if tail:
                    p2p.send(np.frombuffer(tail, dtype=np.uint8), r, channel=link.channel, timeout=link.deadline.left())
        else:
            link.all_to_all(b"".join(tails), [len(t) for t in tails], [0] * w)
    blocks.advance(nxt)
    if verdict != V_OK:
        return _verdict_error(link, verdict, inbound.text, inbound.error)
    if checks is not None and (wrong := _checked(link, checks, error, blob, root)):
        return wrong
    return Error(error) if error is not None else Value(b"")


def _receive_results(
    link: Link,
    blocks: ResultBlocks,
    fp: int,
    seq: int,
    inbound: Inbound,
    record: CallCheck | None,
    root: int,
    failure: BaseException | None = None,
) -> Value[bytes] | Error:
    w, cap = link.world_size, blocks.capacity
    room = cap - ResultChunk.HEADER
    mine = error_blob(failure) if failure is not None else b""
    buf, checks = _blocks_exchange(link, None, cap, record, root, mine)
    chunk = ResultChunk.unpack(buf.data)
    body = buf[ResultChunk.HEADER : ResultChunk.HEADER + min(chunk.body_bytes, room)].tobytes()
    if chunk.overflow:
        rest = max(0, chunk.body_bytes - room)
        if (p2p := _point_to_point(link, record)) is not None:
            if rest:
                body += p2p.recv(rest, root, channel=link.channel, timeout=link.deadline.left()).tobytes()
        else:
            body += link.all_to_all(b"", [0] * w, [rest if s == root else 0 for s in range(w)]).tobytes()
    blocks.advance(chunk.next_capacity)
    if record is None and inbound.gathered:  # root's verdict on the headers only it read
        link.session.inbound_blocks.learn(seq, chunk.next_block)
        inbound.settle(chunk.verdict == V_OK and bool(chunk.flags & F_ALL_PROVE), chunk.drops)
        if chunk.verdict != V_OK:
            return _verdict_error(link, chunk.verdict, body.decode("utf-8", "replace"), inbound.error)
    if checks is not None and (wrong := _checked(link, checks, failure, mine, root)):
        return wrong
    if (chunk.fp, chunk.seq) != (fp, seq):
        return Error(
            MismatchError(
                f"rank {root} sent the results of another synced call than this rank's {link.description}. "
                f"HINT: {SAME_CALLS}."
            )
        )
    if chunk.status != OK:
        try:
            info = decode_value(body)
            error = RemoteError(root, info["type"], info["message"], info["traceback"], function=link.function)
        except BaseException as e:  # everything was exchanged: a local failure, the session stays usable
            return Error(e)
        return Error(error)
    return Value(body)


def _point_to_point(link: Link, record: CallCheck | None) -> Gathers | None:
    """The backend's ``send``/``recv``, for a result tail: where it has them and the blocks went in a scatter."""
    return gathers(link.session.backend) if record is None else None


def _verdict_error(link: Link, verdict: int, text: str, mine: BaseException | None) -> Error:
    """What every rank raises after a gathered inbound whose headers showed ``verdict`` (see :func:`exchange_results`).

    ``mine``: this rank's own failure, which its header announced.
    """
    if verdict == V_FAILED:
        got = link.status_round(mine)
        if isinstance(got, Error):
            return got
        return Error(CommunicationError("the scoring rank saw a failure that no rank reported again"))
    if verdict == V_MISMATCH:
        return link.mismatch()
    if verdict == V_SHARED:
        return link.shared_mismatch()
    if verdict == V_VERSION:
        return Error(MismatchError(text))
    return Error(CodecError(text or "the scoring rank could not read the calls' headers"))


def _blocks_exchange(
    link: Link, blocks: bytearray | None, cap: int, record: CallCheck | None, root: int, failure: bytes = b""
) -> tuple[np.ndarray, list[FailedCheck] | None]:
    """Send every rank its ``cap``-byte block of ``blocks`` from ``root``; return this rank's block.

    Without ``record`` (an inbound exchange showed every rank makes the same call) the blocks go out in
    one scatter. With it, in an ``all_to_all`` in which every rank also sends every other rank its
    record and the size of its error report ``failure`` (empty: it did not fail), so every rank can tell
    whether they all scored the same call, and whether a rank failed (the returned checks, in rank order).
    """
    if record is None:
        return link.scatter(blocks or b"", cap, root), None
    me, w = link.rank, link.world_size
    mine = FailedCheck(record, len(failure))
    head = mine.pack()
    extra = cap if me == root else 0
    send = bytearray()
    for d in range(w):
        if d != me:
            send += head
            if blocks is not None:
                send += blocks[d * cap : (d + 1) * cap]
    send_counts = [0 if d == me else FailedCheck.SIZE + extra for d in range(w)]
    recv_counts = [0 if s == me else FailedCheck.SIZE + (cap if s == root else 0) for s in range(w)]
    parts = split(link.all_to_all(send, send_counts, recv_counts), recv_counts)
    checks = [mine if s == me else FailedCheck.unpack(parts[s][: FailedCheck.SIZE].tobytes()) for s in range(w)]
    block = parts[root][FailedCheck.SIZE :] if me != root else np.zeros(cap, dtype=np.uint8)
    return block, checks


def _checked(
    link: Link, checks: Sequence[FailedCheck], mine: BaseException | None, blob: bytes, root: int
) -> Error | None:
    """What a hit's result exchange makes every rank raise: different calls, or a failure of a rank but ``root``.

    ``root``'s own failure reached every rank in its blocks; a failure of another rank (its call failed
    before its turn) reaches every rank here, with ``root``'s among them if it failed too.
    """
    wrong = link.disagreement([c.record for c in checks])
    if wrong is not None:
        return wrong
    if not any(c.failed for s, c in enumerate(checks) if s != root):
        return None
    statuses = [FAILED if c.failed else OK for c in checks]
    return link.report_failures(statuses, [c.failed for c in checks], mine, blob)
