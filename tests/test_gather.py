"""The optional ``gather`` capability (``Gathers``): every rank's block to one rank, W - 1 messages.

``_exchange.Link.gather`` uses a backend's ``gather`` where it has one, else the same bytes go through
``all_to_all``; both give the root every rank's block in rank order and every other rank nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import syncreward
from syncreward._deadline import Deadline
from syncreward._exchange import INBOUND, Link
from syncreward._session import session_for
from syncreward.backends._protocol import gathers
from syncreward.testing import ThreadBackend, ThreadGroup, run_ranks, run_threads

SIZE = 5


class _CollectivesOnly:
    """A backend with the two required collectives only: ``Link.gather`` falls back to ``all_to_all``."""

    def __init__(self, inner: Any) -> None:
        self.rank, self.world_size = inner.rank, inner.world_size
        self.all_gather, self.all_to_all = inner.all_gather, inner.all_to_all


def _block(rank: int) -> bytes:
    return bytes((rank * 10 + i) % 256 for i in range(SIZE))


def _gathered(backend: Any, root: int) -> list[bytes]:
    link = Link(session_for(backend, "f"), INBOUND, Deadline(60.0), "f")
    got = link.gather(_block(backend.rank), SIZE, root)
    return [got[i * SIZE : (i + 1) * SIZE].tobytes() for i in range(got.size // SIZE)]


def _body(rank: int, world_size: int, root: int, plain: bool) -> list[bytes]:
    backend = syncreward.resolve_backend("auto")
    return _gathered(_CollectivesOnly(backend) if plain else backend, root)


@pytest.mark.parametrize("plain", [False, True], ids=["gather", "all_to_all"])
@pytest.mark.parametrize("root", [0, 2])
def test_gather_gives_the_root_every_rank_block_in_rank_order(root: int, plain: bool) -> None:
    results = run_threads(_body, 3, root, plain)
    for rank, got in enumerate(results):
        assert got == ([_block(r) for r in range(3)] if rank == root else []), (rank, got)


def test_gather_capability_is_found_on_the_thread_backend_and_not_on_a_backend_without_it() -> None:
    backend = ThreadBackend(ThreadGroup(2), 0)
    assert gathers(backend) is backend
    assert gathers(_CollectivesOnly(backend)) is None


def test_gather_of_a_block_of_another_size_is_a_protocol_violation_on_thread_ranks() -> None:
    backend = ThreadBackend(ThreadGroup(2), 0)
    with pytest.raises(syncreward.CommunicationError, match="protocol violation on rank 0: gather of uint8"):
        backend.gather(np.zeros(3, dtype=np.uint8), 4, root=0, channel=0, timeout=1.0)


def _torch_body(rank: int, world_size: int, root: int) -> list[bytes]:
    return _gathered(syncreward.resolve_backend("torch"), root)


@pytest.mark.multiprocess
def test_gather_gives_the_root_every_rank_block_in_rank_order_over_gloo() -> None:
    results = run_ranks(_torch_body, 3, 1, timeout=120)
    for rank, got in enumerate(results):
        assert got == ([_block(r) for r in range(3)] if rank == 1 else []), (rank, got)


def _result_block_sizes(rank: int, world_size: int) -> tuple[int, int]:
    backend = syncreward.resolve_backend("auto")

    @syncreward.synced_reward
    def long_tags(completions: list[str], **kwargs: Any) -> list[str]:
        return [c * 300 for c in completions]

    session = session_for(backend, "long_tags")
    before = session.result_blocks.capacity
    long_tags([f"r{rank}"] * 4)  # the first call's results outgrow the first block; the next block fits them
    return before, session.result_blocks.capacity


def test_main_result_block_size_is_kept_by_the_session() -> None:
    """The size the previous call's result blocks announced lives on the session (every rank the same)."""
    (before, after), *others = run_threads(_result_block_sizes, 2)
    assert others == [(before, after)]
    assert after > before


def _large_payloads(rank: int, world_size: int) -> tuple[list[list[int]], int | None]:
    from syncreward._wire import BLOCK_LAG

    @syncreward.synced_reward
    def lengths(completions: list[str], **kwargs: Any) -> list[int]:
        return [len(c) for c in completions]

    got = []
    for call in range(BLOCK_LAG + 4):  # past the calls that use the first, small block
        text = chr(ord("a") + rank) * (300_000 + 1000 * call)  # more than a block holds
        got.append(lengths([text, text[:5]]))
    backend = syncreward.resolve_backend("auto")
    blocks = session_for(backend, "lengths").inbound_blocks
    return got, blocks.size(blocks.gathered(10_000))


def test_main_payload_larger_than_a_block_goes_whole_point_to_point() -> None:
    """A block holds at most MAX_BLOCK_PAYLOAD bytes of payload (torch's gloo gather copies every block twice on the
    scoring rank): larger payloads go whole point to point, call after call, and the blocks stay header-sized."""
    from syncreward._wire import HEADER_BYTES

    results = run_threads(_large_payloads, 2)
    for rank, (got, _) in enumerate(results):
        want = [[300_000 + 1000 * call, 5] for call in range(len(got))]
        assert got == want, rank
    assert {size for _, size in results} == {HEADER_BYTES + 64}
