"""The wire format: valid groups round-trip exactly; every malformed entry is rejected with its reason."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrl.broker.wire import (
    FINISH_REASONS,
    ID_PATTERN,
    RESERVED_PART_NAMES,
    Completion,
    RolloutGroup,
    WireError,
    decode_group,
    encode_group,
)

VOCAB = 100

finite = st.floats(allow_nan=False, allow_infinity=False, width=32)


@st.composite
def completions(draw):
    n = draw(st.integers(1, 40))
    tokens = draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))
    logprobs = draw(st.lists(st.floats(-50.0, 0.0, width=32), min_size=n, max_size=n))
    versions = sorted(draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n)))
    names = st.text(max_size=8).filter(lambda name: name not in RESERVED_PART_NAMES)
    parts = draw(st.dictionaries(names, finite, max_size=3))
    return Completion(
        np.array(tokens, dtype=np.int32),
        np.array(logprobs, dtype=np.float32),
        np.array(versions, dtype=np.int32),
        draw(finite),
        draw(st.sampled_from(FINISH_REASONS)),
        parts,
    )


def ids(max_size: int):
    return st.from_regex(ID_PATTERN, fullmatch=True).filter(lambda s: len(s) <= max_size)


@st.composite
def groups(draw):
    group = RolloutGroup(
        group_id=draw(ids(40)),
        prompt_id=draw(ids(20)),
        actor_id=draw(ids(20)),
        seq=draw(st.integers(0, 2**40)),
        prompt_token_ids=np.array(
            draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=30)), dtype=np.int32
        ),
        completions=draw(st.lists(completions(), min_size=1, max_size=8)),
        created_at=draw(st.floats(0, 2e9)),
        meta=draw(
            st.dictionaries(
                st.text(max_size=8), st.integers(-100, 100) | st.text(max_size=8), max_size=3
            )
        ),
    )
    # algo.reference_on: actors: every completion carries reference log-probs, or none does
    if draw(st.booleans()):
        for c in group.completions:
            ref = draw(st.lists(st.floats(-50.0, 0.0, width=32), min_size=len(c), max_size=len(c)))
            c.ref_logprobs = np.array(ref, dtype=np.float32)
    return group


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups())
def test_valid_groups_round_trip_exactly(group):
    back = decode_group(encode_group(group), vocab_size=VOCAB)
    assert (back.group_id, back.prompt_id, back.actor_id, back.seq) == (
        group.group_id,
        group.prompt_id,
        group.actor_id,
        group.seq,
    )
    assert back.created_at == group.created_at and back.meta == group.meta
    np.testing.assert_array_equal(back.prompt_token_ids, group.prompt_token_ids)
    assert len(back.completions) == len(group.completions)
    for got, want in zip(back.completions, group.completions, strict=True):
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        np.testing.assert_array_equal(got.logprobs, want.logprobs)
        np.testing.assert_array_equal(got.versions, want.versions)
        assert got.reward == pytest.approx(want.reward) and got.finish_reason == want.finish_reason
        assert got.reward_parts == pytest.approx(want.reward_parts)
        if want.ref_logprobs is None:
            assert got.ref_logprobs is None
        else:
            np.testing.assert_array_equal(got.ref_logprobs, want.ref_logprobs)


def _group(n_completions: int = 3, length: int = 5) -> RolloutGroup:
    rng = np.random.default_rng(0)
    comps = [
        Completion(
            rng.integers(0, VOCAB, length).astype(np.int32),
            -rng.random(length).astype(np.float32),
            np.full(length, 2, np.int32),
            0.5,
        )
        for _ in range(n_completions)
    ]
    return RolloutGroup("g1", "p1", "a0", 7, np.array([1, 2, 3], np.int32), comps)


def _payload() -> dict:
    return msgpack.unpackb(encode_group(_group()), raw=False)


def _set(path, value):
    def mutate(obj):
        node = obj
        for key in path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[path[-1]]
        else:
            node[path[-1]] = value
        return obj

    return mutate


def _poke(column: str, dtype, index: int, value):
    """Set one element of a columnar array (all completions' tokens, log-probs, ... joined)."""

    def mutate(obj):
        array = np.frombuffer(obj[column], dtype=dtype).copy()
        array[index] = value
        obj[column] = array.tobytes()
        return obj

    return mutate


_DELETE = object()
_i32 = lambda *xs: np.array(xs, np.int32).tobytes()  # noqa: E731
_f32 = lambda *xs: np.array(xs, np.float32).tobytes()  # noqa: E731

# _group(): 3 completions of 5 tokens, so flat index 5..9 is completion[1], 10..14 completion[2].
MALFORMED = {
    "unknown schema version": _set(["v"], 99),
    "missing field 'gid'": _set(["gid"], _DELETE),
    "group.gid: expected str": _set(["gid"], 12),
    "group.seq: expected int, got bool": _set(["seq"], True),
    "group.prompt: empty prompt": _set(["prompt"], b""),
    "group.prompt: 3 bytes is not a whole number of 4-byte items": _set(
        ["prompt"], b"\x01\x02\x03"
    ),
    r"group.prompt: token id outside the vocabulary \[0, 100\)": _set(["prompt"], _i32(5, 100)),
    "group: no completions": _set(["len"], b""),
    r"completion\[2\]: empty completion": _set(["len"], _i32(5, 10, 0)),
    r"lengths differ \(completion lengths sum to 15; tokens 15, logprobs 14, versions 15\)": _set(
        ["lp"], _f32(*[-1.0] * 14)
    ),
    r"group.r: 2 rewards for 3 completions": _set(["r"], np.zeros(2).tobytes()),
    r"completion\[1\].tok: token id outside the vocabulary": _poke("tok", np.int32, 9, -1),
    r"completion\[2\].tok: token id outside the vocabulary \[0, 100\)": _poke(
        "tok", np.int32, 10, 100
    ),
    r"completion\[2\].lp: non-finite log-prob": _poke("lp", np.float32, 11, math.nan),
    r"completion\[1\].lp: non-finite log-prob": _poke("lp", np.float32, 6, -math.inf),
    r"completion\[0\].lp: log-prob above 0": _poke("lp", np.float32, 1, 0.5),
    r"completion\[2\].ver: negative policy version": _poke("ver", np.int32, 10, -1),
    r"completion\[1\].ver: policy versions go backwards": _poke("ver", np.int32, 7, 1),
    r"completion\[0\].r: non-finite reward": _poke("r", np.float64, 0, math.inf),
    "group: missing field 'r'": _set(["r"], _DELETE),
    r"completion\[2\].rp: expected a map of finite numbers": _set(
        ["rp"], [{}, {}, {"a": math.nan}]
    ),
    r"completion\[0\].rp: expected a map of finite numbers": _set(["rp"], [{"a": True}, {}, {}]),
    r"group.rp: 1 reward-part maps for 3 completions": _set(["rp"], [{}]),
    r"completion\[1\].fin: unknown finish reason 'exploded'": _set(["fin", 1], "exploded"),
    r"group.fin: 1 finish reasons for 3 completions": _set(["fin"], ["stop"]),
    r"group.tok: expected bytes, got list": _set(["tok"], [1, 2]),
    "group.meta: expected a map of scalars": _set(["meta"], {"x": [1]}),
    # a fuzz found these trained: "" entered the dedup set, NaN the step rows
    "group.gid: '' is not a non-empty id": _set(["gid"], ""),
    r"group.pid: 'row\\n1' is not a non-empty id": _set(["pid"], "row\n1"),
    r"group.aid: 'a b' is not a non-empty id": _set(["aid"], "a b"),
    r"group.meta\['epoch'\]: non-finite value nan": _set(["meta"], {"epoch": math.nan}),
    r"group.meta\['x'\]: non-finite value -inf": _set(["meta"], {"x": -math.inf}),
}


@pytest.mark.parametrize("reason", list(MALFORMED))
def test_malformed_entry_is_rejected_with_its_reason(reason):
    data = msgpack.packb(MALFORMED[reason](_payload()), use_bin_type=True)
    with pytest.raises(WireError, match=reason):
        decode_group(data, vocab_size=VOCAB)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xc1\xff garbage", "not valid msgpack"),
        (msgpack.packb([1, 2, 3]), "top level must be a map"),
        (b"", "not valid msgpack"),
        ("text", "payload must be bytes"),
    ],
)
def test_garbage_is_rejected_with_its_reason(data, reason):
    with pytest.raises(WireError, match=reason):
        decode_group(data, vocab_size=VOCAB)


def test_oversized_entry_is_rejected_before_parsing():
    with pytest.raises(WireError, match="exceeds the size limit"):
        decode_group(encode_group(_group(16, 512)), vocab_size=VOCAB, max_bytes=4096)


def test_a_group_without_completions_cannot_be_encoded():
    group = _group()
    group.completions = []
    with pytest.raises(WireError, match="no completions"):
        encode_group(group)


def test_versions_may_restart_at_a_completion_boundary():
    group = _group()
    group.completions[0].versions[:] = 9
    group.completions[1].versions[:] = np.array([1, 1, 2, 2, 3])
    back = decode_group(encode_group(group), vocab_size=VOCAB)
    assert back.completions[0].versions.tolist() == [9] * 5 and back.completions[
        1
    ].versions.tolist() == [1, 1, 2, 2, 3]


def _group_with_reference() -> RolloutGroup:
    group = _group()
    for c in group.completions:
        c.ref_logprobs = c.logprobs - 0.25
    return group


# the reference log-prob column (algo.reference_on: actors) is checked as the behaviour one is
MALFORMED_REFERENCE = {
    r"group.rlp: 14 reference log-probs for 15 tokens": _set(["rlp"], _f32(*[-1.0] * 14)),
    r"completion\[2\].rlp: non-finite log-prob": _poke("rlp", np.float32, 12, math.nan),
    r"completion\[1\].rlp: log-prob above 0": _poke("rlp", np.float32, 5, 0.5),
    r"group.rlp: expected bytes, got list": _set(["rlp"], [-1.0]),
}


@pytest.mark.parametrize("reason", list(MALFORMED_REFERENCE))
def test_malformed_reference_logprobs_are_rejected_with_their_reason(reason):
    payload = msgpack.unpackb(encode_group(_group_with_reference()), raw=False)
    data = msgpack.packb(MALFORMED_REFERENCE[reason](payload), use_bin_type=True)
    with pytest.raises(WireError, match=reason):
        decode_group(data, vocab_size=VOCAB)


def test_reference_logprobs_on_some_completions_only_cannot_be_encoded():
    group = _group_with_reference()
    group.completions[1].ref_logprobs = None
    with pytest.raises(WireError, match="reference log-probs on some completions only"):
        encode_group(group)
