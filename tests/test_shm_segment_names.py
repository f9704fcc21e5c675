"""A shared-memory segment name read from Redis is a name, never a path: before anything opens a
segment an announcement names (an actor's reader, ``streamrl inspect``'s lease view), the name is
checked against the one rule the writer names segments by, so a hostile announcement naming
``../../<a file>`` gets nothing opened, read or printed."""

from __future__ import annotations

import os
import secrets
import time
import uuid

import pytest
import redis
import torch
from opened_paths import opened_paths
from weightsync_helpers import with_weightsync
from weightsync_procs import engine_template

from streamrl.broker.keys import Keys
from streamrl.weightsync.announce import announce
from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.subscriber import Subscriber
from streamrl.weightsync.transports.shm.segment import (
    SHM_DIR,
    SegmentNameError,
    SegmentReader,
    active_leases,
    check_segment_name,
    segment_name,
)
from streamrl.weightsync.transports.shm.slots import ShmReader, ShmWriter

LAYOUT = Layout.build([TensorSpec("w", (16,), "float32")])


def _escape_to(victim) -> str:
    """A name that, joined to /dev/shm as a path, is ``victim``."""
    return "../.." + str(victim)


@pytest.fixture
def victim(tmp_path):
    """A file of this user outside /dev/shm, holding a secret, made to look like a segment."""
    path = tmp_path / f"victim-{uuid.uuid4().hex}"
    path.write_bytes(b"SECRET-" + secrets.token_hex(8).encode() + b"\0" * 8192)
    return path


@pytest.mark.parametrize("host", ["", "hostC", "node-1.rack_2"])
def test_the_names_a_writer_makes_pass_the_rule_of_their_run(host):
    run = f"names-{uuid.uuid4().hex[:8]}"
    writer = ShmWriter(run, LAYOUT, 2, 1.0, host_id=host)
    try:
        assert writer.name == segment_name(run, host, os.getpid(), writer.name.rsplit(".", 1)[1])
        assert check_segment_name(writer.name, run) == writer.name
        assert check_segment_name(writer.name) == writer.name
        with pytest.raises(SegmentNameError, match="refused segment name"):
            check_segment_name(writer.name, "another-run")
    finally:
        writer.close()


@pytest.mark.parametrize(
    "name",
    [
        "../../etc/passwd",
        "/etc/passwd",
        f"streamrl.r.weights.1.{'a' * 32}/../../../etc/passwd",
        f"streamrl.r.weights.../../1.{'a' * 32}",
        "streamrl.r.weights.1.deadbeef",
        f"streamrl.r.weights.1.{'A' * 32}",
        f"streamrl.r.weights.1.{'a' * 32}\0",
        "",
        None,
        7,
    ],
)
def test_anything_but_a_segment_name_is_refused_by_the_rule(name):
    with pytest.raises(SegmentNameError):
        check_segment_name(name, "r")
    with pytest.raises(SegmentNameError):
        check_segment_name(name)


def test_a_reader_and_the_lease_view_refuse_an_escaping_name_before_opening_anything(victim):
    name = _escape_to(victim)
    assert (SHM_DIR / name).resolve() == victim.resolve()
    with opened_paths() as opened:
        with pytest.raises(SegmentNameError, match="a name in Redis is a name, never a path"):
            SegmentReader(name, 1.0, kind=None)
        with pytest.raises(SegmentNameError):
            ShmReader(name, 1.0)
        with pytest.raises(SegmentNameError):
            active_leases(name, "r")
    assert not [p for p in opened if victim.name in p]


def test_a_name_of_another_run_is_refused_where_the_run_is_known():
    writer = ShmWriter(f"names-{uuid.uuid4().hex[:8]}", LAYOUT, 2, 1.0)
    try:
        with pytest.raises(SegmentNameError, match="streamrl.mine.weights."):
            ShmReader(writer.name, 1.0, run_name="mine")
        ShmReader(writer.name, 1.0, run_name=writer.name.split(".")[1]).close()
    finally:
        writer.close()


def test_an_actor_skips_a_hostile_announcement_naming_a_file_outside_shm(redis_cfg, victim):
    cfg = with_weightsync(redis_cfg, transport="shm", timeout_s=2.0)
    keys = Keys.from_config(cfg.run, cfg.broker)
    client = redis.Redis.from_url(cfg.broker.redis_url)
    meta = {"segment": _escape_to(victim), "slot": 0, "layout": LAYOUT.to_json(), "aliases": {}}
    sub = None
    with opened_paths() as opened:
        announce(client, keys, 1, "shm", "hostile-peer", meta)
        sub = Subscriber.from_config(
            cfg.weightsync, cfg.broker, cfg.run, "in-test", engine_template(64, 2)
        ).start()
        try:
            deadline = time.monotonic() + 30
            while not sub.failures.get("segment_refused") and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            sub.close()
    assert sub.failures.get("segment_refused") == 1, sub.failures
    assert "refused segment name" in sub.last_error and sub.version == 0
    assert not [p for p in opened if victim.name in p]


def test_a_stop_request_unlinks_the_name_and_the_mapped_reader_still_reads_the_last_version():
    """``unlink_on_stop`` (the learner's and the relay's SIGTERM): the file leaves /dev/shm at
    once, so a kill before ``close`` leaves nothing there; a reader that mapped the segment reads on,
    the writer still writes its last version into it, and no one opens it anew."""
    from streamrl.weightsync.transports.shm.segment import unlink_on_stop

    run = f"stop-{uuid.uuid4().hex[:8]}"
    writer = ShmWriter(run, LAYOUT, 2, 1.0)
    try:
        reader = ShmReader(writer.name, 1.0)
        unlink_on_stop()
        assert not (SHM_DIR / writer.name).exists()
        slot, _ = writer.write(7, {"w": torch.arange(16, dtype=torch.float32)})
        out = {"w": torch.zeros(16)}
        assert reader.read_into(7, slot, LAYOUT, [("w", "w")], out) == "ok"
        assert torch.equal(out["w"], torch.arange(16, dtype=torch.float32))
        with pytest.raises(FileNotFoundError):
            ShmReader(writer.name, 1.0)
        reader.close()
    finally:
        writer.close()
