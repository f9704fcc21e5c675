"""The ``cuda_ipc`` transport's protocol on CPU, every CUDA call answered by a stand-in that shares
file-backed CPU tensors between processes (tests/ipc_standin.py): the handshake (an actor started
late gets the newest version, then the next), the fence (a slot is stamped only after the copy's
fence was waited on, and no reader takes it before), strictly newer versions, and the failure
paths (publisher gone, a handle that cannot be opened, a lease run out, a segment not ours or not
a control segment). The same protocol on a GPU with ``CudaIpc`` is tests/test_weightsync_cuda.py's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack
import pytest
import torch
from ipc_standin import FileIpc
from weightsync_procs import check, engine_template, learner_tensors

from streamrl.configs.schema import Config, WeightSyncConfig
from streamrl.weightsync import transports
from streamrl.weightsync.layout import Layout, TensorSpec
from streamrl.weightsync.publisher import Publisher
from streamrl.weightsync.subscriber import Subscriber
from streamrl.weightsync.transports import cuda_ipc
from streamrl.weightsync.transports.cuda_ipc.device import CudaIpc, DeviceNotVisible
from streamrl.weightsync.transports.cuda_ipc.receiver import CudaIpcReceiver
from streamrl.weightsync.transports.cuda_ipc.slots import IpcSlotsReader, IpcSlotsWriter
from streamrl.weightsync.transports.shm.segment import SHM_DIR, segment_name
from streamrl.weightsync.transports.shm.slots import ShmWriter

HIDDEN, LAYERS = 16, 2
LAYOUT = Layout.build([TensorSpec("a", (64,), "float32"), TensorSpec("b", (3, 5), "bfloat16")])
CPU = torch.device("cpu")


@pytest.fixture
def ops(tmp_path, monkeypatch):
    """The stand-in, in place of CudaIpc for every sender and receiver of this process."""
    standin = FileIpc(tmp_path)
    monkeypatch.setattr(cuda_ipc.TRANSPORT, "ops", standin)
    return standin


@pytest.fixture
def ws():
    return WeightSyncConfig(transport="cuda_ipc", timeout_s=2.0)


def _tensors(version: int) -> dict[str, torch.Tensor]:
    return {
        "a": torch.arange(64, dtype=torch.float32) + version,
        "b": torch.full((3, 5), float(version)),
    }


def _writer(ops, slots: int = 3, lease_s: float = 1.0) -> IpcSlotsWriter:
    return IpcSlotsWriter(ops, f"ipc-{uuid.uuid4().hex[:8]}", LAYOUT, slots, lease_s, CPU)


def _dest() -> dict[str, torch.Tensor]:
    return {s.name: torch.empty(s.shape, dtype=s.torch_dtype) for s in LAYOUT.specs}


PAIRS = [("a", "a"), ("b", "b")]


def _read(reader: IpcSlotsReader, version: int, slot: int, flat: bool):
    """``read_into`` a fresh destination, tensor by tensor or (``flat``) into one buffer in the
    layout, as the subscriber's flat staging copy is; returns (result, the tensors)."""
    if not flat:
        dest = _dest()
        return reader.read_into(version, slot, LAYOUT, PAIRS, dest), dest
    buffer = torch.zeros(LAYOUT.padded_bytes, dtype=torch.uint8)
    dest = LAYOUT.views(buffer)
    return reader.read_into(version, slot, LAYOUT, PAIRS, dest, buffer), dest


def _wait(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_cuda_ipc_declares_what_it_is_publishing_device_memory_written_before_submit_returns():
    t = transports.get("cuda_ipc")
    assert (t.publishes, t.device_ipc, t.shared_memory, t.background) == (True, True, False, False)
    assert not t.relayed(WeightSyncConfig(transport="cuda_ipc"))


def test_a_late_actor_process_takes_the_newest_version_then_the_next(redis_cfg, ws, ops, tmp_path):
    pub = Publisher.from_config(ws, redis_cfg.broker, redis_cfg.run)
    actor = None
    try:
        for version in (1, 2):
            pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
        actor = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("ipc_standin.py")),
                "--dir",
                str(tmp_path),
                "subscriber",
                "--redis",
                redis_cfg.broker.redis_url,
                "--run",
                redis_cfg.run.name,
                "--weightsync",
                '{"transport": "cuda_ipc", "timeout_s": 5.0}',
                "--hidden",
                str(HIDDEN),
                "--layers",
                str(LAYERS),
                "--until",
                "3",
                "--duration",
                "60",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        lines = iter(actor.stdout)
        assert json.loads(next(lines))["event"] == "started"
        assert json.loads(next(lines)) == {"event": "applied", "version": 2, "ok": True}
        pub.publish(3, learner_tensors(3, HIDDEN, LAYERS))
        assert json.loads(next(lines)) == {"event": "applied", "version": 3, "ok": True}
        assert json.loads(next(lines))["event"] == "done"
        assert actor.wait(timeout=60) == 0
        # no pinned host staging, no thread: the slot on the device is the staging buffer
        assert pub._stages == [] and pub._thread is None and ops.fences == 3
    finally:
        if actor is not None and actor.poll() is None:
            actor.kill()
            actor.wait()
        pub.close()


@pytest.mark.parametrize("flat", [False, True], ids=["by-tensor", "flat"])
def test_a_slot_is_stamped_only_after_its_fence_and_no_reader_takes_it_before(ops, flat):
    writer = _writer(ops)
    reader = IpcSlotsReader(ops, writer.name, 1.0)
    seen = []

    def at_fence():
        # the copy is queued, not yet known done: the slot still says "being written"
        seen.append(_read(reader, 2, slot, flat)[0])

    try:
        slot, _ = writer.write(1, _tensors(1))
        ops.on_fence = at_fence
        slot = (slot + 1) % writer.slots
        assert writer.write(2, _tensors(2))[0] == slot
        assert seen == ["stale"]
        result, dest = _read(reader, 2, slot, flat)
        assert result == "ok"
        assert torch.equal(dest["a"], _tensors(2)["a"]) and torch.equal(dest["b"], _tensors(2)["b"])
    finally:
        reader.close()
        writer.close()


def test_a_reader_accepts_only_the_version_a_slot_holds(ops):
    writer = _writer(ops, slots=2)
    reader = IpcSlotsReader(ops, writer.name, 1.0)
    try:
        first, _ = writer.write(1, _tensors(1))
        writer.write(2, _tensors(2))
        # the ring wraps: version 3 goes where 1 was
        assert writer.write(3, _tensors(3))[0] == first
        assert reader.read_into(1, first, LAYOUT, PAIRS, _dest()) == "stale"
        assert reader.lease(1, first, LAYOUT) is None
        views = reader.lease(3, first, LAYOUT)
        assert torch.equal(views["a"], _tensors(3)["a"]) and reader.release()
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("flat", [False, True], ids=["by-tensor", "flat"])
def test_bytes_that_do_not_match_their_checksums_are_a_torn_read(ops, flat):
    writer = _writer(ops)
    reader = IpcSlotsReader(ops, writer.name, 1.0)
    try:
        slot, _ = writer.write(1, _tensors(1))
        # a writer's bytes not yet visible to the reader (a weakly ordered copy), stamps already set
        writer._views[slot]["b"][0, 0] += 1
        assert _read(reader, 1, slot, flat)[0] == "torn"
        assert reader.lease(1, slot, LAYOUT) is None
    finally:
        reader.close()
        writer.close()


def test_a_lease_held_past_its_timeout_is_written_over_and_the_read_refused(ops):
    writer = _writer(ops, slots=2, lease_s=0.05)
    reader = IpcSlotsReader(ops, writer.name, 0.05)
    try:
        old, _ = writer.write(1, _tensors(1))
        writer.write(2, _tensors(2))
        # a reader frozen while it copies version 1: its lease runs out, the writer goes on
        assert reader.hold(1, old)
        start = time.monotonic()
        assert writer.write(3, _tensors(3))[0] == old and time.monotonic() - start >= 0.05
        assert not reader.release()
    finally:
        reader.close()
        writer.close()


def test_the_staging_copy_is_one_buffer_until_an_engine_swaps_it_in_then_tensor_by_tensor(
    redis_cfg, ws, ops
):
    pub = Publisher.from_config(ws, redis_cfg.broker, redis_cfg.run)
    template = engine_template(HIDDEN, LAYERS)
    sub = Subscriber.from_config(ws, redis_cfg.broker, redis_cfg.run, "a0", template).start()

    def staged(version: int) -> dict[str, torch.Tensor]:
        pub.publish(version, learner_tensors(version, HIDDEN, LAYERS))
        _wait(lambda: sub.staged_version == version)
        got, tensors = sub.take_staged()
        assert got == version and check(version, tensors, HIDDEN, LAYERS)
        return tensors

    try:
        tensors = staged(1)
        flat = sub.flat
        assert flat is not None
        assert all(t.untyped_storage().data_ptr() == flat.data_ptr() for t in tensors.values())
        # copied in place (CUDA graphs): the same tensors come back, still one buffer
        sub.applied(1, recycled=tensors)
        staged(2)
        assert sub.flat is flat
        # swapped in: the engine's old parameters are the staging copy from now on
        sub.applied(2, recycled={name: t.clone() for name, t in tensors.items()})
        assert sub.flat is None
        tensors = staged(3)
        assert all(t.untyped_storage().data_ptr() != flat.data_ptr() for t in tensors.values())
        sub.applied(3, recycled=tensors)
    finally:
        sub.close()
        pub.close()


def test_an_actor_keeps_its_weights_when_the_publisher_is_gone(redis_cfg, ws, ops):
    pub = Publisher.from_config(ws, redis_cfg.broker, redis_cfg.run)
    pub.publish(1, learner_tensors(1, HIDDEN, LAYERS))
    pub.close()
    sub = Subscriber.from_config(
        ws, redis_cfg.broker, redis_cfg.run, "a0", engine_template(HIDDEN, LAYERS)
    )
    try:
        sub.start()
        _wait(lambda: sub.failures.get("segment_gone"))
        assert sub.version == 0 and sub.staged_version is None
        assert "publisher exited" in sub.last_error
    finally:
        sub.close()


def test_a_handle_that_cannot_be_opened_skips_the_version_with_the_reason(
    redis_cfg, ws, ops, tmp_path
):
    pub = Publisher.from_config(ws, redis_cfg.broker, redis_cfg.run)
    sub = None
    try:
        pub.publish(1, learner_tensors(1, HIDDEN, LAYERS))
        template = engine_template(HIDDEN, LAYERS)
        sub = Subscriber.from_config(ws, redis_cfg.broker, redis_cfg.run, "a0", template)
        # this actor sees another GPU than the learner's
        sub._receiver = CudaIpcReceiver(FileIpc(tmp_path, uuid="other-gpu"), ws.timeout_s)
        sub.start()
        _wait(lambda: sub.failures.get("ipc_open"))
        time.sleep(0.2)
        assert sub.failures == {"ipc_open": 1}, "the version is skipped, not retried"
        assert "not visible" in sub.last_error and sub.version == 0
        # the next version is tried again: here with a stand-in that sees the learner's GPU
        sub._receiver.ops = ops
        pub.publish(2, learner_tensors(2, HIDDEN, LAYERS))
        _wait(lambda: sub.staged_version == 2)
        assert check(2, sub.take_staged()[1], HIDDEN, LAYERS)
    finally:
        if sub is not None:
            sub.close()
        pub.close()


def test_a_segment_that_is_not_a_control_segment_of_ours_is_refused(ops):
    shm = ShmWriter(f"ipc-{uuid.uuid4().hex[:8]}", LAYOUT, 2, 1.0)
    writer = _writer(ops)
    try:
        with pytest.raises(ValueError, match="no streamrl header of kind 1"):
            IpcSlotsReader(ops, shm.name, 1.0)
        # handle fields that are not exactly ours (here: one field more) are refused unread
        w = writer._map.words
        start, length = int(w[6]), int(w[7])
        blob = writer.body[start : start + length].numpy().tobytes()
        fields = msgpack.unpackb(blob)
        fields[0]["extra"] = 1
        forged = msgpack.packb(fields)
        writer.body[start : start + len(forged)].copy_(
            torch.frombuffer(bytearray(forged), dtype=torch.uint8)
        )
        w[7] = len(forged)
        with pytest.raises(ValueError, match="slot handle fields"):
            IpcSlotsReader(ops, writer.name, 1.0)
    finally:
        shm.close()
        writer.close()


def test_a_segment_of_another_user_is_refused(ops):
    if os.geteuid() != 0:
        pytest.skip("needs root to create a file as another user")
    # a name of the writer's form (any other is refused before anything is opened)
    name = segment_name(f"ipc-{uuid.uuid4().hex[:8]}", "", 1, uuid.uuid4().hex)
    path = SHM_DIR / name
    path.write_bytes(b"\0" * 8192)
    os.chown(path, 12345, 12345)
    try:
        with pytest.raises(ValueError, match="not a file of this user"):
            IpcSlotsReader(ops, name, 1.0)
    finally:
        path.unlink()


def test_inspect_shows_the_readers_copying(ops):
    writer = _writer(ops)
    reader = IpcSlotsReader(ops, writer.name, 5.0)
    try:
        slot, _ = writer.write(4, _tensors(4))
        assert reader.lease(4, slot, LAYOUT) is not None
        shown = transports.get("cuda_ipc").describe({"segment": writer.name})
        assert [(r["slot"], r["version"], r["pid"]) for r in shown["readers_copying"]] == [
            (slot, 4, os.getpid())
        ]
    finally:
        reader.close()
        writer.close()
    assert transports.get("cuda_ipc").describe({"segment": writer.name}) == {
        "readers_copying": "segment gone (publisher exited)"
    }


def test_without_the_learners_gpu_visible_the_production_class_names_the_reason():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    with pytest.raises(DeviceNotVisible, match="CUDA_VISIBLE_DEVICES"):
        CudaIpc().open({"uuid": "GPU-0000"})
    with pytest.raises(ValueError, match="on cpu"):
        CudaIpc().allocate(8, CPU)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({}, "actor.device=cpu for the hf engine"),
        (
            {"actor": {"device": "cuda"}, "weightsync": {"dist": {"relay": True}}},
            "weightsync.dist.relay=True is set, but weightsync.transport=cuda_ipc does not read it",
        ),
    ],
)
def test_configs_cuda_ipc_cannot_serve_are_refused_at_load_naming_the_key(overrides, message):
    raw = {"weightsync": {"transport": "cuda_ipc", **overrides.pop("weightsync", {})}, **overrides}
    with pytest.raises(ValueError, match=message):
        Config.model_validate(raw)
    ok = Config.model_validate(
        {"weightsync": {"transport": "cuda_ipc"}, "actor": {"device": "cuda:0", "gpus": "share"}}
    )
    assert ok.weightsync.transport == "cuda_ipc"


def test_an_actors_host_cannot_take_weights_from_the_learners_gpu():
    from streamrl.launch.placement import PlacementError, check_launcher

    cfg = Config.model_validate(
        {"weightsync": {"transport": "cuda_ipc"}, "actor": {"device": "cuda"}}
    )
    with pytest.raises(PlacementError, match="learner does not run here"):
        check_launcher(cfg, [], learner_here=False)
    check_launcher(cfg, [], learner_here=True)


def test_a_vllm_actor_takes_cuda_ipc_versions_through_the_streamrl_cuda_ipc_backend(tmp_path):
    from streamrl.actors.engines.vllm import (
        engine_args,
        make_sender,
        weight_transfer_backend,
    )
    from streamrl.configs.schema import ActorConfig, ModelConfig

    backend = weight_transfer_backend("cuda_ipc", 1)
    assert backend == "streamrl_cuda_ipc" and make_sender(backend, ActorConfig()) is None
    args = engine_args(ModelConfig(path=str(tmp_path)), ActorConfig(engine="vllm"), backend)
    assert args["weight_transfer_config"] == {"backend": "streamrl_cuda_ipc"}
