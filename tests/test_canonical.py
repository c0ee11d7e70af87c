"""One canonical encoder, two equality rules: which plain values are the same value in every process.

``_canonical.EXACT`` (a call's shared arguments, a reward's configuration): two values are one only where the
function cannot tell them apart. ``_canonical.EQUAL`` (shard's ``group_by`` keys): values group as ``==`` groups
them. Pure tests, no ranks.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest
import torch
from _helpers import outputs_under_hash_seeds

import syncreward
from syncreward._canonical import EQUAL, EXACT, Budget, NotPlain, Opaque, encode, to_bytes
from syncreward._identity import Identity
from syncreward._keys import group_keys
from syncreward._shared import MAX_SHARED_ITEMS, shared_key

# pairs that compare equal in Python but that a function can tell apart (type, sign, dtype)
EQUAL_BUT_TELLABLE = {
    "int and float": (1, 1.0),
    "int and bool": (1, True),
    "float and bool": (1.0, True),
    "zero and negative zero": (0.0, -0.0),
    "int and numpy int": (1, np.int64(1)),
    "float and numpy float32": (1.0, np.float32(1.0)),
    "numpy int32 and int64": (np.int32(1), np.int64(1)),
    "nested": ({"w": [1, 2]}, {"w": [1.0, 2]}),
    "dict values": ({"a": 0.0}, {"a": -0.0}),
}


@pytest.mark.parametrize(("a", "b"), EQUAL_BUT_TELLABLE.values(), ids=EQUAL_BUT_TELLABLE)
def test_exact_rule_tells_apart_values_that_compare_equal(a: Any, b: Any) -> None:
    assert a == b
    assert to_bytes(a, EXACT) != to_bytes(b, EXACT)


@pytest.mark.parametrize(("a", "b"), EQUAL_BUT_TELLABLE.values(), ids=EQUAL_BUT_TELLABLE)
def test_equal_rule_groups_values_that_compare_equal(a: Any, b: Any) -> None:
    assert to_bytes(a, EQUAL) == to_bytes(b, EQUAL)


def test_equal_rule_groups_numbers_like_python_equality_and_keeps_unequal_ones_apart() -> None:
    one = {to_bytes(v, EQUAL) for v in (1, 1.0, True, np.int64(1), np.float32(1), np.bool_(True), complex(1, 0))}
    assert len(one) == 1
    apart = [0, 1, 1.5, -1.5, 2**70, "1", b"1", None, complex(1, 1), float("inf")]
    assert len({to_bytes(v, EQUAL) for v in apart}) == len(apart)


def test_equal_rule_makes_every_nan_one_group_key() -> None:
    assert to_bytes(float("nan"), EQUAL) == to_bytes(np.float32("nan"), EQUAL) == to_bytes(-float("nan"), EQUAL)


def test_equal_rule_reads_arrays_tensors_and_str_subclasses_by_their_content() -> None:
    assert to_bytes(np.array([1, 2]), EQUAL) == to_bytes(torch.tensor([1.0, 2.0]), EQUAL) == to_bytes([1, 2], EQUAL)
    assert to_bytes(np.str_("x"), EQUAL) == to_bytes("x", EQUAL)


@pytest.mark.parametrize("rule", [EXACT, EQUAL], ids=["exact", "equal"])
def test_both_rules_tell_a_list_from_a_tuple_and_ignore_a_dicts_insertion_order(rule: Any) -> None:
    assert to_bytes([1, "a"], rule) != to_bytes((1, "a"), rule)
    assert to_bytes([], rule) != to_bytes((), rule)
    assert to_bytes({"a": 1, "b": [2]}, rule) == to_bytes({"b": [2], "a": 1}, rule)
    assert to_bytes({(1, "x"): 1, 2: 2}, rule) == to_bytes({2: 2, (1, "x"): 1}, rule)
    assert to_bytes({"a": 1}, rule) != to_bytes({"a": 2}, rule)


@pytest.mark.parametrize("rule", [EXACT, EQUAL], ids=["exact", "equal"])
def test_both_rules_tell_str_bytes_and_none_apart(rule: Any) -> None:
    values = ["", b"", None, "None", "a", b"a", ["a"], [b"a"], "1", 1]
    assert len({to_bytes(v, rule) for v in values}) == len(values)


def test_exact_rule_refuses_what_has_its_own_equality_and_arrays() -> None:
    my_str = type("MyStr", (str,), {})
    for value in (object(), my_str("x"), np.zeros(3), torch.zeros(3), {1, 2}, [1, object()]):
        with pytest.raises(NotPlain):
            to_bytes(value, EXACT)


def test_a_value_that_is_not_plain_names_its_type_and_leaves_the_output_as_it_was() -> None:
    out = bytearray(b"kept")
    for rule in (EXACT, EQUAL):
        with pytest.raises(NotPlain, match=r"it holds a builtins\.object"):
            encode([1, "x", {"k": object()}], out, rule)
        assert out == b"kept"


def test_a_budget_bounds_how_much_the_exact_rule_writes() -> None:
    budget = Budget(items=10, size=100, depth=2)
    to_bytes(list(range(9)), EXACT, budget)
    with pytest.raises(NotPlain):
        to_bytes(list(range(11)), EXACT, budget)
    with pytest.raises(NotPlain):
        to_bytes(["x" * 200], EXACT, budget)
    with pytest.raises(NotPlain):
        to_bytes([[[[1, object()]]]], EXACT, budget)


def test_equal_rule_refuses_a_value_nested_past_the_limit() -> None:
    deep: list[Any] = []
    for _ in range(200):
        deep = [deep]
    with pytest.raises(NotPlain, match="nested more than 100 levels deep"):
        to_bytes(deep, EQUAL)


def test_an_opaque_stand_in_is_not_the_string_of_its_name() -> None:
    assert to_bytes(Opaque("Model"), EXACT) != to_bytes("Model", EXACT)
    assert to_bytes(Opaque("Model"), EXACT) == to_bytes(Opaque("Model"), EXACT)


# --------------------------------------------------------------------------------------------- the three users


def test_shared_arguments_use_the_exact_rule() -> None:
    for a, b in EQUAL_BUT_TELLABLE.values():
        if shared_key(a) is not None:  # numpy scalars in a dict: checked too
            assert shared_key(a) != shared_key(b), (a, b)
    assert shared_key(list(range(MAX_SHARED_ITEMS + 1))) is None  # past the shared budget: not checked


def test_group_keys_use_the_equal_rule() -> None:
    keys = group_keys([1, 1.0, True, np.int64(1), "1"], 0, "prompt_id")
    assert len({keys[i * 16 : (i + 1) * 16] for i in range(5)}) == 2
    inline = group_keys(["a", 7, -(2**80)], 0, "p")  # exact str and int: written inline, as encode writes them
    assert inline == group_keys([np.str_("a"), np.int64(7), float(-(2**80))], 0, "p")  # these go through encode


def _reward(completions: Any, prompt: str = "", weight: float = 1.0) -> list[float]:
    return [0.0] * len(completions)


def test_a_rewards_configuration_is_compared_whole_where_its_text_is_cut_short() -> None:
    long_a, long_b = "x" * 300 + "a", "x" * 300 + "b"
    a = Identity(functools.partial(_reward, prompt=long_a), "_reward")
    b = Identity(functools.partial(_reward, prompt=long_b), "_reward")
    assert a.key() == b.key()  # the text shows the first 256 characters
    assert a.digest != b.digest
    same = Identity(functools.partial(_reward, prompt=long_a), "_reward")
    assert (same.key(), same.digest) == (a.key(), a.digest)


def test_a_rewards_configuration_uses_the_exact_rule_without_per_rank_state() -> None:
    one = Identity(functools.partial(_reward, weight=1), "_reward")
    one_float = Identity(functools.partial(_reward, weight=1.0), "_reward")
    assert one.digest != one_float.digest

    class Judge:
        def __init__(self, rank: int) -> None:
            self.weights = {"a": 1.0, "device": f"cuda:{rank}"}
            self.where = f"cuda:{rank}"
            self.local_rank = rank
            self.model = object()  # stands for its type

    assert len({Identity(Judge(rank), "Judge").digest for rank in range(3)}) == 1


def test_canonical_bytes_do_not_depend_on_the_process_hash_salt() -> None:
    seen = outputs_under_hash_seeds(
        "from syncreward._canonical import EQUAL, EXACT, to_bytes\n"
        "value = {'b': [1, 'x'], 'a': {('k', 2): b'v', 'z': None}, 'c': {'q': 1.5}}\n"
        "print(to_bytes(value, EXACT).hex(), to_bytes(value, EQUAL).hex())\n"
    )
    assert len(seen) == 1, seen


def test_a_configuration_too_large_to_compare_whole_is_compared_by_its_text() -> None:
    big = Identity(functools.partial(_reward, prompt=[str(i) for i in range(200_000)]), "_reward")
    assert big.digest == ""  # its shown text (first items and length) is what is compared
    assert "...<200000 items>" in big.key()


HUGE = 10**5000  # past str()'s default digit limit (4300 digits): repr() raises ValueError


def test_an_int_past_the_str_digit_limit_is_written_in_every_container_under_both_rules() -> None:
    for rule in (EXACT, EQUAL):
        for wrap in (lambda v: v, lambda v: [v], lambda v: (1, v), lambda v: {"k": v}, lambda v: {"k": [v, "x"]}):
            assert to_bytes(wrap(HUGE), rule) == to_bytes(wrap(HUGE), rule), rule
            assert to_bytes(wrap(HUGE), rule) != to_bytes(wrap(HUGE + 1), rule), rule


def test_a_reward_configured_with_an_int_past_the_str_digit_limit_is_decorated_and_told_apart() -> None:
    def make(modulus: int) -> Any:
        def reward(completions: list[str], **kwargs: Any) -> list[float]:
            return [float(len(c) % modulus) for c in completions]

        return reward

    assert syncreward.synced_reward(make(HUGE))(["ab"]) == [2.0]  # decorated and called in one process
    a, same, other = (Identity(make(m), "reward") for m in (HUGE, HUGE, HUGE + 1))
    assert (a.key(), a.digest) == (same.key(), same.digest)  # copies configured alike pair
    assert (a.key(), a.digest) != (other.key(), other.digest)  # different configurations never do
