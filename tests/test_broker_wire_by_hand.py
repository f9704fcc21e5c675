"""The wire format on small groups written out by hand, independent of the implementation.

Every group here is spelled element by element, and every expected outcome is read off it on
paper: which completion holds the first bad value, where a completion boundary falls, which
limits of the reader a payload stays within. The edges are the point: the smallest valid token id
and log-prob, a version restarting exactly at a boundary, a payload exactly at the size limit.
"""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from streamrl.broker.wire import Completion, RolloutGroup, WireError, decode_group, encode_group

VOCAB = 100


def _group(*completions, prompt=(1, 2, 3)) -> RolloutGroup:
    """A group of completions given as (tokens, log-probs, versions) triples."""
    comps = [
        Completion(
            np.array(tokens, np.int32), np.array(lps, np.float32), np.array(vers, np.int32), 0.0
        )
        for tokens, lps, vers in completions
    ]
    return RolloutGroup("g", "p", "a0", 0, np.array(prompt, np.int32), comps)


def _payload(group: RolloutGroup) -> dict:
    return msgpack.unpackb(encode_group(group), raw=False)


def _pack(payload: dict) -> bytes:
    return msgpack.packb(payload, use_bin_type=True)


def _columns(payload: dict, **columns) -> bytes:
    """The payload with some columns replaced by hand-written arrays (in the wire dtypes)."""
    dtypes = {"tok": np.int32, "lp": np.float32, "ver": np.int32, "len": np.int32}
    for key, values in columns.items():
        payload[key] = np.array(values, dtypes[key]).tobytes()
    return _pack(payload)


# Two completions of two tokens each: flat positions 0, 1 are completion[0], 2, 3 completion[1].
def _two_by_two() -> RolloutGroup:
    return _group(([5, 6], [-1.0, -1.0], [0, 0]), ([7, 8], [-1.0, -1.0], [0, 0]))


def test_a_completions_length_is_its_token_count():
    assert len(Completion(np.array([4, 5, 6], np.int32), np.zeros(3), np.zeros(3), 0.0)) == 3


def test_the_smallest_and_largest_valid_values_pass():
    """Token id 0 and VOCAB - 1 = 99 are in [0, 100); log-prob 0.0 is a certain token (p = 1);
    version 0 is the first policy. A prompt of 0 and 99 is valid for the same reason."""
    group = _group(([0, 99], [0.0, -2.5], [0, 0]), prompt=(0, 99))
    back = decode_group(encode_group(group), vocab_size=VOCAB)
    assert back.prompt_token_ids.tolist() == [0, 99]
    (c,) = back.completions
    assert (c.token_ids.tolist(), c.logprobs.tolist(), c.versions.tolist()) == (
        [0, 99],
        [0.0, -2.5],
        [0, 0],
    )


def test_without_a_vocabulary_only_negative_ids_are_rejected():
    """vocab_size None (a consumer that does not know the tokenizer): id 1_000_000 passes, -1 does
    not. The -1 sits at flat position 3, the second token of completion[1]; completion[0] holds a
    0, which is valid and must not be blamed."""
    big = _group(([1_000_000], [-1.0], [0]), prompt=(1_000_000,))
    assert decode_group(encode_group(big)).completions[0].token_ids.tolist() == [1_000_000]
    data = _columns(_payload(_two_by_two()), tok=[0, 5, 7, -1])
    with pytest.raises(WireError, match=r"^completion\[1\]\.tok: token id outside"):
        decode_group(data)
    with pytest.raises(WireError, match=r"^group\.prompt: token id outside"):
        decode_group(encode_group(_group(([1], [-1.0], [0]), prompt=(4, -1))))


@pytest.mark.parametrize(
    ("tokens", "owner"),
    [
        # 100 = VOCAB at flat position 2 (completion[1]); the 0 at position 0 is valid
        ([0, 5, 100, 3], 1),
        # -1 at position 1: completion[0], although completion[1] also holds a 100
        ([4, -1, 100, 3], 0),
        # 101 at position 3, completion[1]
        ([0, 99, 0, 101], 1),
    ],
)
def test_the_first_out_of_vocabulary_token_names_its_completion(tokens, owner):
    data = _columns(_payload(_two_by_two()), tok=tokens)
    with pytest.raises(WireError, match=rf"^completion\[{owner}\]\.tok: .*\[0, 100\)"):
        decode_group(data, vocab_size=VOCAB)


def test_a_prompt_token_equal_to_the_vocabulary_size_is_rejected():
    with pytest.raises(WireError, match=r"^group\.prompt: token id outside"):
        decode_group(encode_group(_group(([1], [-1.0], [0]), prompt=(3, 100))), vocab_size=VOCAB)


@pytest.mark.parametrize(
    ("logprobs", "owner"),
    [
        # 0.5 at flat position 3 (completion[1]); the 0.0 at position 0 is a valid certainty
        ([0.0, -1.0, -0.5, 0.5], 1),
        # 2.0 at position 1 (completion[0]) before the 0.25 at position 2
        ([-1.0, 2.0, 0.25, 0.0], 0),
    ],
)
def test_the_first_positive_log_prob_names_its_completion(logprobs, owner):
    data = _columns(_payload(_two_by_two()), lp=logprobs)
    with pytest.raises(WireError, match=rf"^completion\[{owner}\]\.lp: log-prob above 0"):
        decode_group(data, vocab_size=VOCAB)


def test_the_first_negative_version_names_its_completion():
    """Version 0 at positions 0, 1 is valid; the -1 at position 2 opens completion[1]."""
    data = _columns(_payload(_two_by_two()), ver=[0, 0, -1, 0])
    with pytest.raises(WireError, match=r"^completion\[1\]\.ver: negative policy version"):
        decode_group(data, vocab_size=VOCAB)


def test_versions_may_restart_exactly_at_each_boundary():
    """Three completions of two tokens, versions 5 5 | 2 3 | 0 1: each completion is
    non-decreasing; the drops 5 -> 2 and 3 -> 0 fall between positions 1|2 and 3|4, the two
    boundaries, so the group is valid."""
    group = _group(
        ([1, 2], [-1.0, -1.0], [5, 5]),
        ([3, 4], [-1.0, -1.0], [2, 3]),
        ([5, 6], [-1.0, -1.0], [0, 1]),
    )
    back = decode_group(encode_group(group), vocab_size=VOCAB)
    assert [c.versions.tolist() for c in back.completions] == [[5, 5], [2, 3], [0, 1]]


@pytest.mark.parametrize(
    ("versions", "owner"),
    [
        # 5 4: a drop between positions 0 and 1, inside completion[0]
        ([5, 4, 2, 3, 0, 1], 0),
        # 3 2: a drop between positions 2 and 3, inside completion[1] (the 5 -> 3 is a boundary)
        ([5, 5, 3, 2, 0, 1], 1),
        # 1 0: a drop between positions 4 and 5, inside completion[2]
        ([5, 5, 2, 3, 1, 0], 2),
    ],
)
def test_a_version_going_backwards_inside_a_completion_names_it(versions, owner):
    three = _group(*[([1, 2], [-1.0, -1.0], [0, 0])] * 3)
    data = _columns(_payload(three), ver=versions)
    with pytest.raises(WireError, match=rf"^completion\[{owner}\]\.ver: .*go backwards"):
        decode_group(data, vocab_size=VOCAB)


def test_one_completion_of_one_token_is_valid():
    """Nothing to compare a single version with: no step, no boundary."""
    back = decode_group(encode_group(_group(([7], [-0.5], [3]))), vocab_size=VOCAB)
    assert back.completions[0].versions.tolist() == [3]


def test_encoding_casts_to_the_wire_dtypes_and_clamps_log_probs_to_zero():
    """A producer may hand int64 ids and versions and float64 log-probs. They travel as int32,
    float32, int32 with the same values; a log-prob of +0.25 (rounding noise above certainty)
    becomes 0.0, one of -1.5 (exact in float32) stays."""
    comp = Completion(
        np.array([3, 4], np.int64), np.array([0.25, -1.5]), np.array([1, 2], np.int64), 1.0
    )
    group = RolloutGroup("g", "p", "a0", 0, np.array([9, 8], np.int64), [comp])
    back = decode_group(encode_group(group), vocab_size=VOCAB)
    (c,) = back.completions
    assert back.prompt_token_ids.dtype == np.int32 and back.prompt_token_ids.tolist() == [9, 8]
    assert (c.token_ids.dtype, c.logprobs.dtype, c.versions.dtype) == (
        np.int32,
        np.float32,
        np.int32,
    )
    assert (c.token_ids.tolist(), c.logprobs.tolist(), c.versions.tolist()) == (
        [3, 4],
        [0.0, -1.5],
        [1, 2],
    )


def test_reward_parts_travel_as_an_empty_list_unless_a_completion_has_some():
    """The format's rule: ``rp`` is [] when no completion names a part (the common case costs one
    byte), else one map per completion. Completion[1] alone has {"exact": 1} here."""
    group = _two_by_two()
    assert _payload(group)["rp"] == []
    group.completions[1].reward_parts = {"exact": 1}
    assert _payload(group)["rp"] == [{}, {"exact": 1.0}]
    back = decode_group(encode_group(group), vocab_size=VOCAB)
    assert [c.reward_parts for c in back.completions] == [{}, {"exact": 1.0}]


def test_created_at_may_be_an_int_but_not_a_string_and_meta_may_be_absent():
    payload = _payload(_two_by_two())
    payload["t"] = 1700000000
    del payload["meta"]
    back = decode_group(_pack(payload), vocab_size=VOCAB)
    assert (back.created_at, type(back.created_at), back.meta) == (1700000000.0, float, {})
    payload["t"] = "yesterday"
    with pytest.raises(WireError, match=r"^group\.t: expected float/int, got str$"):
        decode_group(_pack(payload), vocab_size=VOCAB)


def test_the_size_limit_admits_an_entry_of_exactly_that_size():
    data = encode_group(_two_by_two())
    assert decode_group(data, vocab_size=VOCAB, max_bytes=len(data)).group_id == "g"
    with pytest.raises(WireError, match="exceeds the size limit"):
        decode_group(data, vocab_size=VOCAB, max_bytes=len(data) - 1)


@pytest.mark.parametrize(
    ("extra", "valid"),
    [
        # strings up to 2**20 characters (1 MiB of ASCII)
        ("a" * 2**20, True),
        ("a" * (2**20 + 1), False),
        # arrays up to 2**16 items
        ([0] * 2**16, True),
        ([0] * (2**16 + 1), False),
        # maps up to 2**12 entries
        ({f"k{i}": 0 for i in range(2**12)}, True),
        ({f"k{i}": 0 for i in range(2**12 + 1)}, False),
        # map keys are strings only
        ({1: 2}, False),
        # no extension types at all, not even one byte long
        (msgpack.ExtType(1, b"a"), False),
    ],
    ids=["str-max", "str-over", "array-max", "array-over", "map-max", "map-over", "int-key", "ext"],
)
def test_the_reader_limits_hold_even_in_a_field_nobody_reads(extra, valid):
    """An unknown field is ignored once parsed, so only the reader's own limits can reject it."""
    payload = _payload(_two_by_two())
    payload["x"] = extra
    data = _pack(payload)
    if valid:
        assert decode_group(data, vocab_size=VOCAB).group_id == "g"
    else:
        with pytest.raises(WireError, match="^not valid msgpack"):
            decode_group(data, vocab_size=VOCAB)


@pytest.mark.parametrize(
    ("lengths", "reason"),
    [
        # no lengths at all: no completion
        ([], r"^group: no completions$"),
        # 1 token, then 0: completion[1] is the empty one (a single token is a valid completion)
        ([1, 0], r"^completion\[1\]: empty completion$"),
        # 2, then -3: a negative length is empty too
        ([2, -3], r"^completion\[1\]: empty completion$"),
    ],
)
def test_lengths_name_the_empty_completion(lengths, reason):
    data = _columns(_payload(_two_by_two()), len=lengths)
    with pytest.raises(WireError, match=reason):
        decode_group(data, vocab_size=VOCAB)


@pytest.mark.parametrize(
    "parts",
    [
        # completion[1]'s parts are a number, not a map
        [{"a": 1.0}, 5],
        # completion[1]'s map has a binary key (msgpack lets str and bin keys through)
        [{"a": 1.0}, {b"a": 1.0}],
    ],
)
def test_reward_parts_must_be_maps_with_text_keys(parts):
    payload = _payload(_two_by_two())
    payload["rp"] = parts
    with pytest.raises(WireError, match=r"^completion\[1\]\.rp: expected a map of finite numbers"):
        decode_group(_pack(payload), vocab_size=VOCAB)


FIELD_TYPES = {
    "gid": ("str", 1, "int"),
    "pid": ("str", 1, "int"),
    "aid": ("str", b"a0", "bytes"),
    "seq": ("int", "7", "str"),
    "t": ("float/int", None, "NoneType"),
    "prompt": ("bytes", [1, 2], "list"),
    "len": ("bytes", "2", "str"),
    "tok": ("bytes", 5, "int"),
    "lp": ("bytes", -1.0, "float"),
    "ver": ("bytes", [0], "list"),
    "r": ("bytes", 0.0, "float"),
    "fin": ("list", "stop", "str"),
    "rp": ("list", {}, "dict"),
}


@pytest.mark.parametrize("key", list(FIELD_TYPES))
def test_each_field_missing_or_of_the_wrong_type_is_named_exactly(key):
    """Every field is a field of the group: its errors read ``group: missing field 'key'`` and
    ``group.key: expected <type>, got <type>``, word for word (the dead-letter reason)."""
    want, wrong, got = FIELD_TYPES[key]
    payload = _payload(_two_by_two())
    payload[key] = wrong
    with pytest.raises(WireError, match=rf"^group\.{key}: expected {want}, got {got}$"):
        decode_group(_pack(payload), vocab_size=VOCAB)
    del payload[key]
    with pytest.raises(WireError, match=rf"^group: missing field '{key}'$"):
        decode_group(_pack(payload), vocab_size=VOCAB)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        # a str where bytes belong: the reason names what arrived
        ("text", r"^entry payload must be bytes, got str$"),
        # a msgpack array [1, 2, 3] where the group's map belongs
        (msgpack.packb([1, 2, 3]), r"^top level must be a map, got list$"),
        # zero bytes: msgpack reports a truncated input as a ValueError
        (b"", r"^not valid msgpack: ValueError: "),
        # one string a byte over the 2**20 limit: msgpack names both numbers
        (msgpack.packb({"x": "a" * (2**20 + 1)}), r"1048577 exceeds max_str_len\(1048576\)$"),
    ],
)
def test_a_rejected_entry_says_what_it_found(data, reason):
    with pytest.raises(WireError, match=reason):
        decode_group(data, vocab_size=VOCAB)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("prompt", b"", r"^group\.prompt: empty prompt$"),
        (
            "prompt",
            b"\x01\x02\x03",
            r"^group\.prompt: 3 bytes is not a whole number of 4-byte items$",
        ),
        ("meta", {"x": [1]}, r"^group\.meta: expected a map of scalars$"),
        ("v", 1, r"^unknown schema version 1 \(this build reads 2\)$"),
    ],
)
def test_group_level_reasons_word_for_word(key, value, reason):
    payload = _payload(_two_by_two())
    payload[key] = value
    with pytest.raises(WireError, match=reason):
        decode_group(_pack(payload), vocab_size=VOCAB)
