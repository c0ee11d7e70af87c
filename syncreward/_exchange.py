"""The exchange protocol shared by every mode: call ordering, the header, collective failure.

Every synced call on a rank gets a sequence number from its :class:`Link` (one per backend). A call
goes through two *turns*: the inbound exchange on channel 0 and the outbound exchange on channel 1,
each taken in sequence order. Because the turns are taken in order per channel and the channels are
independent, two ``async`` synced rewards that TRL runs concurrently on one event loop issue their
collectives in the same order on every rank, while their function bodies still overlap.

Each inbound exchange starts with one ``all_to_all`` that gives every rank every other rank's fixed-size
int64 header (and, in ``main``/``replicate``, the start of its payload -- see ``Call.exchange_header``)::

    [version, seq, status, fingerprint, n_samples, payload_bytes, description_bytes, aux, drop_mask x4]

From the header every rank knows every other rank's batch size and payload size (so any remainder of
a payload moves in one exact-size ``all_to_all`` with no padding), whether some rank failed locally (then the error
travels instead of the payload and every rank raises), and whether every rank is making the same
call (function, mode and column schema fingerprint, and sequence number; if not, the descriptions
travel and every rank raises :class:`MismatchError`).
"""

from __future__ import annotations

import hashlib
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

import numpy as np

from ._codec import decode_value, encode_value
from ._errors import MismatchError, RemoteError, SyncTimeoutError
from .backends import Backend

__all__ = ["Link", "get_link"]

VERSION = 0x5352_0001
H_VERSION, H_SEQ, H_STATUS, H_FP, H_N, H_SIZE, H_DESC, H_AUX, H_DROP = range(9)
DROP_WORDS = 4
HEADER_LEN = H_DROP + DROP_WORDS
MAX_DROPPABLE = 63 * DROP_WORDS
OK, FAILED = 0, 1


def fingerprint(text: str) -> int:
    """A signed 64-bit hash of a call description, identical on every rank."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def drop_mask(names: Sequence[str], dropped: Sequence[str]) -> list[int]:
    """Bit mask (DROP_WORDS int64 words) of the ``dropped`` columns among the sorted column ``names``."""
    words = [0] * DROP_WORDS
    index = {n: i for i, n in enumerate(names)}
    for name in dropped:
        i = index[name]
        words[i // 63] |= 1 << (i % 63)
    return words


def dropped_names(names: Sequence[str], header: np.ndarray) -> frozenset[str]:
    """Columns dropped on any rank, from the gathered headers."""
    out = set()
    for w in range(DROP_WORDS):
        word = int(np.bitwise_or.reduce(header[:, H_DROP + w]))
        for b in range(63):
            if word >> b & 1 and w * 63 + b < len(names):
                out.add(names[w * 63 + b])
    return frozenset(out)


def error_blob(exc: BaseException) -> bytes:
    """Serialize an exception for the other ranks (plain data only: type name, message, traceback)."""
    t = type(exc)
    name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    out = bytearray()
    encode_value({"type": name, "message": str(exc), "traceback": "".join(traceback.format_exception(exc))}, out)
    return bytes(out)


def _add_note(exc: BaseException, note: str) -> None:
    add = getattr(exc, "add_note", None)  # Python >= 3.11
    if add is not None:
        add(note)


class Turnstile:
    """Lets steps through strictly in sequence order (one per sequence number)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._next = 0

    @contextmanager
    def turn(self, seq: int, timeout: float) -> Iterator[None]:
        with self._cv:
            if not self._cv.wait_for(lambda: self._next == seq, timeout):
                raise SyncTimeoutError(
                    f"synced call #{seq} waited {timeout:.0f}s for earlier synced calls on this rank to finish their "
                    "exchange. HINT: an earlier async synced call may be stuck; check for a hung reward."
                )
        try:
            yield
        finally:
            with self._cv:
                self._next = seq + 1
                self._cv.notify_all()


class Link:
    """Per-backend state on this process: sequence numbers, turnstiles, adaptive result capacities."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.rank = backend.rank
        self.world_size = backend.world_size
        self.turns = (Turnstile(), Turnstile())
        self.capacity: dict[int, int] = {}
        # eager[s, d]: bytes of rank s's payload that ride to rank d in the header collective; identical
        # on every rank, predicted from the previous call (see Call.exchange_header)
        self.eager = np.zeros((self.world_size, self.world_size), dtype=np.int64)
        self._seq = 0
        self._lock = threading.Lock()

    def next_seq(self) -> int:
        with self._lock:
            seq = self._seq
            self._seq += 1
        return seq

    # ------------------------------------------------------------------------------------------ collectives

    def all_gather(self, row: Sequence[int] | np.ndarray, channel: int, timeout: float) -> np.ndarray:
        return self.backend.all_gather(np.asarray(row, dtype=np.int64), channel=channel, timeout=timeout)

    def all_to_all(
        self,
        send: bytes | bytearray | np.ndarray,
        send_counts: Sequence[int],
        recv_counts: Sequence[int],
        channel: int,
        timeout: float,
    ) -> np.ndarray:
        arr = send if isinstance(send, np.ndarray) else np.frombuffer(send, dtype=np.uint8)
        return self.backend.all_to_all(arr, send_counts, recv_counts, channel=channel, timeout=timeout)

    def broadcast_blobs(self, blob: bytes, sizes: Sequence[int], channel: int, timeout: float) -> list[bytes]:
        """Every rank sends its ``blob`` (``sizes[rank]`` bytes, may be empty) to every rank."""
        w = self.world_size
        buf = self.all_to_all(blob * w, [len(blob)] * w, sizes, channel, timeout)
        out, pos = [], 0
        for s in sizes:
            out.append(buf[pos : pos + s].tobytes())
            pos += s
        return out

    # ------------------------------------------------------------------------------------------ failure

    def raise_failures(
        self,
        statuses: Sequence[int],
        sizes: Sequence[int],
        mine: BaseException | None,
        blob: bytes,
        channel: int,
        timeout: float,
        function: str,
    ) -> NoReturn:
        """Every rank learns every failure; the origin re-raises its own, the others raise RemoteError."""
        failed = [r for r, s in enumerate(statuses) if s != OK]
        sizes = [int(sizes[r]) if statuses[r] != OK else 0 for r in range(self.world_size)]
        blobs = self.broadcast_blobs(blob if mine is not None else b"", sizes, channel, timeout)
        if mine is not None:
            others = [r for r in failed if r != self.rank]
            if others:
                _add_note(mine, f"syncreward: {function!r} also failed on rank(s) {others}")
            raise mine
        origin = failed[0]
        info = decode_value(blobs[origin])
        error = RemoteError(origin, info["type"], info["message"], info["traceback"], function=function)
        if len(failed) > 1:
            _add_note(error, f"syncreward: {function!r} also failed on rank(s) {failed[1:]}")
        raise error

    def raise_mismatch(self, header: np.ndarray, description: str, channel: int, timeout: float) -> NoReturn:
        blobs = self.broadcast_blobs(description.encode(), [int(x) for x in header[:, H_DESC]], channel, timeout)
        lines = [f"  rank {r}: {b.decode(errors='replace')}" for r, b in enumerate(blobs)]
        raise MismatchError(
            "ranks made different synced calls at the same point, so their batches cannot be combined:\n"
            + "\n".join(lines)
            + "\nHINT: every rank must call the same synced functions, in the same order, with the same per-sample "
            "columns (same names and container types)."
        )

    def check_header(
        self,
        header: np.ndarray,
        mine: BaseException | None,
        blob: bytes,
        description: str,
        channel: int,
        timeout: float,
        function: str,
    ) -> None:
        """Raise on every rank if any rank failed, or if the ranks are not making the same call."""
        versions = set(header[:, H_VERSION].tolist())
        if versions != {VERSION}:
            raise MismatchError(
                f"ranks run different syncreward wire versions ({sorted(hex(v) for v in versions)}). "
                "HINT: install the same syncreward version on every node."
            )
        statuses = header[:, H_STATUS].tolist()
        if any(s != OK for s in statuses):
            self.raise_failures(statuses, header[:, H_SIZE].tolist(), mine, blob, channel, timeout, function)
        if len(set(header[:, H_FP].tolist())) > 1 or len(set(header[:, H_SEQ].tolist())) > 1:
            self.raise_mismatch(header, description, channel, timeout)


_links: dict[int, tuple[Backend, Link]] = {}
_links_lock = threading.Lock()


def get_link(backend: Backend) -> Link:
    """The process-wide :class:`Link` of a backend (created on first use)."""
    entry = _links.get(id(backend))
    if entry is None or entry[0] is not backend:
        with _links_lock:
            entry = _links.get(id(backend))
            if entry is None or entry[0] is not backend:
                entry = _links[id(backend)] = (backend, Link(backend))
    return entry[1]
