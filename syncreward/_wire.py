"""The wire protocol's arithmetic, as pure functions: headers, sizes, offsets and predictions.

Nothing here talks to another rank. Every function is a function of its inputs, so the protocol can
be tested without processes, and every rank that feeds the same inputs (the gathered headers, which
every rank sees identically) computes the same outputs -- which the collectives require: gloo aborts
the *process* when two ranks disagree about the size of a collective.

The header every rank sends every other rank at the start of a call (int64 words)::

    [version, seq, status, fingerprint, step, n_samples, payload_bytes, mode_word, shared, drop_mask x4]

* ``seq``: the call's sequence number on its session; ``step``: the training step the call belongs to
  (TRL's ``trainer_state.global_step``, a ``step=``/``global_step=`` argument, else ``NO_STEP``). Ranks
  whose ``seq``, ``fingerprint`` or ``step`` differ are making different calls: every rank raises
  :class:`~syncreward.MismatchError`.
* ``shared``: a digest of the call's plain shared arguments (:class:`SharedValues`; ``NO_SHARED``: none).
  Ranks whose digests differ passed different values for an argument that is one value for the whole
  batch: every rank raises :class:`~syncreward.MismatchError` naming it, rather than score every rank's
  samples with one rank's value.
* ``status``: ``OK``, or ``FAILED`` when this rank failed before the exchange; then ``payload_bytes``
  is the size of its error blob, which travels instead of the payload.
* ``mode_word``: a word the call's mode fills, which every rank reads from every rank's header
  (``mode="shard"`` with ``group_by``: the size of the rank's group-key frame; a reward group's miss:
  whether the rank's columns prove identity; else 0).
* ``drop_mask``: the ``**kwargs`` columns this rank leaves behind (they hold non-plain data). Column
  ``i`` of the sorted column names is bit ``i``; past ``MAX_EXACT_DROPS`` columns, a column's bit is a
  hash of its name, so a collision can only leave one more column behind (which the function then
  sees as a ``NotSynced`` placeholder), never send one that should stay.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from ._codec import encode_value

__all__ = [
    "FAILED",
    "HEADER_LEN",
    "INBOUND",
    "NO_STEP",
    "OK",
    "OUTBOUND",
    "CallCheck",
    "FailedCheck",
    "CallOrder",
    "VERSION",
    "Headers",
    "Predictor",
    "ResultBlocks",
    "InboundBlocks",
    "NO_DROPS",
    "ResultChunk",
    "dropped_names",
    "drop_mask",
    "eager_sizes",
    "error_blob",
    "fingerprint",
    "fingerprint_bytes",
    "offsets",
    "remainder_counts",
    "ResultPredictor",
    "split",
]

VERSION = 0x5352_0008  # the first header word: ranks that run another version raise (each version: CHANGELOG.md)
H_VERSION, H_SEQ, H_STATUS, H_FP, H_STEP, H_N, H_SIZE, H_MODE_WORD, H_SHARED, H_DROP = range(10)
DROP_WORDS = 4
HEADER_LEN = H_DROP + DROP_WORDS
DROP_BITS = 63 * DROP_WORDS
NO_DROPS = (0,) * DROP_WORDS  # the drop words of calls that left nothing behind
MAX_EXACT_DROPS = DROP_BITS
OK, FAILED = 0, 1
NO_STEP = -1
NO_SHARED = 0  # the shared digest of a call without shared arguments to check
MAX_FIELD = 1 << 40  # no header size or count is larger (1 TiB)

EAGER_MARGIN = 1.2  # an eager chunk is 1.2x the payload predicted for it: a little growth still fits
MAX_EAGER = 4 << 20  # payloads up to 4 MiB per pair ride in the header collective
PREDICTED_CALLS = 64  # functions (fingerprints) whose sizes a session remembers

# The two channels of a session: a call's inputs travel on INBOUND (its channel-0 turn), its results on
# OUTBOUND (channel 1). Each has its own turn order and, in the torch backend, its own gloo group.
INBOUND, OUTBOUND = 0, 1

V = TypeVar("V")
V_any = TypeVar("V_any")


def fingerprint_bytes(data: bytes) -> int:
    """A signed 64-bit hash of ``data``, identical on every rank."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def fingerprint(text: str) -> int:
    """A signed 64-bit hash of a call description, identical on every rank."""
    return fingerprint_bytes(text.encode("utf-8", "backslashreplace"))


def round8(n: int) -> int:
    return (n + 7) // 8 * 8


# --------------------------------------------------------------------------------------------- headers


def _drop_bit(names: Sequence[str], i: int) -> int:
    return i if i < MAX_EXACT_DROPS else fingerprint(names[i]) % DROP_BITS


def drop_mask(names: Sequence[str], dropped: Iterable[str]) -> list[int]:
    """Bit mask (``DROP_WORDS`` int64 words) of the ``dropped`` columns among the sorted column ``names``."""
    words = [0] * DROP_WORDS
    if not dropped:  # most calls: nothing left behind
        return words
    index = {n: i for i, n in enumerate(names)}
    for name in dropped:
        bit = _drop_bit(names, index[name])
        words[bit // 63] |= 1 << (bit % 63)
    return words


def dropped_names(names: Sequence[str], droppable: Iterable[str], masks: np.ndarray) -> frozenset[str]:
    """The ``droppable`` columns left behind on any rank, from every rank's ``drop_mask`` (rows of ``masks``)."""
    words = [int(np.bitwise_or.reduce(masks[:, w])) if len(masks) else 0 for w in range(DROP_WORDS)]
    can = set(droppable)
    out = set()
    for i, name in enumerate(names):
        if name in can:
            bit = _drop_bit(names, i)
            if words[bit // 63] >> (bit % 63) & 1:
                out.add(name)
    return frozenset(out)


def pack_header(
    *,
    seq: int,
    status: int,
    fp: int,
    step: int,
    n: int,
    size: int,
    mode_word: int,
    mask: Sequence[int],
    shared: int = NO_SHARED,
) -> bytes:
    return _HEADER.pack(VERSION, seq, status, fp, step, n, size, mode_word, shared, *mask)


HEADER_BYTES = HEADER_LEN * 8
_HEADER = struct.Struct(f"<{HEADER_LEN}q")  # what np.asarray(words, dtype=np.int64).tobytes() writes, in one call
_HEADER_RANGE = np.arange(HEADER_BYTES, dtype=np.intp)
_UNPACKED_HEADERS = 8  # up to this many gathered headers are read with struct (cheaper than one array's set-up)


class Headers:
    """Every rank's header, as every rank received them (identical on every rank).

    Every field is read from Python lists made once (one ``tolist`` of the whole table, when the headers
    are made): the checks every call makes are builtins over W-element lists, not numpy calls on tiny
    arrays; the ones read several times a call are computed once.
    """

    __slots__ = ("_agree", "_failed", "_rows", "_words")

    def __init__(self, rows: np.ndarray | None, words: list[list[int]] | None = None) -> None:
        self._rows = rows  # (world_size, HEADER_LEN) int64; made from ``words`` where first needed
        self._words: list[list[int]] = rows.T.tolist() if words is None else words  # type: ignore[union-attr]
        self._agree: bool | None = None
        self._failed: list[int] | None = None

    @property
    def rows(self) -> np.ndarray:
        """The table, one row per rank."""
        if self._rows is None:
            self._rows = np.asarray(self._words, dtype=np.int64).T.copy()
        return self._rows

    @classmethod
    def gather(cls, buf: np.ndarray, starts: Sequence[int]) -> Headers:
        """The headers at byte offsets ``starts`` of a received buffer (one copy, whatever the world size)."""
        at = np.asarray(starts, dtype=np.intp)[:, None] + _HEADER_RANGE
        return cls(buf[at].view(np.int64))

    @classmethod
    def blocks(cls, buf: np.ndarray, world_size: int, size: int) -> Headers:
        """The headers at the start of each of ``buf``'s ``world_size`` blocks of ``size`` bytes (a gather's)."""
        if world_size <= _UNPACKED_HEADERS:  # a few headers: unpacked one by one, no array made
            view = memoryview(buf)  # type: ignore[arg-type]  # (a uint8 array: a buffer)
            rows = [_HEADER.unpack_from(view, r * size) for r in range(world_size)]
            return cls(None, [list(column) for column in zip(*rows, strict=True)])
        if size % 8:  # (every block size is a multiple of 8: a view of the rows then needs no copy)
            return cls.gather(buf, range(0, world_size * size, size))
        return cls(buf[: world_size * size].reshape(world_size, size)[:, :HEADER_BYTES].view(np.int64))

    @property
    def versions(self) -> set[int]:
        return set(self._words[H_VERSION])

    @property
    def statuses(self) -> list[int]:
        return self._words[H_STATUS]

    @property
    def failed(self) -> list[int]:
        if self._failed is None:
            statuses = self._words[H_STATUS]
            self._failed = [r for r, s in enumerate(statuses) if s != OK] if any(statuses) else []
        return self._failed

    @property
    def agree(self) -> bool:
        """Whether every rank makes the same call (sequence number, function/schema and step)."""
        if self._agree is None:
            w = self._words
            seq, fp, step = w[H_SEQ], w[H_FP], w[H_STEP]
            self._agree = min(seq) == max(seq) and min(fp) == max(fp) and min(step) == max(step)
        return self._agree

    @property
    def shared_agree(self) -> bool:
        """Whether every rank passed the same plain shared arguments (the same :class:`SharedValues` digest)."""
        w = self._words[H_SHARED]
        return min(w) == max(w)

    @property
    def counts(self) -> list[int]:
        return self._words[H_N]

    @property
    def sizes(self) -> list[int]:
        return self._words[H_SIZE]

    @property
    def mode_words(self) -> list[int]:
        """Every rank's mode word: what its mode says in the header.

        ``mode="shard"`` with ``group_by``: the size of its key frame; a reward group's miss: whether its
        columns prove identity.
        """
        return self._words[H_MODE_WORD]

    @property
    def masks(self) -> np.ndarray:
        return self.rows[:, H_DROP : H_DROP + DROP_WORDS]

    @property
    def any_dropped(self) -> bool:
        """Whether some rank left a column behind (most calls: none did)."""
        return any(any(self._words[H_DROP + i]) for i in range(DROP_WORDS))

    def problem(self) -> str | None:
        """Why these headers cannot be acted on (negative or absurd sizes), or ``None``.

        A header is only ever written by syncreward, but it is input like any other: a corrupted or hostile
        one must give every rank the same clear error, never a huge allocation or a mis-sized collective.
        """
        for col, what in (
            (H_N, "sample count"),
            (H_SIZE, "payload size"),
            (H_MODE_WORD, "mode word"),
        ):
            values = self._words[col]
            if min(values) < 0 or max(values) > MAX_FIELD:
                bad = [i for i, v in enumerate(values) if not 0 <= v <= MAX_FIELD]
                return f"rank(s) {bad} sent an invalid {what} in the record of their call ({values[bad[0]]})"
        return None

    @property
    def fp(self) -> int:
        """The fingerprint every rank agreed on, or 0 when they did not (or some rank failed)."""
        if not self.agree or self.failed:
            return 0
        return self._words[H_FP][0]


def offsets(counts: Sequence[int]) -> list[int]:
    """``[0, c0, c0 + c1, ...]``: where each rank's samples start in the global batch."""
    out = [0]
    for c in counts:
        out.append(out[-1] + int(c))
    return out


def split(buf: np.ndarray, counts: Sequence[int]) -> list[np.ndarray]:
    """Cut a received buffer into the consecutive blocks of ``counts`` bytes (views, no copies)."""
    out, pos = [], 0
    for c in counts:
        out.append(buf[pos : pos + c])
        pos += c
    return out


# --------------------------------------------------------------------------------------------- payloads


def eager_sizes(sizes: Sequence[int], route: np.ndarray) -> np.ndarray:
    """Per-pair eager chunk sizes ``[src, dst]`` for a call whose payloads are ``sizes`` bytes.

    ``route`` is the ``(src, dst)`` boolean matrix of where its mode sends payloads.
    """
    per_src = (np.asarray(sizes, dtype=np.float64) * EAGER_MARGIN).astype(np.int64)
    chunk = np.minimum(np.maximum((per_src + 7) // 8 * 8, 0), MAX_EAGER)
    return np.where(route, chunk[:, None], 0)


def remainder_counts(sizes: Sequence[int], eager: np.ndarray, route: np.ndarray) -> np.ndarray:
    """``rest[src, dst]``: bytes of ``src``'s payload that did not fit in its eager chunk to ``dst``."""
    rest = np.asarray(sizes, dtype=np.int64)[:, None] - eager
    return np.where(route, np.maximum(rest, 0), 0).astype(np.int64)


class CallOrder(Generic[V]):
    """What each function's last call left, and which function followed which: the next call's guess.

    TRL calls several rewards per step in a fixed order (accuracy, format, length, ...), each with its
    own sizes. A ``CallOrder`` remembers, per function (fingerprint), what its last call left (``V``)
    and which function followed which; it predicts the next call as the function that followed the
    previous one last time (a function never seen followed: the same function again). Both tables
    hold at most ``capacity`` functions, dropping the least recently seen.
    """

    def __init__(self, capacity: int = PREDICTED_CALLS) -> None:
        self.capacity = capacity
        self.last = 0
        self.after: OrderedDict[int, int] = OrderedDict()
        self.seen: OrderedDict[int, V] = OrderedDict()

    def record(self, fp: int, left: V | None) -> None:
        """A call of function ``fp`` happened; it left ``left`` (``None``: nothing to remember)."""
        _lru_put(self.after, self.last, fp, self.capacity)
        self.last = fp
        if left is not None:
            _lru_put(self.seen, fp, left, self.capacity)

    def predict(self) -> V | None:
        """What the function expected next left on its last call (``None``: never seen)."""
        return self.seen.get(self.after.get(self.last, self.last))


def _lru_put(table: OrderedDict[int, V_any], key: int, value: V_any, capacity: int) -> None:
    """Insert as the most recent entry, dropping the oldest past ``capacity``."""
    table[key] = value
    table.move_to_end(key)
    while len(table) > capacity:
        table.popitem(last=False)


class Predictor:
    """Predicts the eager chunk sizes of the next call from the calls every rank has seen.

    The call order (:class:`CallOrder`) of per-pair chunk sizes. Its state changes only through
    :meth:`update`, with the headers of a call -- identical on every rank -- so every rank predicts
    the same sizes even when the ranks are about to make *different* calls (that mismatch is then
    reported, not a gloo abort).
    """

    def __init__(self, world_size: int, capacity: int = PREDICTED_CALLS) -> None:
        self.world_size = world_size
        self.order: CallOrder[np.ndarray] = CallOrder(capacity)

    def predict(self) -> np.ndarray:
        sizes = self.order.predict()
        return sizes if sizes is not None else np.zeros((self.world_size, self.world_size), dtype=np.int64)

    def update(self, headers: Headers, dests: np.ndarray | None) -> None:
        """Record a call: ``dests`` is how its mode routes payloads (``None``: no eager payload)."""
        fp = headers.fp
        self.order.record(fp, eager_sizes(headers.sizes, dests) if fp and dests is not None else None)


# --------------------------------------------------------------------------------------------- results

_CHUNK = struct.Struct(f"<BBBBIIQqq{DROP_WORDS}q")
# status, overflow follows, verdict, flags, next result block's capacity, next inbound block's size, body bytes,
# fp, seq, the drop mask every rank's columns left behind (OR of the headers' masks)
BASE_CAPACITY = 256  # a block's size before anything was learned (the chunk header included)
MAX_CAPACITY = 64 << 20

# What the scoring rank of ``main`` decided from the gathered headers (a gathering backend: only it reads
# them), sent to every rank in its result block: every rank then raises together (``_exchange``).
V_OK, V_FAILED, V_MISMATCH, V_SHARED, V_VERSION, V_UNREADABLE = range(6)
F_ALL_PROVE = 1  # a chunk flag: every rank's mode word was non-zero (a reward group's miss: columns prove identity)


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs a call per field
class ResultChunk:
    """The block the scoring rank sends each rank in ``main`` mode: a chunk header, then the body.

    Its size was fixed by the *previous* call's blocks, which announced it (``next_capacity``, the same
    for every rank, so the blocks can go in one scatter), so every rank knows it without agreeing on
    anything else first -- not even on which call this is (``fp``, ``seq`` say that, and the receiver
    checks). A body that does not fit continues in one more exchange (``overflow``).

    On a gathering backend the scoring rank alone read the call's headers: ``verdict`` is what it decided
    (``V_OK``, or why every rank raises: a rank failed, the ranks made different calls or passed different
    shared arguments, another wire version, an unreadable header -- the last two with the text as body),
    ``next_block`` the size of a later call's inbound block (:class:`InboundBlocks`), ``flags`` and
    ``drops`` what the headers said that a reward group keeps (:data:`F_ALL_PROVE`, the columns left behind).
    """

    status: int
    overflow: bool
    next_capacity: int
    body_bytes: int
    fp: int  # the call these results belong to: the receiver checks it is making the same call
    seq: int
    verdict: int = V_OK
    next_block: int = 0
    flags: int = 0
    drops: tuple[int, ...] = NO_DROPS

    HEADER = _CHUNK.size

    def pack(self, body: bytes | bytearray, capacity: int) -> bytes:
        """The ``capacity``-byte block: the chunk header, the start of ``body``, zeros."""
        block = bytearray(capacity)
        self.pack_into(block, 0, body, capacity)
        return bytes(block)

    def pack_into(self, buf: bytearray, at: int, body: bytes | bytearray, capacity: int) -> None:
        """Write the block at byte ``at`` of ``buf`` (whose ``capacity`` bytes there are zeros)."""
        _CHUNK.pack_into(
            buf,
            at,
            self.status,
            self.overflow,
            self.verdict,
            self.flags,
            self.next_capacity,
            self.next_block,
            self.body_bytes,
            self.fp,
            self.seq,
            *self.drops,
        )
        take = min(len(body), capacity - _CHUNK.size)
        if take:
            buf[at + _CHUNK.size : at + _CHUNK.size + take] = memoryview(body)[:take]

    @classmethod
    def unpack(cls, buf: bytes | memoryview) -> ResultChunk:
        status, overflow, verdict, flags, capacity, block, size, fp, seq, *drops = _CHUNK.unpack_from(buf)
        return cls(status, bool(overflow), capacity, size, fp, seq, verdict, block, flags, tuple(drops))


def verdict_of(headers: Headers) -> tuple[int, str]:
    """What every rank must do after the inbound headers ``headers``: ``(V_OK, "")`` or why every rank raises.

    For ``V_VERSION`` and ``V_UNREADABLE`` the text is the message every rank raises.
    """
    if headers.versions != {VERSION}:
        return V_VERSION, (
            f"ranks run different syncreward wire versions ({sorted(hex(v) for v in headers.versions)}). "
            "HINT: install the same syncreward version on every node."
        )
    problem = headers.problem()
    if problem is not None:
        return V_UNREADABLE, f"{problem}. HINT: every rank must run the same syncreward version."
    if headers.failed:
        return V_FAILED, ""
    if not headers.agree:
        return V_MISMATCH, ""
    if not headers.shared_agree:
        return V_SHARED, ""
    return V_OK, ""


def drop_words(masks: np.ndarray) -> tuple[int, ...]:
    """The OR of every rank's drop mask (rows of ``masks``): what a rank that did not see the headers needs."""
    return tuple(int(np.bitwise_or.reduce(masks[:, w])) if len(masks) else 0 for w in range(DROP_WORDS))


# --------------------------------------------------------------------------------------------- inbound blocks

BLOCK_PAYLOAD = 256  # the payload bytes of an inbound block before anything was learned
BASE_BLOCK = HEADER_BYTES + BLOCK_PAYLOAD
BLOCK_WINDOW = 16  # an inbound block fits the largest payload of the last 16 gathered calls
BLOCK_LAG = 8  # the size a call announces is used from the call 8 gathered calls later
# A block holds at most 256 KiB of payload; a larger payload goes whole point to point, straight into a
# buffer of its size, and needs no room in the block. torch's gloo gather receives every block into a flat
# buffer of its own, then copies each into the output: the scoring rank moves every block twice, its own
# (header-only) block included, through freshly allocated memory. At W=4 with ~2 MiB per rank, blocks
# sized for those payloads made main 5-13 % slower than the all_to_all inbound it replaced.
MAX_BLOCK_PAYLOAD = 256 << 10


def block_need(size: int) -> int:
    """The block a payload (or error report) of ``size`` bytes needs.

    It fits with the eager headroom, or it goes point to point (more than ``MAX_BLOCK_PAYLOAD`` with the
    headroom) and needs the header only.
    """
    room = round8(int(max(size, 0) * EAGER_MARGIN))
    return HEADER_BYTES + (max(room, 64) if room <= MAX_BLOCK_PAYLOAD else 64)


def block_for(sizes: Sequence[int]) -> int:
    """The inbound block that fits every one of ``sizes`` (payloads, or error reports) with the eager headroom.

    A payload larger than ``MAX_BLOCK_PAYLOAD`` (with the headroom) goes point to point: it needs the header only.
    """
    return max((block_need(int(s)) for s in sizes), default=HEADER_BYTES + 64)


BLOCK_SKEW = 1.5  # the blocks of a gather hold at most 1.5x what the ranks that send need in all


def bounded_block(sizes: Sequence[int]) -> int:
    """The block for a call whose ranks sent payloads of ``sizes``: the largest need, unless the ranks are skewed.

    A gather moves one block per rank, so blocks sized for the largest payload cost the scoring rank W times
    that payload. Where those blocks would hold more than ``BLOCK_SKEW`` times what the sending ranks need
    in all (one rank with most of the batch), the block is the largest need that keeps within it: the
    larger payloads send their rest point to point (exact sizes), and the scoring rank's buffer stays
    within about ``BLOCK_SKEW`` times the batch instead of W times its largest part. A rank that sends
    nothing (the scoring rank itself) does not count.
    """
    needs = sorted([block_need(s) for s in sizes if s > 0])
    if not needs:
        return block_for(())
    budget = BLOCK_SKEW * sum(needs)
    if len(needs) * needs[-1] <= budget:  # (most calls: the ranks are not skewed, the largest need fits)
        return needs[-1]
    fits = [n for n in needs if len(needs) * n <= budget]
    return fits[-1] if fits else needs[0]


class InboundBlocks:
    """``mode="main"``'s inbound blocks on a gathering backend: one size B for every rank of a call's gather.

    Every rank sends the scoring rank one B-byte block (header, then the start of its payload); the part
    of a payload past it follows point to point. B must be the same on every rank, yet only the scoring
    rank reads the sizes: it announces a size in each gathered call's result block (:meth:`announce`, the
    largest need of the last ``BLOCK_WINDOW`` gathered calls, :func:`bounded_block` where ranks are skewed:
    it grows at once and shrinks back when the large calls leave the window), and a call uses what the
    gathered call ``BLOCK_LAG`` gathered calls before it announced (:meth:`source`): concurrent ``async``
    calls (up to ``BLOCK_LAG`` of them) keep overlapping, because no call waits for the results of the call
    just before it. Every rank records the same gathered calls in the same order (:meth:`gathered`), so
    every rank picks the same announcement.
    """

    def __init__(self) -> None:
        self._needs: list[int] = []  # on the scoring rank: the last BLOCK_WINDOW gathered calls' needs
        self._calls: list[int] = []  # the sequence numbers of the gathered calls, oldest first (the last BLOCK_LAG + 1)
        self._announced: dict[int, int] = {}  # sequence number -> the size its result block announced
        self._lock = threading.Lock()  # the inbound turn reads what the results turn learns (two threads)

    def gathered(self, seq: int) -> int | None:
        """Call ``seq`` gathers its inputs: the sequence number of the call whose announced size it uses.

        ``None``: none (``BASE_BLOCK``). Called in the call's inbound turn (sequence order), on every rank.
        """
        self._calls.append(seq)
        if len(self._calls) <= BLOCK_LAG:
            return None
        source = self._calls[-1 - BLOCK_LAG]
        del self._calls[: -1 - BLOCK_LAG]
        with self._lock:
            for s in [s for s in self._announced if s < source]:
                del self._announced[s]
        return source

    def announce(self, seq: int, sizes: Sequence[int] | None) -> int:
        """On the scoring rank: call ``seq`` saw payloads of ``sizes`` (``None``: nothing to learn); its size to use."""
        if sizes is not None:
            self._needs.append(bounded_block(sizes))
            del self._needs[:-BLOCK_WINDOW]
        size = max(self._needs, default=BASE_BLOCK)
        with self._lock:
            self._announced[seq] = size
        return size

    def learn(self, seq: int, size: int) -> None:
        """Elsewhere: call ``seq``'s result block announced ``size``."""
        with self._lock:
            self._announced[seq] = size

    def size(self, source: int | None) -> int | None:
        """The block size of a call whose announcement comes from ``source``; ``None``: not learned yet."""
        if source is None:
            return BASE_BLOCK
        with self._lock:
            return self._announced.get(source)


@dataclass(frozen=True)
class CallCheck:
    """What a rank says of its call where no inbound header checked it (a reward group's hit), to every rank.

    Every rank receives every other rank's record (``main``: in the hit's result exchange; ``replicate``:
    in its status round), so every rank sees the same set and every rank raises together when the records
    differ (members called in another order). ``desc_bytes`` sizes the description every rank then sends.
    """

    fp: int
    seq: int
    step: int
    shared: int  # the digest of the call's plain shared arguments (``SharedValues.digest``)
    desc_bytes: int

    SIZE = 40
    FIELDS = 5
    _STRUCT = struct.Struct("<qqqqq")

    def fields(self) -> tuple[int, int, int, int, int]:
        return (self.fp, self.seq, self.step, self.shared, self.desc_bytes)

    @classmethod
    def of_fields(cls, fields: Sequence[int]) -> CallCheck:
        fp, seq, step, shared, desc = (int(x) for x in fields)
        return cls(fp, seq, step, shared, max(0, min(desc, MAX_DESC)))

    def pack(self) -> bytes:
        return self._STRUCT.pack(*self.fields())

    @classmethod
    def unpack(cls, buf: bytes | memoryview) -> CallCheck:
        return cls.of_fields(cls._STRUCT.unpack_from(buf))

    def same_call(self, other: CallCheck) -> bool:
        return (self.fp, self.seq, self.step) == (other.fp, other.seq, other.step)

    def same_shared(self, other: CallCheck) -> bool:
        return self.shared == other.shared


@dataclass(frozen=True)
class FailedCheck:
    """A :class:`CallCheck` and the size of the rank's error report (0: it did not fail), in a hit's result exchange."""

    record: CallCheck
    failed: int

    SIZE = CallCheck.SIZE + 8
    _FAILED = struct.Struct("<q")

    def pack(self) -> bytes:
        return self.record.pack() + self._FAILED.pack(self.failed)

    @classmethod
    def unpack(cls, buf: bytes | memoryview) -> FailedCheck:
        (failed,) = cls._FAILED.unpack_from(buf, CallCheck.SIZE)
        return cls(CallCheck.unpack(buf), max(0, failed))


MAX_DESC = 1 << 20  # a call description is a line of text: a larger size in a check record is not believed


class ResultPredictor:
    """The scoring rank's guess of the next result blocks' sizes, per function, from their last bodies.

    The call order (:class:`CallOrder`) of bytes per sample, so each call's blocks are sized for *its*
    function's results. Only the scoring rank uses it; what it predicts reaches the other ranks as each
    block's ``next_capacity``.
    """

    def __init__(self, capacity: int = PREDICTED_CALLS) -> None:
        self.order: CallOrder[float] = CallOrder(capacity)

    def update(self, fp: int, bodies: dict[int, int], counts: Sequence[int]) -> None:
        """Record a call's result bodies (bytes per receiving rank)."""
        rates = [size / counts[r] for r, size in bodies.items() if counts[r]]
        self.order.record(fp, max(rates) if rates else None)

    def next_capacities(self, counts: Sequence[int]) -> list[int]:
        """Block sizes for the next call, assuming each rank keeps its sample count (25% headroom)."""
        rate = self.order.predict()
        if rate is None:
            return [BASE_CAPACITY] * len(counts)
        return [min(MAX_CAPACITY, round8(ResultChunk.HEADER + 64 + int(rate * 1.25 * n))) for n in counts]

    def next_capacity(self, counts: Sequence[int]) -> int:
        """One block size for every rank's next block (a scatter sends equal blocks): the largest needed."""
        return max(self.next_capacities(counts), default=BASE_CAPACITY)


class ResultBlocks:
    """``mode="main"``'s result blocks on one session: the size every rank's next block has.

    Every block announces the size of the next call's blocks (``next_capacity``, one size for every
    rank), so every rank knows the size of its next block without agreeing on anything first. The
    scoring rank predicts it (:class:`ResultPredictor`); every rank takes it up with :meth:`advance`.
    """

    def __init__(self) -> None:
        self.capacity = BASE_CAPACITY  # what the previous blocks announced
        self._predictor = ResultPredictor()

    def announce(self, fp: int, bodies: dict[int, int] | None, counts: Sequence[int]) -> int:
        """On the scoring rank: learn this call's bodies (``None``: it failed) and size the next blocks."""
        if bodies is not None:
            self._predictor.update(fp, bodies, counts)
        return self._predictor.next_capacity(counts)

    def advance(self, capacity: int) -> None:
        """The next blocks have ``capacity`` bytes (as this call's blocks announced)."""
        self.capacity = capacity


# --------------------------------------------------------------------------------------------- errors


def _safe(fn: Callable[[], str], fallback: str) -> str:
    try:
        text = fn()
    except BaseException as e:  # a broken __str__ must not stop the error from travelling
        return f"{fallback} ({type(e).__name__} while formatting it)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_blob(exc: BaseException) -> bytes:
    """Serialize an exception for the other ranks: type name, message, traceback (plain data only).

    Never raises: an exception whose ``str()`` or traceback cannot be formatted still travels, with a
    placeholder saying so.
    """
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    message = _safe(lambda: str(exc), "<the exception's str() failed>")
    tb = _safe(lambda: "".join(traceback.format_exception(exc)), f"{name}: <no traceback>")
    out = bytearray()
    encode_value({"type": name, "message": message, "traceback": tb}, out)
    return bytes(out)
