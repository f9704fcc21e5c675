"""The learner only stages a version (one copy into a pre-allocated buffer); the publisher's
background thread writes and announces it. What actors see must be exactly what a synchronous
publish showed them: each version whole, under its own number, announced in order, and only
after its bytes are in place; a background failure reaches the learner."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from prometheus_client import REGISTRY

from streamrl.weightsync.announce import read_announcement
from streamrl.weightsync.layout import Layout
from streamrl.weightsync.publisher import Publisher, PublishError
from streamrl.weightsync.transports.shm.slots import ShmReader


def _weights(value: float) -> dict[str, torch.Tensor]:
    # more than one shm block per tensor, and an odd bf16 tail
    return {
        "module.w": torch.full((3 << 18,), value),
        "module.b": torch.full((7,), value, dtype=torch.bfloat16),
    }


def _read(pub: Publisher, version: int) -> dict[str, torch.Tensor]:
    """What an actor reads for the announced ``version`` (it must be the newest announced)."""
    ann = read_announcement(pub.client, pub.keys)
    assert ann.version == version
    layout = Layout.from_json(ann.meta["layout"])
    dest = {spec.name: torch.empty(spec.shape, dtype=spec.torch_dtype) for spec in layout.specs}
    reader = ShmReader(ann.meta["segment"], 5.0)
    try:
        result = reader.read_into(
            version, int(ann.meta["slot"]), layout, [(n, n) for n in dest], dest
        )
    finally:
        reader.close()
    assert result == "ok"
    return dest


@pytest.fixture
def publisher(redis_cfg):
    pub = Publisher.from_config(redis_cfg.weightsync, redis_cfg.broker, redis_cfg.run)
    yield pub
    pub.close()


def test_the_weights_may_change_as_soon_as_submit_returns(publisher):
    weights = _weights(1.0)
    publisher.submit(1, weights)
    for t in weights.values():
        t.fill_(-5.0)
    publisher.flush()
    got = _read(publisher, 1)
    assert torch.equal(got["w"], torch.full((3 << 18,), 1.0))
    assert torch.equal(got["b"], torch.full((7,), 1.0, dtype=torch.bfloat16))


def test_versions_are_announced_in_order_each_whole_after_its_bytes(publisher):
    """More versions than staging buffers, submitted back to back: each one's callback runs after
    its own announcement, and an actor reading then finds exactly that version's weights."""
    seen: list[tuple[int, float]] = []
    for version in range(1, 6):

        def announced(version=version) -> None:
            seen.append((version, float(_read(publisher, version)["w"][0])))

        publisher.submit(version, _weights(float(version)), then=announced)
    publisher.flush()
    assert seen == [(v, float(v)) for v in range(1, 6)]


def test_a_version_not_above_the_last_submitted_is_refused_at_once(publisher):
    publisher.submit(4, _weights(4.0))
    with pytest.raises(ValueError, match="strictly increase"):
        publisher.submit(4, _weights(4.0))
    publisher.flush()


def test_a_background_failure_reaches_the_learner_and_nothing_later_is_announced(publisher):
    def fail() -> None:
        raise ConnectionError("redis went away")

    publisher.submit(1, _weights(1.0), then=fail)
    with pytest.raises(PublishError, match="redis went away"):
        publisher.flush()
    with pytest.raises(PublishError):
        publisher.submit(2, _weights(2.0))
    assert read_announcement(publisher.client, publisher.keys).version == 1


def _metric(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_submit_waits_only_for_a_buffer_still_being_written_out(publisher):
    """Two staging buffers: the third submit, while the first version is still going out, waits
    for its buffer (counted in the wait metrics); the second does not."""
    gate = threading.Event()
    waits, timed = "streamrl_weights_stage_waits_total", "streamrl_weights_stage_wait_seconds_count"
    before = _metric(waits)
    publisher.submit(1, _weights(1.0), then=lambda: gate.wait(120))
    publisher.submit(2, _weights(2.0))
    assert _metric(waits) == before
    timed_before = _metric(timed)
    third = threading.Thread(target=publisher.submit, args=(3, _weights(3.0)))
    third.start()
    # the third submit is waiting once it counted its wait; only then is version 1 let out
    while _metric(waits) == before and third.is_alive():
        time.sleep(0.01)
    gate.set()
    third.join(120)
    publisher.flush()
    assert (_metric(waits), _metric(timed)) == (before + 1, timed_before + 1)
    assert float(_read(publisher, 3)["w"][0]) == 3.0


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.parametrize("transfer", [torch.float32, torch.bfloat16])
def test_from_a_gpu_the_staging_copy_is_converted_and_summed_there(redis_cfg, transfer):
    """bf16 weights on a GPU: converted to the transfer dtype on the device, copied to pinned
    memory without waiting, checksummed on the device; kernels queued after ``submit`` (the next
    optimizer step) do not reach the published bytes; a CUDA reader checks its copy on its GPU."""
    from streamrl.weightsync.transports.shm.checksum import checksum, checksum_of_sum, word_sum

    pub = Publisher(redis_cfg.weightsync, pub_keys(redis_cfg), pub_client(redis_cfg), transfer)
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        weights = {
            "module.w": torch.randn(3 << 18, device="cuda", generator=g).to(torch.bfloat16),
            "module.b": torch.randn(7, device="cuda", generator=g).to(torch.bfloat16),
        }
        expected = {n.removeprefix("module."): t.to(transfer).cpu() for n, t in weights.items()}
        pub.submit(1, weights)
        for t in weights.values():
            t.fill_(9.0)
        pub.flush()
        got = _read(pub, 1)
        for name, value in expected.items():
            assert torch.equal(got[name], value)
            assert checksum_of_sum(int(word_sum(value.cuda())), 1) == checksum(value, 1)
        ann = read_announcement(pub.client, pub.keys)
        layout = Layout.from_json(ann.meta["layout"])
        dest = {
            s.name: torch.empty(s.shape, dtype=s.torch_dtype, device="cuda") for s in layout.specs
        }
        reader = ShmReader(ann.meta["segment"], 5.0)
        try:
            pairs = [(n, n) for n in dest]
            assert reader.read_into(1, int(ann.meta["slot"]), layout, pairs, dest) == "ok"
        finally:
            reader.close()
        assert all(torch.equal(dest[n].cpu(), v) for n, v in expected.items())
    finally:
        pub.close()


def pub_keys(cfg):
    from streamrl.broker.keys import Keys

    return Keys.from_config(cfg.run, cfg.broker)


def pub_client(cfg):
    from streamrl.broker.client import connect_sync

    return connect_sync(cfg.broker, cfg.run.dir)
