"""The collective procedures every mode shares, over a backend: the inbound exchange and failure reports.

Each function here runs inside one turn of a session (see ``_session``) and returns an outcome
(``_outcome``): ``Value`` of what was received, or an ``Error`` that every rank raises -- because every
rank decided it from the same gathered rows. The arithmetic (sizes, offsets, predictions) lives in
``_wire``.

Three procedures carry the decisions every mode makes the same way:

* :func:`exchange_inbound` -- headers and payloads; every rank raises together if a rank failed, runs
  another version, or makes another call;
* :func:`status_round` -- after work only some ranks did (scoring, planning): every rank says whether
  it failed, and every rank raises together if any did (:func:`report_failures`);
* :func:`mismatch` -- the ranks made different calls: every rank learns every rank's description;
  :func:`shared_mismatch` -- they made the same call with different shared arguments: every rank learns
  every rank's values of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np

from ._codec import decode_value
from ._errors import CodecError, MismatchError, RemoteError
from ._outcome import Error, Value
from ._session import Session
from ._wire import (
    FAILED,
    HEADER_BYTES,
    INBOUND,
    OK,
    VERSION,
    CallCheck,
    Headers,
    SharedValues,
    differing_shared,
    dropped_names,
    error_blob,
    offsets,
    read_report,
    remainder_counts,
    shared_values_by_rank,
    split,
)
from .backends._protocol import scatters

__all__ = [
    "SAME_CALLS",
    "SITE",
    "Inbound",
    "all_to_all",
    "broadcast_blobs",
    "disagreement",
    "exchange_inbound",
    "mismatch",
    "report_failures",
    "scatter",
    "shared_mismatch",
    "status_round",
]


def all_to_all(
    session: Session,
    send: bytes | bytearray | np.ndarray,
    send_counts: Sequence[int],
    recv_counts: Sequence[int],
    channel: int,
    timeout: float,
) -> np.ndarray:
    arr = send if isinstance(send, np.ndarray) else np.frombuffer(send, dtype=np.uint8)
    return session.backend.all_to_all(arr, send_counts, recv_counts, channel=channel, timeout=timeout)


def scatter(
    session: Session, blocks: bytes | bytearray, size: int, root: int, channel: int, timeout: float
) -> np.ndarray:
    """Rank ``root`` sends every rank (itself included) its ``size``-byte block of ``blocks``; return this rank's.

    A backend with the optional ``scatter`` method sends W - 1 messages; the ``all_to_all`` it falls back
    to (gloo's ``alltoallv``) sends W(W - 1), empty ones included, and took 1.3-2.7x as long at W = 4..16
    on the benchmark machine (docs/scale.md).
    """
    w, me = session.world_size, session.rank
    backend = session.backend
    if (scattering := scatters(backend)) is not None:
        data = np.frombuffer(blocks, dtype=np.uint8)
        return scattering.scatter(data, size, root=root, channel=channel, timeout=timeout)
    if me == root:
        mine = bytes(blocks[root * size : (root + 1) * size])
        rest = blocks[: root * size] + blocks[(root + 1) * size :]
        send_counts = [0 if d == root else size for d in range(w)]
        all_to_all(session, rest, send_counts, [0] * w, channel, timeout)
        return np.frombuffer(mine, dtype=np.uint8)
    return all_to_all(session, b"", [0] * w, [size if s == root else 0 for s in range(w)], channel, timeout)


def all_gather(session: Session, row: Sequence[int], channel: int, timeout: float) -> np.ndarray:
    return session.backend.all_gather(np.asarray(row, dtype=np.int64), channel=channel, timeout=timeout)


def broadcast_blobs(session: Session, blob: bytes, sizes: Sequence[int], channel: int, timeout: float) -> list[bytes]:
    """Every rank sends its ``blob`` (``sizes[rank]`` bytes, may be empty) to every rank."""
    w = session.world_size
    buf = all_to_all(session, blob * w, [len(blob)] * w, sizes, channel, timeout)
    return [b.tobytes() for b in split(buf, sizes)]


def _add_note(exc: BaseException, note: str) -> None:
    add = getattr(exc, "add_note", None)  # Python >= 3.11
    if add is not None:
        add(note)


def report_failures(
    session: Session,
    statuses: Sequence[int],
    sizes: Sequence[int],
    mine: BaseException | None,
    blob: bytes,
    channel: int,
    timeout: float,
    function: str,
) -> Error:
    """Every rank learns every failure: the origin re-raises its own, the others a :class:`RemoteError`."""
    failed = [r for r, s in enumerate(statuses) if s]
    sizes = [int(sizes[r]) if statuses[r] else 0 for r in range(session.world_size)]
    blobs = broadcast_blobs(session, blob if mine is not None else b"", sizes, channel, timeout)
    if mine is not None:
        others = [r for r in failed if r != session.rank]
        if others:
            _add_note(mine, f"syncreward: {function!r} also failed on rank(s) {others}")
        return Error(mine)
    origin = failed[0]
    try:
        info = decode_value(blobs[origin])
        error = RemoteError(origin, info["type"], info["message"], info["traceback"], function=function)
    except (CodecError, KeyError, TypeError):
        error = RemoteError(origin, "?", "<undecodable error report>", "", function=function)
    if len(failed) > 1:
        _add_note(error, f"syncreward: {function!r} also failed on rank(s) {failed[1:]}")
    return Error(error)


def status_round(
    session: Session,
    mine: BaseException | None,
    channel: int,
    timeout: float,
    function: str,
    *,
    extra: Sequence[int] = (),
    check: CallCheck | None = None,
    description: str = "",
    shared: SharedValues | None = None,
) -> Value[np.ndarray] | Error:
    """Every rank says whether it failed (``mine``), with ``extra`` numbers; every rank raises if any failed.

    One ``all_gather`` of ``[status, error bytes, (check), *extra]`` per rank, then, only if a rank
    failed, its error to every rank (:func:`report_failures`). With ``check`` (a call no inbound header
    checked: a reward group's hit), the ranks' records are compared first: every rank raises
    :class:`MismatchError` if they made different calls, or the same call with different ``shared``
    arguments. Returns every rank's ``extra`` (rows in rank order).
    """
    blob = error_blob(mine) if mine is not None else b""
    head = [OK if mine is None else FAILED, len(blob), *(check.fields() if check is not None else ())]
    rows = all_gather(session, [*head, *extra], channel, timeout)
    if check is not None:
        checks = [CallCheck.of_fields(row[2 : 2 + CallCheck.FIELDS]) for row in rows.tolist()]
        wrong = disagreement(session, checks, description, channel, timeout, shared=shared, function=function)
        if wrong is not None:
            return wrong
    statuses = [int(x) for x in rows[:, 0]]
    if any(statuses):
        return report_failures(session, statuses, rows[:, 1].tolist(), mine, blob, channel, timeout, function)
    return Value(rows[:, len(head) :])


SITE = " called from "  # how a call's description names its call site (``Call.open``)
SAME_CALLS = "every rank must call the same synced functions in the same order"  # the root of every mismatch HINT


def disagreement(
    session: Session,
    checks: Sequence[CallCheck],
    description: str,
    channel: int,
    timeout: float,
    *,
    shared: SharedValues | None = None,
    function: str = "",
) -> Error | None:
    """Whether the ranks' :class:`CallCheck` records (every rank's, in rank order) name different calls.

    Every rank holds every record, so every rank returns the same answer; on a disagreement every rank
    learns every rank's description (:func:`mismatch`), or, for the same call with different shared
    arguments (``shared``: this rank's), every rank's values of them (:func:`shared_mismatch`).
    """
    if not all(c.same_call(checks[0]) for c in checks[1:]):
        return mismatch(session, [c.desc_bytes for c in checks], description, channel, timeout)
    if shared is not None and not all(c.same_shared(checks[0]) for c in checks[1:]):
        return shared_mismatch(session, shared, function, channel, timeout)
    return None


def mismatch(session: Session, desc_sizes: Sequence[int], description: str, channel: int, timeout: float) -> Error:
    """Every rank learns what every rank called (``desc_sizes[r]``: the size of rank ``r``'s description)."""
    blobs = broadcast_blobs(session, description.encode("utf-8", "backslashreplace"), desc_sizes, channel, timeout)
    texts = [b.decode(errors="replace") for b in blobs]
    lines = [f"  rank {r}: {t}" for r, t in enumerate(texts)]
    hint = (
        f"{SAME_CALLS}, with the same per-sample columns (same names and container types), at the same training "
        "step (a call made on some ranks only, e.g. under `if rank == 0`, shifts every later call)."
    )
    if len({t.rsplit(SITE, 1)[0] for t in texts}) == 1:  # the same call, made from different places
        hint = (
            "the ranks made the same call from different places in the code. If that is a call some ranks make "
            "on their own (a callback or an evaluation under `if rank == 0`), make it on every rank or not at all; "
            "if the ranks run different code on purpose (a Ray driver and a task), make every rank call the "
            "synced function through one shared function."
        )
    elif len({_reward_of(t) for t in texts}) > 1 and len({_columns_of(t) for t in texts}) == 1:
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


_COLUMNS = " per-sample columns "  # what follows the reward's identity in a call's description (``Call.open``)


def _reward_of(description: str) -> str:
    """The reward's identity and options in a call's description (``call #3 at step 1: <this> per-sample ...``)."""
    return description.split(_COLUMNS, 1)[0].split(": ", 1)[-1]


def _columns_of(description: str) -> str:
    return description.rsplit(SITE, 1)[0].split(_COLUMNS, 1)[-1]


def shared_mismatch(session: Session, shared: SharedValues, function: str, channel: int, timeout: float) -> Error:
    """The ranks made the same call with different shared arguments: every rank learns every rank's values.

    Every rank enters it alike (the digests it compares are in the headers or check records every rank
    received). One ``all_gather`` of the reports' sizes, then the reports; every rank raises the same
    :class:`MismatchError`, naming the arguments, how each rank passed them, and what to do.
    """
    report = shared.report()
    sizes = all_gather(session, [len(report)], channel, timeout)[:, 0].tolist()
    blobs = broadcast_blobs(session, report, sizes, channel, timeout)
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


@dataclass
class Inbound:
    """What every rank knows after the inbound exchange of a call."""

    headers: Headers
    counts: list[int]
    offsets: list[int]
    dropped: frozenset[str]
    frames: dict[int, Any] = field(default_factory=dict)  # rank -> its complete payload, for the ranks sent here

    @property
    def total(self) -> int:
        return self.offsets[-1]


def exchange_inbound(
    session: Session,
    *,
    header: bytes,
    payload: bytes | bytearray,
    route: np.ndarray | None,
    error: BaseException | None,
    blob: bytes,
    description: str,
    names: Sequence[str],
    droppable: frozenset[str],
    timeout: float,
    function: str,
    shared: SharedValues,
) -> Value[Inbound] | Error:
    """Send every rank this rank's header plus the start of its payload where ``route`` says; complete the payloads.

    ``route[src, dst]`` says whether ``src``'s payload goes to ``dst`` (``None``: no payload travels).

    One ``all_to_all``: the block to rank ``d`` is the header followed by an *eager* chunk of the size the
    session's predictor gives every rank for this pair (sizes every rank computes alike, so the collective
    always matches). In the steady state the whole payload rides in it; the part that does not fit moves
    in one more exact-size ``all_to_all``. Then, from the headers, every rank raises together if any rank
    failed, the ranks are not making the same call, or they pass different ``shared`` arguments (this
    rank's are ``shared``).
    """
    w, me = session.world_size, session.rank
    eager = session.predictor.predict()
    mine = frozenset(np.flatnonzero(route[me]).tolist()) if route is not None and error is None else frozenset()
    send_counts = (eager[me] + HEADER_BYTES).tolist()
    send = _blocks(header, payload, send_counts, mine)
    recv_counts = (eager[:, me] + HEADER_BYTES).tolist()
    buf = all_to_all(session, send, send_counts, recv_counts, INBOUND, timeout)
    starts = list(accumulate(recv_counts, initial=0))
    headers = Headers.gather(buf, starts[:-1])
    session.predictor.update(headers, route)
    if headers.versions != {VERSION}:
        return Error(
            MismatchError(
                f"ranks run different syncreward wire versions ({sorted(hex(v) for v in headers.versions)}). "
                "HINT: install the same syncreward version on every node."
            )
        )
    problem = headers.problem()
    if problem is not None:
        return Error(CodecError(f"{problem}. HINT: every rank must run the same syncreward version."))
    if headers.failed:
        return report_failures(session, headers.statuses, headers.sizes, error, blob, INBOUND, timeout, function)
    if not headers.agree:
        return mismatch(session, headers.desc_sizes, description, INBOUND, timeout)
    if not headers.shared_agree:
        return shared_mismatch(session, shared, function, INBOUND, timeout)
    counts = headers.counts
    dropped = dropped_names(names, droppable, headers.masks) if droppable and headers.any_dropped else frozenset()
    inbound = Inbound(headers, counts, offsets(counts), dropped)
    if route is None:
        return Value(inbound)
    sizes = headers.sizes
    senders = np.flatnonzero(route[:, me]).tolist()
    for s in senders:
        at = starts[s] + HEADER_BYTES
        inbound.frames[s] = buf[at : min(at + sizes[s], starts[s + 1])]  # (the eager part, if it did not fit)
    if not (route & (np.asarray(sizes)[:, None] > eager)).any():
        return Value(inbound)  # every payload rode whole in its eager chunk, on every rank
    rest = remainder_counts(sizes, eager, route)
    if rest.any():
        out = b"".join(payload[int(eager[me, d]) :] if rest[me, d] else b"" for d in range(w) if d in mine)
        recv = rest[:, me].tolist()
        parts = split(all_to_all(session, out, rest[me].tolist(), recv, INBOUND, timeout), recv)
        for s in range(w):
            if recv[s]:
                inbound.frames[s] = inbound.frames[s].tobytes() + parts[s].tobytes()
    return Value(inbound)
