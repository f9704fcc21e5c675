"""The shared-memory transport with real subscriber processes: values always whole, killed and frozen
readers never block the publisher, a dead publisher never hangs a subscriber, nothing leaks in /dev/shm."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from weightsync_helpers import InProcessActor, Proc, wait_staged, with_weightsync
from weightsync_procs import check, engine_template, learner_tensors

from streamrl.weightsync.publisher import Publisher
from streamrl.weightsync.subscriber import Subscriber, swap_into_model
from streamrl.weightsync.transports.shm.segment import (
    SHM_DIR,
    active_leases,
    cleanup_stale_segments,
    segment_prefix,
)


def _cfg(redis_cfg, slots: int = 3, **ws):
    return with_weightsync(redis_cfg, transport="shm", shm={"slots": slots}, **ws)


def _segments(cfg) -> list[Path]:
    return sorted(SHM_DIR.glob(segment_prefix(cfg.run.name) + "*"))


def test_many_versions_reach_several_subscriber_processes_whole(redis_cfg, procs):
    cfg = _cfg(redis_cfg, timeout_s=5.0)
    subs = [Proc("subscriber", cfg, id=f"a{i}", until=40) for i in range(2)]
    procs.extend(subs)
    for sub in subs:
        sub.wait_event("started")
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    for version in range(41):
        stats = pub.publish(version, learner_tensors(version, 64, 2))
        assert stats.bytes > 0 and stats.seconds < 5
        time.sleep(0.01)
    for sub in subs:
        sub.wait_event("done")
        versions = [e["version"] for e in sub.applied]
        assert all(e["ok"] for e in sub.applied), "a subscriber applied a torn or wrong copy"
        assert versions == sorted(set(versions)) and versions[-1] == 40
        assert sub.done["lag"] == 0
    pub.close()
    assert _segments(cfg) == []


def _publish_until_leased(
    pub, victim_pid: int, segment_name, start: int, deadline_s: float = 20.0
) -> int:
    """Keep publishing until the victim holds a lease (is mid-copy); returns the next version."""
    version = start
    found = threading.Event()

    def watch():
        while not found.is_set():
            name = segment_name()
            if name and any(lease["pid"] == victim_pid for lease in active_leases(name)):
                found.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    deadline = time.monotonic() + deadline_s
    while not found.is_set():
        assert time.monotonic() < deadline, "victim never caught mid-copy"
        pub.publish(version, learner_tensors(version, 512, 6))
        version += 1
        found.wait(0.02)
    return version


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum,slots,timeout_s,max_publish_s",
    [
        # lock of a dead reader is gone: no wait even with 2 slots
        (signal.SIGKILL, 2, 30.0, 1.5),
        # frozen reader: the writer uses the other slots, no wait
        (signal.SIGSTOP, 3, 30.0, 1.5),
        # frozen reader on the only free slot: bounded by the lease
        (signal.SIGSTOP, 2, 1.0, 3.0),
    ],
)
def test_killed_or_frozen_reader_mid_copy_never_blocks_the_publisher(
    redis_cfg, procs, signum, slots, timeout_s, max_publish_s
):
    cfg = _cfg(redis_cfg, slots=slots, timeout_s=timeout_s)
    victim = Proc("subscriber", cfg, id="victim", hidden=512, layers=6, until=10**6, duration=60)
    procs.append(victim)
    witness = InProcessActor(cfg, "witness", 512, 6)
    victim.wait_event("started")
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    pub.publish(0, learner_tensors(0, 512, 6))
    version = _publish_until_leased(pub, victim.pid, lambda: pub._sender.writer.name, 1)
    victim.signal(signum)
    for _ in range(6):
        start = time.monotonic()
        pub.publish(version, learner_tensors(version, 512, 6))
        assert time.monotonic() - start < max_publish_s
        version += 1
    final = version - 1
    witness.wait_version(final)
    if signum == signal.SIGSTOP:
        victim.signal(signal.SIGCONT)
        victim.wait_event("applied", version=final, timeout=20)
        assert all(e["ok"] for e in victim.applied), (
            "the frozen reader applied a torn copy after SIGCONT"
        )
    witness.close()
    assert all(ok for _, ok in witness.applied)
    pub.close()
    assert _segments(cfg) == []


def test_late_joiner_gets_the_newest_version_only(redis_cfg, procs):
    cfg = _cfg(redis_cfg)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    for version in range(6):
        pub.publish(version, learner_tensors(version, 64, 2))
    late = InProcessActor(cfg, "late", 64, 2)
    late.wait_version(5)
    late.close()
    assert late.applied == [(5, True)]
    pub.close()


@pytest.mark.slow
def test_dead_publisher_leaves_subscribers_their_weights_and_its_segment_is_cleaned(
    redis_cfg, procs
):
    cfg = _cfg(redis_cfg, timeout_s=2.0)
    publisher = Proc("publisher", cfg, until=3, duration=60)
    procs.append(publisher)
    template = engine_template(64, 2)
    sub = Subscriber.from_config(cfg.weightsync, cfg.broker, cfg.run, "in-test", template).start()
    try:
        publisher.wait_event("published", version=3)
        # under load the subscriber may first stage an older version: apply until it runs the newest
        version = -1
        deadline = time.monotonic() + 20
        while version < 3 and time.monotonic() < deadline:
            assert wait_staged(sub, deadline - time.monotonic())
            version, tensors = sub.take_staged()
            assert check(version, tensors, 64, 2)
            sub.applied(version)
        assert version == 3
        publisher.signal(signal.SIGKILL)
        publisher.wait_exit()
        # SIGKILL runs no cleanup; the next publisher (or launch) removes the dead one's segment
        assert len(_segments(cfg)) == 1
        assert cleanup_stale_segments(cfg.run.name) and _segments(cfg) == []
        time.sleep(0.3)
        assert sub.take_staged() is None and sub.version == 3 and sub.lag == 0
    finally:
        start = time.monotonic()
        sub.close()
        assert time.monotonic() - start < 5
    late = Subscriber.from_config(
        cfg.weightsync, cfg.broker, cfg.run, "late", engine_template(64, 2)
    ).start()
    try:
        assert not wait_staged(late, 1.5)
        assert late.version == 0 and late.lag == 3 and late.failures.get("segment_gone", 0) >= 1
    finally:
        late.close()


def test_versions_must_strictly_increase_and_the_layout_stay_fixed(redis_cfg):
    cfg = _cfg(redis_cfg)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    try:
        pub.publish(3, learner_tensors(3, 8, 1))
        with pytest.raises(ValueError, match="strictly increase"):
            pub.publish(3, learner_tensors(3, 8, 1))
        with pytest.raises(ValueError, match="changed names, shapes"):
            pub.publish(4, learner_tensors(4, 16, 1))
        pub.publish(5, learner_tensors(5, 8, 1))
    finally:
        pub.close()


def test_swapped_in_weights_stay_intact_while_the_next_version_is_received(redis_cfg):
    from streamrl.examples.reverse_digits.task import build_model

    torch.manual_seed(1)
    engine = build_model(vocab_size=40, eos_id=1, pad_id=0).eval()
    cfg = _cfg(redis_cfg)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    sub = Subscriber.from_config(
        cfg.weightsync, cfg.broker, cfg.run, "engine", dict(engine.named_parameters())
    ).start()
    published = {}
    try:
        for version in (1, 2, 3):
            torch.manual_seed(10 + version)
            published[version] = build_model(vocab_size=40, eos_id=1, pad_id=0).state_dict()
            pub.publish(version, published[version])
            assert wait_staged(sub, 10)
            staged_version, tensors = sub.take_staged()
            _seconds, replaced = swap_into_model(engine, tensors)
            sub.applied(staged_version, recycled=replaced)
            assert staged_version == version
            for name, value in engine.state_dict().items():
                assert torch.equal(value, published[version][name]), (version, name)
            assert engine.lm_head.weight.data_ptr() == engine.model.embed_tokens.weight.data_ptr()
        # the buffers handed back are reused for receiving, never aliased with the live weights
        live = {p.data_ptr() for p in engine.parameters()}
        assert not live & {t.data_ptr() for t in replaced.values()}
    finally:
        sub.close()
        pub.close()


def test_engine_whose_names_do_not_match_reports_it_and_keeps_its_weights(redis_cfg):
    cfg = _cfg(redis_cfg)
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    sub = Subscriber.from_config(
        cfg.weightsync, cfg.broker, cfg.run, "wrong-model", engine_template(16, 2)
    ).start()
    try:
        pub.publish(1, learner_tensors(1, 8, 2))
        assert not wait_staged(sub, 1.5)
        assert sub.failures.get("name_mismatch") == 1 and "shape mismatch" in sub.last_error
        assert sub.version == 0 and sub.lag == 1
    finally:
        sub.close()
        pub.close()


def test_a_slot_filled_piece_by_piece_holds_what_one_written_whole_holds():
    """The dist sender writes its host's slot in pieces, each broadcast while the next is written:
    at any piece ends (odd ones, ends inside a tensor, in its tail, or in padding), with tensors
    copied as they are or converted, the slot holds the same bytes and checksums as ``write``
    gives, and a reader takes it whole."""
    from streamrl.weightsync.layout import Layout, TensorSpec
    from streamrl.weightsync.transports.shm.checksum import checksum
    from streamrl.weightsync.transports.shm.slots import ShmReader, ShmWriter, SlotFill

    torch.manual_seed(0)
    tensors = {
        "odd": torch.randn(3, 7),
        "big": torch.randn(70_001),
        "half": torch.randn(5).to(torch.bfloat16),
        "converted": torch.randn(1025, dtype=torch.float64),
        "empty": torch.zeros(0),
    }
    layout = Layout.build(
        [
            TensorSpec.of(n, t, torch.float32 if n == "converted" else None)
            for n, t in tensors.items()
        ]
    )
    writer = ShmWriter("fill-test", layout, 4, 5.0)
    try:
        whole_slot, _ = writer.write(1, tensors)
        whole = writer.flat(whole_slot).clone()
        for ends in ([layout.total_bytes], [1, 100, 4097, 200_000, 280_032], [64] * 3 + [123_457]):
            fill = SlotFill(writer, 1, tensors)
            for end in ends:
                fill.upto(end)
            sums = fill.commit()
            assert torch.equal(writer.flat(fill.slot), whole), ends
            assert sums == writer.checksums(whole_slot), ends
            views = layout.views(writer.flat(fill.slot))
            assert sums == [checksum(views[s.name], 1) for s in layout.specs]
        reader = ShmReader(writer.name, 5.0)
        out = {n: torch.empty_like(v) for n, v in layout.views(whole).items()}
        assert reader.read_into(1, fill.slot, layout, [(n, n) for n in out], out) == "ok"
        assert torch.equal(out["converted"], tensors["converted"].float())
        reader.close()
    finally:
        writer.close()
