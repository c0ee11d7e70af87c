"""The wire protocol's arithmetic, without any rank: headers, drop masks, sizes, predictions, error blobs."""

from __future__ import annotations

import numpy as np
import pytest

from syncreward import _wire
from syncreward._codec import decode_value
from syncreward._shared import MAX_SHARED_ITEMS, read_report, shared_key, shared_values_by_rank
from syncreward._shared import SharedValues as Shared
from syncreward._shared import differing_shared as differing
from syncreward._wire import (
    BASE_BLOCK,
    BASE_CAPACITY,
    BLOCK_LAG,
    BLOCK_WINDOW,
    DROP_BITS,
    F_ALL_PROVE,
    FAILED,
    H_SHARED,
    HEADER_BYTES,
    HEADER_LEN,
    MAX_EAGER,
    NO_SHARED,
    NO_STEP,
    OK,
    V_FAILED,
    V_MISMATCH,
    V_OK,
    V_SHARED,
    V_UNREADABLE,
    V_VERSION,
    CallCheck,
    Headers,
    InboundBlocks,
    Predictor,
    ResultChunk,
    ResultPredictor,
    block_for,
    drop_mask,
    drop_words,
    dropped_names,
    eager_sizes,
    error_blob,
    offsets,
    pack_header,
    remainder_counts,
    split,
    verdict_of,
)


def headers(*rows: dict[str, int]) -> Headers:
    defaults = {
        "seq": 0,
        "status": OK,
        "fp": 7,
        "step": NO_STEP,
        "n": 1,
        "size": 0,
        "mode_word": 0,
        "shared": 0,
    }
    packed = []
    for r in rows:
        fields = {**defaults, **{k: v for k, v in r.items() if k != "mask"}}
        packed.append(np.frombuffer(pack_header(**fields, mask=r.get("mask", [0] * 4)), dtype=np.int64))
    return Headers(np.stack(packed))


def to_root(w: int) -> np.ndarray:
    """``main``'s route: every rank's payload to rank 0."""
    out = np.zeros((w, w), dtype=bool)
    out[1:, 0] = True
    return out


def to_all(w: int) -> np.ndarray:
    """``replicate``'s route: every rank's payload to every other rank."""
    return ~np.eye(w, dtype=bool)


# --------------------------------------------------------------------------------------------- headers


def test_header_round_trips_every_field() -> None:
    h = headers({"seq": 5, "fp": -3, "step": 12, "n": 4, "size": 100, "mode_word": 2, "mask": [1, 0, 0, 2]})
    assert h.rows.shape == (1, HEADER_LEN)
    assert h.counts == [4] and h.sizes == [100] and h.mode_words == [2]
    assert h.masks.tolist() == [[1, 0, 0, 2]]
    assert h.agree and h.fp == -3 and not h.failed
    assert headers({"shared": -9}).rows[0, H_SHARED] == -9


def test_headers_that_differ_only_in_shared_arguments_agree_on_the_call_but_not_on_its_arguments() -> None:
    h = headers({"shared": 5}, {"shared": 6})
    assert h.agree  # the same call (predictions follow it), with different shared arguments
    assert h.fp == 7
    assert not h.shared_agree
    assert headers({"shared": 5}, {"shared": 5}).shared_agree


@pytest.mark.parametrize("field", ["seq", "fp", "step"])
def test_headers_that_differ_in_seq_function_or_step_do_not_agree(field: str) -> None:
    h = headers({field: 1}, {field: 2})
    assert not h.agree
    assert h.fp == 0  # nothing is predicted from a call the ranks did not agree on


def test_failed_status_is_reported_and_agreement_is_not_trusted() -> None:
    h = headers({}, {"status": FAILED, "size": 30})
    assert h.failed == [1]
    assert h.fp == 0


@pytest.mark.parametrize(("field", "value"), [("n", -1), ("size", -5), ("size", 1 << 50), ("mode_word", -2)])
def test_hostile_header_sizes_are_named_not_acted_on(field: str, value: int) -> None:
    problem = headers({}, {field: value}).problem()
    assert problem is not None and "rank(s) [1]" in problem


def test_sane_headers_have_no_problem() -> None:
    assert headers({"n": 0, "size": 0}, {"n": 10, "size": 1 << 20}).problem() is None


def test_headers_are_read_from_the_start_of_each_received_block() -> None:
    # the inbound exchange's receive buffer: each rank's block is its header, then (part of) its payload
    rows = [
        pack_header(seq=3, status=OK, fp=9, step=NO_STEP, n=n, size=size, mode_word=0, mask=mask)
        for n, size, mask in ((2, 5, [0, 0, 0, 0]), (0, 0, [0, 4, 0, 0]), (7, 11, [0, 0, 0, 0]))
    ]
    blocks = [rows[0] + b"abcde" + bytes(3), rows[1], rows[2] + bytes(range(16))]
    starts = [0, len(blocks[0]), len(blocks[0]) + len(blocks[1])]
    h = Headers.gather(np.frombuffer(b"".join(blocks), dtype=np.uint8), starts)
    assert h.counts == [2, 0, 7] and h.sizes == [5, 0, 11] and h.agree and h.fp == 9
    assert h.any_dropped and h.masks.tolist()[1] == [0, 4, 0, 0]
    assert not headers({}, {}).any_dropped


# --------------------------------------------------------------------------------------------- drop masks


def test_drop_mask_marks_exactly_the_dropped_columns() -> None:
    names = ["a", "b", "c", "image"]
    masks = np.array([drop_mask(names, []), drop_mask(names, ["image"])], dtype=np.int64)
    assert dropped_names(names, {"image", "c"}, masks) == {"image"}


def test_a_named_column_is_never_dropped_even_if_its_bit_is_set() -> None:
    names = ["a", "b"]
    masks = np.array([drop_mask(names, ["a", "b"])], dtype=np.int64)
    assert dropped_names(names, {"b"}, masks) == {"b"}


def test_drop_mask_reaches_columns_past_the_exact_bits() -> None:
    names = sorted(f"col{i:04d}" for i in range(DROP_BITS + 50))
    late = names[DROP_BITS + 30]
    masks = np.array([drop_mask(names, [late]), drop_mask(names, [])], dtype=np.int64)
    got = dropped_names(names, set(names), masks)
    assert late in got
    # a hash collision may leave a few more columns behind, never fewer
    assert len(got) <= 3


# --------------------------------------------------------------------------------------------- sizes


def test_offsets_and_split() -> None:
    assert offsets([2, 0, 3]) == [0, 2, 2, 5]
    parts = split(np.arange(5, dtype=np.uint8), [2, 0, 3])
    assert [p.tolist() for p in parts] == [[0, 1], [], [2, 3, 4]]


def test_eager_sizes_follow_the_routes_with_a_margin_and_a_cap() -> None:
    eager = eager_sizes([0, 100, 10 << 20], to_root(3))
    assert eager[1, 0] >= 120 and eager[1, 0] % 8 == 0
    assert eager[2, 0] == MAX_EAGER
    assert eager[0].tolist() == [0, 0, 0] and eager[:, 1:].sum() == 0


def test_remainder_is_what_did_not_fit() -> None:
    eager = np.array([[0, 0], [64, 0]], dtype=np.int64)
    assert remainder_counts([0, 100], eager, to_root(2)).tolist() == [[0, 0], [36, 0]]
    assert remainder_counts([0, 50], eager, to_root(2)).tolist() == [[0, 0], [0, 0]]


def test_size_arithmetic_is_quadratic_not_cubic_in_world_size() -> None:
    """At W=1024 the per-call size arithmetic of replicate (every pair routed) stays well under a second."""
    w = 1024
    sizes = list(range(w))
    route = to_all(w)
    eager = eager_sizes(sizes, route)
    rest = remainder_counts([s + 1000 for s in sizes], eager, route)
    assert eager.shape == rest.shape == (w, w)
    assert rest[0, 0] == 0
    assert (rest[1:, 0] > 0).all()


# --------------------------------------------------------------------------------------------- predictions


def test_prediction_learns_one_function_after_one_call() -> None:
    p = Predictor(2)
    assert p.predict().sum() == 0
    p.update(headers({"fp": 1, "size": 0}, {"fp": 1, "size": 400}), to_root(2))
    assert p.predict()[1, 0] >= 400


def test_prediction_follows_a_cycle_of_several_rewards_per_step() -> None:
    """TRL's accuracy + format + length rewards, every step in the same order, each its own size."""
    p = Predictor(2)
    sizes = {11: 5000, 22: 80, 33: 900}
    for _ in range(2):  # learn
        for fp, size in sizes.items():
            p.update(headers({"fp": fp}, {"fp": fp, "size": size}), to_root(2))
    for fp, size in sizes.items():  # the steady state: each call's chunk fits its own payload, no one else's
        predicted = int(p.predict()[1, 0])
        assert size <= predicted <= size * 1.2 + 8, (fp, size, predicted)
        p.update(headers({"fp": fp}, {"fp": fp, "size": size}), to_root(2))


def test_predictions_are_a_function_of_the_shared_headers_only() -> None:
    """Ranks about to make different calls still predict the same sizes (else gloo aborts)."""
    a, b = Predictor(2), Predictor(2)
    for h in (headers({"fp": 1}, {"fp": 1, "size": 64}), headers({"fp": 2}, {"fp": 3, "size": 999})):
        a.update(h, to_root(2))
        b.update(h, to_root(2))
        assert (a.predict() == b.predict()).all()


def test_a_mismatched_or_failed_call_teaches_nothing() -> None:
    p = Predictor(2)
    p.update(headers({"fp": 4}, {"fp": 5, "size": 999}), to_root(2))
    p.update(headers({"fp": 6, "status": FAILED}, {"fp": 6, "size": 999}), to_root(2))
    assert p.predict().sum() == 0


def test_prediction_memory_is_bounded() -> None:
    p = Predictor(2, capacity=8)
    for fp in range(1, 100):
        p.update(headers({"fp": fp}, {"fp": fp, "size": 10}), to_all(2))
    assert len(p.order.seen) <= 8 and len(p.order.after) <= 8


# --------------------------------------------------------------------------------------------- results


def test_result_chunk_round_trip_and_padding() -> None:
    chunk = ResultChunk(OK, False, 512, 10, fp=-5, seq=3)
    packed = chunk.pack(b"0123456789", BASE_CAPACITY)
    assert len(packed) == BASE_CAPACITY
    assert ResultChunk.unpack(packed) == chunk
    assert packed[ResultChunk.HEADER : ResultChunk.HEADER + 10] == b"0123456789"


def test_result_chunk_carries_the_verdict_next_inbound_block_flags_and_drops() -> None:
    chunk = ResultChunk(OK, True, 512, 10, fp=-5, seq=3, verdict=V_SHARED, next_block=4096, flags=F_ALL_PROVE,
                        drops=(1, 0, 1 << 62, 5))  # fmt: skip
    packed = chunk.pack(b"x" * 10, BASE_CAPACITY)
    assert ResultChunk.unpack(packed) == chunk


@pytest.mark.parametrize("world_size", [1, 2, 5, 12])  # a few headers are unpacked one by one, more at once
def test_headers_of_a_gather_are_read_from_the_start_of_its_equal_blocks(world_size: int) -> None:
    size = _wire.HEADER_BYTES + 48
    buf = np.zeros(world_size * size, dtype=np.uint8)
    for r in range(world_size):
        row = pack_header(seq=3, status=OK, fp=9, step=NO_STEP, n=r, size=40 + r, mode_word=0, mask=[0, r, 0, 0])
        buf[r * size : r * size + len(row)] = np.frombuffer(row, dtype=np.uint8)
        buf[r * size + len(row) : (r + 1) * size] = 255  # the payload's start: never read as a header
    got = Headers.blocks(buf, world_size, size)
    want = Headers.gather(buf, range(0, world_size * size, size))
    assert got.rows.tolist() == want.rows.tolist()
    assert got.counts == list(range(world_size)) and got.sizes == [40 + r for r in range(world_size)]
    odd = Headers.blocks(buf[: world_size * (size - 4)], world_size, size - 4)  # not a multiple of 8: copied
    assert odd.rows.shape == (world_size, _wire.HEADER_LEN)


def test_verdict_of_the_headers_root_alone_read() -> None:
    """What root decides from the gathered headers, in the order the all_to_all inbound checked them."""
    assert verdict_of(headers({}, {})) == (V_OK, "")
    assert verdict_of(headers({}, {"status": FAILED, "size": 50}))[0] == V_FAILED
    assert verdict_of(headers({}, {"fp": 8}))[0] == V_MISMATCH
    assert verdict_of(headers({}, {"seq": 1}))[0] == V_MISMATCH
    assert verdict_of(headers({}, {"step": 4}))[0] == V_MISMATCH
    assert verdict_of(headers({}, {"size": _wire.MAX_FIELD + 1}))[0] == V_UNREADABLE
    assert verdict_of(headers({"mode_word": -2}, {}))[0] == V_UNREADABLE
    assert verdict_of(headers({}, {"shared": 3}))[0] == V_SHARED
    assert verdict_of(headers({"status": FAILED}, {"fp": 8}))[0] == V_FAILED  # a failure first: its error is the cause
    kind, text = verdict_of(headers({}, {"n": -1}))
    assert kind == V_UNREADABLE and "rank(s) [1] sent an invalid sample count" in text
    rows = headers({}, {}).rows.copy()
    rows[1, 0] = 0x5352_0002
    kind, text = verdict_of(Headers(rows))
    assert kind == V_VERSION and "different syncreward wire versions" in text and "0x53520002" in text


def test_drop_words_are_the_or_of_every_rank_mask() -> None:
    h = headers({"mask": [1, 0, 0, 0]}, {"mask": [2, 0, 4, 0]})
    assert drop_words(h.masks) == (3, 0, 4, 0)


def test_inbound_block_fits_the_largest_payload_with_headroom() -> None:
    assert block_for([0, 0]) == HEADER_BYTES + 64
    assert block_for([1000, 10]) == HEADER_BYTES + 1200
    cap = _wire.MAX_BLOCK_PAYLOAD
    assert block_for([cap * 5 // 6]) == HEADER_BYTES + cap  # fits with its headroom: at most the cap
    assert block_for([cap]) == HEADER_BYTES + 64  # goes whole point to point: the header's block only
    assert block_for([MAX_EAGER * 2, 1000]) == HEADER_BYTES + 1200
    assert block_for([]) == HEADER_BYTES + 64


def test_inbound_block_announcement_is_used_block_lag_gathered_calls_later_on_every_rank() -> None:
    """Root announces in each gathered call's result block; every rank uses the call BLOCK_LAG gathered calls back."""
    root, other = InboundBlocks(), InboundBlocks()
    sizes_used: list[tuple[int | None, int | None]] = []
    for seq in range(0, 3 * BLOCK_LAG, 2):  # every other call gathers (the others: another mode)
        source_root, source_other = root.gathered(seq), other.gathered(seq)
        assert source_root == source_other
        sizes_used.append((root.size(source_root), other.size(source_other)))
        other.learn(seq, root.announce(seq, [1000 * (seq + 1)]))
    assert sizes_used[:BLOCK_LAG] == [(BASE_BLOCK, BASE_BLOCK)] * BLOCK_LAG
    for i, (a, b) in enumerate(sizes_used[BLOCK_LAG:]):
        assert a == b == block_for([1000 * (2 * i + 1)])  # the call BLOCK_LAG gathered calls back announced it


def test_inbound_block_not_learned_yet_is_none_until_its_result_block_comes() -> None:
    other = InboundBlocks()
    for seq in range(BLOCK_LAG):
        other.gathered(seq)
    source = other.gathered(BLOCK_LAG)
    assert source == 0 and other.size(source) is None  # the inbound turn then waits for call 0's results
    other.learn(0, 4242)
    assert other.size(source) == 4242


def test_inbound_block_grows_at_once_and_shrinks_back_after_the_window() -> None:
    root = InboundBlocks()
    assert root.announce(0, [100]) == block_for([100])
    assert root.announce(1, [100_000]) == block_for([100_000])
    assert root.announce(2, None) == block_for([100_000])  # a call that failed teaches nothing
    for seq in range(3, 3 + BLOCK_WINDOW - 1):
        assert root.announce(seq, [100]) == block_for([100_000])
    assert root.announce(99, [100]) == block_for([100])  # the large call left the window


def test_inbound_blocks_forget_announcements_older_than_the_ones_in_use() -> None:
    blocks = InboundBlocks()
    for seq in range(10 * BLOCK_LAG):
        blocks.gathered(seq)
        blocks.announce(seq, [seq])
    assert len(blocks._announced) <= BLOCK_LAG + 2 and len(blocks._calls) == BLOCK_LAG + 1
    assert _wire.BLOCK_LAG == BLOCK_LAG


def test_result_blocks_are_sized_per_function_in_call_order() -> None:
    """Accuracy (8 B/sample) then judge (400 B/sample), every step: each next block fits its own function."""
    p = ResultPredictor()
    assert p.next_capacities([0, 10]) == [BASE_CAPACITY, BASE_CAPACITY]
    for _ in range(2):
        for fp, rate in ((1, 8), (2, 400)):
            p.update(fp, {1: rate * 10}, [0, 10])
    # the last call was the judge: the next one is accuracy, whose block needs ~80 bytes of body
    small = p.next_capacities([0, 10])[1]
    assert 80 + ResultChunk.HEADER <= small < 400
    p.update(1, {1: 80}, [0, 10])
    big = p.next_capacities([0, 10])[1]
    assert big >= 4000 + ResultChunk.HEADER


def test_result_prediction_memory_is_bounded() -> None:
    p = ResultPredictor(capacity=4)
    for fp in range(50):
        p.update(fp, {1: 100}, [0, 10])
    assert len(p.order.after) <= 4
    assert len(p.order.seen) <= 4


# --------------------------------------------------------------------------------------------- errors


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_error_blob_survives_a_failing_str_and_lone_surrogates() -> None:
    info = decode_value(error_blob(Unprintable()))
    assert info["type"].endswith("Unprintable")
    assert "str() failed" in info["message"]
    info = decode_value(error_blob(ValueError("bad \udcff key")))
    assert info["type"] == "ValueError" and "bad" in info["message"]


# --------------------------------------------------------------------------------------------- shared values


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (0.1 + 0.2, 0.3),  # floats by their exact value
        (0.0, -0.0),
        (1, 1.0),  # the function sees an int or a float
        (1, True),
        ([1, 2], (1, 2)),  # ... a list or a tuple
        ("1", b"1"),
        ({"a": 1}, {"a": 2}),
        (np.float32(0.5), 0.5),
        (None, 0),
        ([[1], 2], [1, [2]]),
        ([0.0], [-0.0]),
        ([1.0, 2.0], [1, 2]),
        ([1.0, 2.0], (1.0, 2.0)),
        (["a", "b"], ["a, b"]),
        ([0.1 + 0.2, 1], [0.3, 1]),
    ],
)
def test_shared_keys_of_different_plain_values_differ(a: object, b: object) -> None:
    ka, kb = shared_key(a), shared_key(b)
    assert ka is not None
    assert kb is not None
    assert ka != kb


@pytest.mark.parametrize(
    "make",
    [
        lambda: 0.30000000000000004,
        lambda: float("nan"),  # the same program's nan is the same on every rank
        lambda: {"b": [1, 2.5], "a": None},
        lambda: 10**400,  # big ints too (past str()'s digit limit)
        lambda: "ünïcode \udcff",  # lone surrogates too
        lambda: np.int64(3),
        lambda: (b"raw", [True, False]),
        lambda: [0.5, -0.0, 1e300],  # a list of floats: their bytes
        lambda: [0.5, 1, "x", None],  # a list of mixed scalars: its repr
        lambda: ([0.5], {"k": (1.5, "s")}),
    ],
)
def test_shared_keys_of_equal_plain_values_are_equal(make: object) -> None:
    assert callable(make)
    a, b = make(), make()
    assert shared_key(a) is not None
    assert shared_key(a) == shared_key(b)


def test_a_dicts_insertion_order_is_not_part_of_its_key() -> None:
    assert shared_key({"a": 1, "b": 2}) == shared_key({"b": 2, "a": 1})


class Tokenizer:
    def __repr__(self) -> str:
        return f"<Tokenizer at {id(self):#x}>"


@pytest.mark.parametrize(
    "value",
    [
        Tokenizer(),
        lambda: 0,
        [1, Tokenizer()],  # one object makes the whole value not plain
        {"k": {1, 2}},
        {Tokenizer(): 1},
        np.zeros(3),  # an array as a shared value (shared=[...]) is not hashed per call
        type("MyStr", (str,), {})("x"),  # subclasses (enums of str, ...) have their own equality
        list(range(MAX_SHARED_ITEMS + 1)),  # too large to hash on every call
        "x" * (70 << 10),
    ],
)
def test_values_that_are_not_plain_or_too_large_have_no_key(value: object) -> None:
    assert shared_key(value) is None


def test_shared_digest_changes_with_any_checked_value_and_ignores_what_cannot_be_checked() -> None:
    base = Shared({"threshold": 0.5, "tokenizer": Tokenizer()})
    assert Shared({}).digest == NO_SHARED
    assert base.digest != NO_SHARED
    assert Shared({"tokenizer": Tokenizer(), "threshold": 0.5}).digest == base.digest  # another object, same key
    assert Shared({"threshold": 0.6, "tokenizer": Tokenizer()}).digest != base.digest
    assert Shared({"threshold": 0.5}).digest != base.digest  # an argument one rank did not pass
    assert Shared({"threshold": 0.5, "tokenizer": None}).digest != base.digest  # an object on one rank only


def test_shared_report_names_what_differs_and_how_each_rank_passed_it() -> None:
    ranks = [
        Shared({"threshold": 0.5, "tok": Tokenizer(), "same": [1]}),
        Shared({"threshold": 1.5, "tok": Tokenizer(), "same": [1]}),
        Shared({"threshold": 0.5, "tok": Tokenizer(), "same": [1], "extra": "x" * 100}),
    ]
    reports = [read_report(r.report()) for r in ranks]
    assert all(r is not None for r in reports)
    readable = [r or {} for r in reports]
    assert differing(readable) == ["extra", "threshold"]
    assert shared_values_by_rank(readable, "threshold") == [("0.5", [0, 2]), ("1.5", [1])]
    (absent, _), (shown, ranks_with) = shared_values_by_rank(readable, "extra")
    assert absent == "<not passed>"
    assert ranks_with == [2]
    assert shown.endswith("...")
    assert len(shown) == 60  # cut, never the whole value
    assert readable[0]["tok"] == (None, "<Tokenizer: not checked>")  # never its repr (an address)


@pytest.mark.parametrize(
    "value", [[1, 2], {"a": [1]}, {"a": ["x", "y"]}, {1: [None, "x"]}, {"a": [None, 3]}, {"a": [True, "x"]}]
)
def test_a_report_that_is_not_one_is_refused_not_trusted(value: object) -> None:
    """A report comes from another rank: input like any other."""
    from syncreward._codec import encode_value

    out = bytearray()
    encode_value(value, out)
    assert read_report(bytes(out)) is None
    assert read_report(b"\xff\x00") is None


def test_check_records_carry_the_shared_digest() -> None:
    check = CallCheck(fp=1, seq=2, step=3, shared=-4, desc_bytes=5)
    assert CallCheck.unpack(check.pack()) == check
    assert len(check.pack()) == CallCheck.SIZE == 8 * CallCheck.FIELDS
    other = CallCheck(1, 2, 3, 9, 5)
    assert check.same_call(other)
    assert not check.same_shared(other)


def test_main_inbound_blocks_of_skewed_ranks_stay_near_the_batch_not_w_times_its_largest_part() -> None:
    """One rank with most of the batch: blocks for its payload would cost rank 0 W times it; the block
    is the largest need that keeps the gather within BLOCK_SKEW x what the ranks send, the rest travels as tails."""
    from syncreward._wire import BLOCK_SKEW, bounded_block

    even = [0] + [1000] * 7  # rank 0 (the scoring rank) sends nothing: it does not count
    assert bounded_block(even) == block_for([1000])
    skewed = [0, 200_000] + [1_000] * 62
    b = bounded_block(skewed)
    assert b == block_for([1_000])  # the large rank sends its rest point to point
    senders = [block_for([s]) for s in skewed if s]
    assert len(senders) * b <= BLOCK_SKEW * sum(senders)
    assert len(senders) * block_for(skewed) > 5 * sum(senders)  # what the largest need would have cost
    assert bounded_block([0, 0]) == block_for([])  # nothing sent: the smallest block
