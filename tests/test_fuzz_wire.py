"""Fuzzing the stream decoder: any bytes at all give a valid group or a WireError, quickly.

test_broker_wire.py names one reason per malformed field; here hypothesis
throws thousands of arbitrary, mutated and hostile entries at ``decode_group``
and, through a real consumer, interleaves them with valid ones.
"""

from __future__ import annotations

import asyncio
import math
import struct
import time
import tracemalloc

import msgpack
import numpy as np
from broker_helpers import VOCAB, limits_of, make_group
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamrl.broker.client import connect_async, connect_sync
from streamrl.broker.keys import Keys
from streamrl.broker.stream import RolloutConsumer
from streamrl.broker.wire import FINISH_REASONS, RolloutGroup, WireError, decode_group, encode_group

# a decode of a hostile header may not allocate what it declares (GiBs): far below that
MAX_DECODE_ALLOC = 64 * 2**20
FUZZ = settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
VALID = encode_group(make_group("fuzz", n_completions=3, length=5))
FIELDS = list(msgpack.unpackb(VALID, raw=False))

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=64)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=20,
)


def _to_bytes(dtype: str, xs: list) -> bytes:
    with np.errstate(invalid="ignore", over="ignore"):
        return np.array(xs).astype(dtype).tobytes()


arrays = st.builds(
    _to_bytes,
    st.sampled_from(["<i4", "<f4", "<f8", "<i8", "u1"]),
    st.lists(
        st.floats(allow_nan=True, allow_infinity=True, width=32) | st.integers(-(2**31), 2**31 - 1),
        max_size=20,
    ),
)


def assert_decodes_or_rejects(data: bytes) -> None:
    """The property: a fully valid group or WireError, nothing else (a hang meets pytest's
    timeout)."""
    try:
        group = decode_group(data, vocab_size=VOCAB)
    except WireError as exc:
        assert str(exc), "a rejection must say why"
        group = None
    if group is not None:
        assert_valid(group)


def assert_valid(group: RolloutGroup) -> None:
    assert isinstance(group.group_id, str) and group.completions
    assert (
        group.prompt_token_ids.size
        and 0 <= group.prompt_token_ids.min()
        and group.prompt_token_ids.max() < VOCAB
    )
    for c in group.completions:
        n = len(c)
        assert n > 0 and c.logprobs.shape == (n,) and c.versions.shape == (n,)
        assert 0 <= c.token_ids.min() and c.token_ids.max() < VOCAB
        assert np.isfinite(c.logprobs).all() and (c.logprobs <= 0).all()
        assert (c.versions >= 0).all() and (np.diff(c.versions) >= 0).all()
        assert math.isfinite(c.reward) and c.finish_reason in FINISH_REASONS
        assert all(math.isfinite(v) for v in c.reward_parts.values())


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_decode_or_raise_wire_error(data):
    assert_decodes_or_rejects(data)


@FUZZ
@given(st.data())
def test_mutated_valid_entries_decode_or_raise_wire_error(data):
    raw = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        i = data.draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "set" and raw:
            raw[i] = data.draw(st.integers(0, 255))
        elif op == "cut":
            del raw[i:]
        elif op == "insert":
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and raw:
            del raw[i : i + data.draw(st.integers(1, 16))]
    assert_decodes_or_rejects(bytes(raw))


@FUZZ
@given(st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), values, max_size=12))
def test_arbitrary_msgpack_maps_decode_or_raise_wire_error(obj):
    assert_decodes_or_rejects(msgpack.packb(obj, use_bin_type=True))


@FUZZ
@given(st.sampled_from(FIELDS), values | arrays, st.booleans())
def test_a_valid_entry_with_one_field_replaced_decodes_or_raises_wire_error(
    field, value, drop_other
):
    obj = msgpack.unpackb(VALID, raw=False)
    obj[field] = value
    # also lose a second field
    if drop_other:
        obj.pop(FIELDS[hash(field) % len(FIELDS)], None)
    assert_decodes_or_rejects(msgpack.packb(obj, use_bin_type=True))


@FUZZ
@given(
    st.sampled_from(["tok", "lp", "ver", "r", "prompt", "len"]),
    st.sampled_from([math.nan, math.inf, -math.inf, 1e30, -1e30, 2**31 - 1, -(2**31), VOCAB, -1]),
    st.integers(0, 20),
)
def test_hostile_numbers_inside_arrays_are_rejected_or_valid(column, value, index):
    obj = msgpack.unpackb(VALID, raw=False)
    dtype = {"tok": "<i4", "lp": "<f4", "ver": "<i4", "r": "<f8", "prompt": "<i4", "len": "<i4"}[
        column
    ]
    array = np.frombuffer(obj[column], dtype=dtype).copy()
    with np.errstate(invalid="ignore", over="ignore"):
        array[index % array.size] = np.array(value).astype(dtype)
    obj[column] = array.tobytes()
    assert_decodes_or_rejects(msgpack.packb(obj, use_bin_type=True))


def test_huge_declared_sizes_are_rejected_without_allocating():
    headers = [
        # bin32 of 4 GiB
        b"\xc6" + struct.pack(">I", 0xFFFFFFFF) + b"x",
        # str32 of 4 GiB
        b"\xdb" + struct.pack(">I", 0xFFFFFFFF) + b"x",
        # array32 of 4G items
        b"\xdd" + struct.pack(">I", 0xFFFFFFFF),
        # map32 of 4G pairs
        b"\xdf" + struct.pack(">I", 0xFFFFFFFF),
        # a field declaring 2 GiB
        b"\x81\xa3tok\xc6" + struct.pack(">I", 0x7FFFFFFF),
    ]
    for data in headers:
        tracemalloc.start()
        try:
            decode_group(data, vocab_size=VOCAB)
        except WireError:
            pass
        else:
            raise AssertionError(f"{data[:8]!r} decoded")
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        assert peak < MAX_DECODE_ALLOC, f"{data[:8]!r} allocated {peak} bytes"


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.binary(max_size=200) | st.builds(lambda v: msgpack.packb(v, use_bin_type=True), values),
        min_size=40,
        max_size=60,
    )
)
def test_the_consumer_dead_letters_every_bad_entry_and_keeps_delivering_valid_ones(redis_cfg, bad):
    cfg = redis_cfg.model_copy(deep=True)
    # make_group's groups
    cfg.rollout.group_size = 2
    cfg.run.name = f"{cfg.run.name}-{time.monotonic_ns()}"
    keys = Keys.from_config(cfg.run, cfg.broker)
    sync = connect_sync(cfg.broker, cfg.run.dir)
    good, dead_ids = [], []
    for i, payload in enumerate(bad):
        dead_ids.append(sync.xadd(keys.stream, {"g": payload}).decode())
        if i % 4 == 0:
            good.append(f"ok-{i}")
            sync.xadd(keys.stream, {"g": encode_group(make_group(good[-1]))})

    async def drain():
        r = connect_async(cfg.broker, cfg.run.dir)
        consumer = RolloutConsumer(
            r,
            keys,
            cfg.broker,
            limits_of(cfg),
            "rank0",
            VOCAB,
        )
        got = []
        for _ in range(50):
            batch = await consumer.read(7, block_ms=50)
            got += batch
            await consumer.ack([d.entry_id for d in batch], [d.group.group_id for d in batch])
            if not batch and not sync.xlen(keys.stream):
                break
        await r.aclose()
        return got

    got = asyncio.run(drain())
    assert [d.group.group_id for d in got] == good
    dead = {f[b"source_id"].decode(): f[b"reason"] for _, f in sync.xrange(keys.dead, count=10_000)}
    assert set(dead) == set(dead_ids) and all(dead.values())
    assert (
        sync.xlen(keys.stream) == 0
        and sync.xpending(keys.stream, cfg.broker.consumer_group)["pending"] == 0
    )
    sync.close()
