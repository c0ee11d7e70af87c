"""A rank on the previous wire version beside one on this version: they pair, or every rank is told why not."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from _helpers import Wrapping

import syncreward
from syncreward import MismatchError, synced_reward
from syncreward.testing import run_threads

OLD_WIRE_VERSION = 0x5352_0002  # the previous wire version
OLD_REPLICATE_STATUS_WORDS = 4  # its replicate status row: status, error bytes, fingerprint, sequence number


class SpeaksOldWire(Wrapping):
    """Wraps a rank's backend so that the rank speaks the previous wire: its header's version word, its
    replicate status row (4 words where this version's has 6)."""

    def __init__(self, inner: syncreward.Backend) -> None:
        super().__init__(inner)
        self.headers_sent = False

    def all_gather(self, row: np.ndarray, *, channel: int, timeout: float) -> np.ndarray:
        if channel == 1:  # replicate's status round (the only channel-1 all_gather of this test)
            row = row[:OLD_REPLICATE_STATUS_WORDS]
        return self.inner.all_gather(row, channel=channel, timeout=timeout)

    def all_to_all(
        self, send: np.ndarray, send_counts: Sequence[int], recv_counts: Sequence[int], *, channel: int, timeout: float
    ) -> np.ndarray:
        if channel == 0 and not self.headers_sent:  # the first inbound collective: one header per destination
            self.headers_sent = True
            send = send.copy()
            for at in np.cumsum([0, *send_counts[:-1]]).tolist():
                send[at : at + 8] = np.frombuffer(np.int64(OLD_WIRE_VERSION).tobytes(), dtype=np.uint8)
        return self.inner.all_to_all(send, send_counts, recv_counts, channel=channel, timeout=timeout)


def test_a_rank_on_the_previous_wire_either_pairs_or_every_rank_is_told_the_versions_differ() -> None:
    """A rank running the previous version next to one running this version (one node not yet updated).

    Replicate's status row carries the call's check record (6 words, 4 before); were the wire version
    unchanged, the header check would pass and the two ranks would run a collective of different sizes
    (with gloo the older rank aborts: ``op.preamble.length <= op.nbytes. 48 vs 32``; here the thread
    backend would report a protocol violation). Either the ranks still pair or every rank raises the
    MismatchError that names the wire versions.
    """

    def reward(completions: Any, **kwargs: Any) -> list[float]:
        return [float(len(completions))] * len(completions)

    def body(rank: int, world_size: int) -> tuple[str, Any]:
        backend = syncreward.resolve_backend("auto")
        if rank == 1:
            backend = SpeaksOldWire(backend)
        f = synced_reward(mode="replicate", backend=backend, timeout=5)(reward)
        try:
            return "ok", f([f"c{rank}"] * (rank + 1))
        except MismatchError as e:
            return "mismatch", str(e)

    outcomes = run_threads(body, 2, timeout=30)
    kinds = {kind for kind, _ in outcomes}
    assert kinds in ({"ok"}, {"mismatch"}), outcomes
    if kinds == {"mismatch"}:
        assert all("different syncreward wire versions" in text for _, text in outcomes), outcomes
    else:
        assert [v for _, v in outcomes] == [[3.0], [3.0, 3.0]]
