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


def _boundary_sweep(rank: int, world_size: int, length: int, seen: list[int]) -> list[int]:
    import syncreward._exchange as exchange

    block = exchange._gather_block

    def spied(header: bytes, body: Any, size: int) -> Any:  # a payload's size against its block's room
        from syncreward._wire import H_SIZE, HEADER_BYTES

        seen.append(int(np.frombuffer(header, dtype=np.int64)[H_SIZE]) - (size - HEADER_BYTES))
        return block(header, body, size)

    exchange._gather_block = spied  # type: ignore[assignment]  (these ranks' threads only run this)

    @syncreward.synced_reward
    def lengths(completions: list[str], **kwargs: Any) -> list[int]:
        return [len(c) for c in completions]

    return lengths(["x" * (length + rank)])  # the ranks' payloads one byte apart


def test_main_payloads_at_and_just_past_the_room_of_their_block_arrive_whole() -> None:
    """A payload that fills its gather block exactly rides in it; 8 bytes more (frames grow by 8) go whole point to
    point: either way the scoring rank reads every rank's payload whole (a new group's first calls: 256-byte blocks)."""
    import syncreward._exchange as exchange

    seen: list[int] = []
    original = exchange._gather_block
    try:
        for length in range(160, 190):
            got = run_threads(_boundary_sweep, 4, length, seen)
            assert got == [[length + r] for r in range(4)], length
    finally:
        exchange._gather_block = original  # type: ignore[assignment]
    assert {-8, 0, 8} <= set(seen)  # below, at, and past the room (frames grow by 8 bytes): each case ran


_ODD = type("Odd" + "x" * 300_000, (), {})  # its name is in the error report: larger than any gather block


def _mixed_and_large_errors(rank: int, world_size: int) -> list[Any]:
    @syncreward.synced_reward
    def lengths(completions: list[str], solution: list[Any]) -> list[int]:
        return [len(c) for c in completions]

    out: list[Any] = []
    for call in range(12):  # the first calls use the 256-byte blocks, the later ones the announced size
        size = 300_000 if rank == 1 else 40 + rank  # rank 1's payload goes point to point, the others' fit
        bad = call in (3, 10) and rank == world_size - 1  # its error report goes point to point
        try:
            out.append(lengths(["y" * (size + call)], solution=[_ODD()] if bad else ["s"]))
        except Exception as e:  # (what each rank raised is the result)
            out.append((type(e).__name__, f"rank {world_size - 1}" in str(e), _ODD.__name__ in str(e)))
    return out


@pytest.mark.parametrize("world_size", [3, 4])
def test_main_large_payloads_and_large_error_reports_go_point_to_point_beside_ones_that_fit_over_gloo(
    world_size: int,
) -> None:
    """Over gloo (recv_many: the scoring rank posts every point-to-point receive first): a rank whose payload does
    not fit its block beside ranks whose payloads do, and a rank whose error report does not fit: every rank gets its
    own result, or raises (the failing rank its own error, every other rank a RemoteError naming it)."""
    results = run_ranks(_mixed_and_large_errors, world_size, timeout=240)
    last = world_size - 1
    for rank, got in enumerate(results):
        for call, value in enumerate(got):
            if call in (3, 10):
                want = ("UnsupportedTypeError", False, True) if rank == last else ("RemoteError", True, True)
                assert value == want, (rank, call)
            else:
                assert value == [(300_000 if rank == 1 else 40 + rank) + call], (rank, call)
