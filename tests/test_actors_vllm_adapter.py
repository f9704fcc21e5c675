"""The vLLM engine's parts that need no engine: arguments, output conversion, version spans, the missing-extra
error, the parameter template built from a checkpoint, the IPC and NCCL senders against vLLM's own parsing
(in .venv-vllm), and the orchestration of the staged (``dist``) weight path.

The staged path's backends, CUDA IPC and NCCL, need a GPU: its orchestration is tested against a
recording stand-in for AsyncLLM, the only stand-in left. The ``shm`` path, log-probs, pushes during
generation, failed pushes and a dead engine run against the real vLLM CPU build in
``test_actors_vllm_engine.py``."""

from __future__ import annotations

import importlib.util
import inspect
import os
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from prometheus_client import REGISTRY
from waiting import until

from streamrl.actors.engines.base import SamplingParams
from streamrl.actors.engines.vllm.engine import (
    INSECURE_SERIALIZATION,
    VLLMEngine,
    VLLMUnavailable,
    engine_args,
    insecure_serialization,
    make_sender,
    weight_transfer_backend,
)
from streamrl.actors.engines.vllm.outputs import sampling_kwargs, to_output
from streamrl.actors.engines.vllm.push import EngineFailed
from streamrl.actors.engines.vllm.senders import IPCSender, NCCLSender, staged_buckets
from streamrl.configs.schema import ActorConfig, ModelConfig
from streamrl.policy.load import load_policy, parameter_template
from streamrl.weightsync.naming import canonical_tensors, map_to_template
from streamrl.weightsync.publisher import Publisher
from streamrl.weightsync.subscriber import Subscriber

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None and not os.environ.get("STREAMRL_REQUIRE_VLLM"),
    reason="vLLM lives in .venv-vllm (make test-vllm)",
)


@dataclass
# the fields of vllm.logprobs.Logprob that the adapter reads
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
# the fields of vllm.outputs.CompletionOutput that the adapter reads
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None
    weight_versions: list | None = None


@dataclass
# what vLLM documents for CompletionOutput.weight_versions: label + token range
class WeightVersionSpan:
    version: str | None
    start: int
    end: int


def test_engine_args_ask_for_processed_logprobs_and_native_weight_transfer(tmp_path):
    model, actor = ModelConfig(path=str(tmp_path)), ActorConfig(engine="vllm", batch_slots=128)
    # the backend is the hop from this process to its own engine: one GPU shared -> CUDA IPC
    backend = weight_transfer_backend("dist", actor.tensor_parallel_size)
    assert backend == "ipc"
    args = engine_args(model, actor, backend, seed=7)
    assert args["logprobs_mode"] == "processed_logprobs"
    assert args["weight_transfer_config"] == {"backend": "ipc"}
    assert args["max_num_seqs"] == 128 and args["seed"] == 7 and args["model"] == model.path
    assert isinstance(make_sender(backend, actor), IPCSender)


def test_shm_runs_take_weights_through_the_streamrl_shm_backend_and_the_cpu_build_runs_eager(
    tmp_path,
):
    model, actor = ModelConfig(path=str(tmp_path)), ActorConfig(engine="vllm")
    backend = weight_transfer_backend("shm", actor.tensor_parallel_size)
    assert backend == "streamrl_shm" and make_sender(backend, actor) is None
    args = engine_args(model, actor, backend, gpu=False)
    assert args["weight_transfer_config"] == {"backend": "streamrl_shm"}
    # float32 like the learner on CPU (auto), no torch.compile on the CPU build
    assert args["dtype"] == "float32" and args["enforce_eager"] is True
    on_gpu = engine_args(model, actor, backend, gpu=True)
    assert on_gpu["dtype"] == "bfloat16" and "enforce_eager" not in on_gpu


def test_trust_remote_code_reaches_vllm_only_where_model_init_kwargs_set_it(tmp_path):
    actor = ActorConfig(engine="vllm")
    plain = engine_args(ModelConfig(path=str(tmp_path)), actor, None, gpu=False)
    assert plain["trust_remote_code"] is False
    trusted = ModelConfig(path=str(tmp_path), init_kwargs={"trust_remote_code": True})
    assert engine_args(trusted, actor, None, gpu=False)["trust_remote_code"] is True


def test_tensor_parallel_engines_take_weights_over_nccl_with_the_documented_init_info(tmp_path):
    actor = ActorConfig(engine="vllm", tensor_parallel_size=2, device="cuda:2")
    backend = weight_transfer_backend("dist", actor.tensor_parallel_size)
    assert engine_args(ModelConfig(path=str(tmp_path)), actor, backend)[
        "weight_transfer_config"
    ] == {"backend": "nccl"}
    sender = make_sender(backend, actor)
    assert isinstance(sender, NCCLSender)
    # this process and the two workers; the id is minted (libnccl, a GPU host) at the handshake
    assert sender.world_size == 3 and sender.unique_id is None


def test_sampling_kwargs_request_the_sampled_tokens_logprob_and_map_top_k_off():
    params = SamplingParams(
        max_new_tokens=9, temperature=0.7, top_p=0.9, top_k=0, stop_token_ids=(1,), stop=("###",)
    )
    kwargs = sampling_kwargs(params)
    assert kwargs["logprobs"] == 0 and kwargs["top_k"] == -1 and kwargs["max_tokens"] == 9
    assert (
        kwargs["stop"] == ["###"]
        and kwargs["stop_token_ids"] == [1]
        and kwargs["include_stop_str_in_output"]
    )
    assert sampling_kwargs(SamplingParams(top_k=20))["top_k"] == 20


def test_a_vllm_completion_converts_with_per_token_versions_from_spans():
    tokens = [5, 6, 7, 8, 1]
    logprobs = [{t: Logprob(-0.1 * (i + 1)), 99: Logprob(-9.0)} for i, t in enumerate(tokens)]
    spans = [WeightVersionSpan("3", 0, 3), WeightVersionSpan("4", 3, 5)]
    completion = CompletionOutput(0, "", tokens, -1.5, logprobs, "stop", weight_versions=spans)
    output = to_output("r0", completion, version_at_start=3)
    assert output.token_ids.tolist() == tokens and output.finish_reason == "stop"
    np.testing.assert_allclose(output.logprobs, [-0.1, -0.2, -0.3, -0.4, -0.5], rtol=1e-6)
    assert output.versions.tolist() == [3, 3, 3, 4, 4]


def test_tokens_before_the_first_version_label_get_the_version_at_start():
    logprobs = [{t: Logprob(-1.0)} for t in (5, 6, 7)]
    spans = [WeightVersionSpan(None, 0, 1), WeightVersionSpan("1", 1, 3)]
    completion = CompletionOutput(0, "", [5, 6, 7], None, logprobs, "length", spans)
    assert to_output("r", completion, version_at_start=0).versions.tolist() == [0, 1, 1]


def test_without_spans_tokens_get_the_version_the_request_started_under():
    completion = CompletionOutput(
        0, "", [5, 6], None, [{5: Logprob(-1.0)}, {6: Logprob(-2.0)}], "length"
    )
    assert to_output("r", completion, version_at_start=2).versions.tolist() == [2, 2]


def test_missing_logprobs_or_bad_spans_are_clear_errors():
    with pytest.raises(ValueError, match="logprobs=0"):
        to_output("r", CompletionOutput(0, "", [5], None, None, "stop"), 0)
    bad = CompletionOutput(
        0, "", [5, 6], None, [{5: Logprob(-1.0)}, {6: Logprob(-1.0)}], "stop", [(0, 2), (1, 1)]
    )
    with pytest.raises(ValueError, match="non-decreasing"):
        to_output("r", bad, 0)


@needs_vllm
def test_ipc_update_info_carries_the_rebuild_args_alone_and_parses_as_vllms(monkeypatch):
    from torch.multiprocessing.reductions import reduce_tensor
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferUpdateInfo

    staged = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4)}
    (bucket,) = staged_buckets(staged, 1 << 20)
    sender = IPCSender(device_uuid=lambda device: "GPU-test")
    info = sender.update_info(bucket, bucket.tensors(staged))
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    parsed = IPCWeightTransferUpdateInfo(**info)
    assert parsed.names == ["a", "b"] and parsed.shapes == [[2, 3], [4]]
    for handle, tensor in zip(parsed.ipc_handles, staged.values(), strict=True):
        args = handle["GPU-test"]
        # the worker indexes the args (args[6] = device index on CUDA): no (rebuild_fn, args) pair
        assert args[0] is torch.Tensor and len(args) == len(reduce_tensor(tensor)[1])


@needs_vllm
def test_nccl_sender_meets_the_workers_through_a_unique_id_and_no_tcp_store():
    """vLLM's workers parse the init info into the unique-id rendezvous: no TCPStore, whose
    contents they would unpickle, and no port announced before anything listens on it."""
    from vllm.distributed.weight_transfer import nccl_common

    # ncclGetUniqueId needs libnccl (a GPU host); its 128 bytes are opaque to everything here
    minted = [bytes(range(128)), bytes(range(128, 256))]
    sender = NCCLSender(world_size=3, device="cpu", mint=minted.pop)
    info = sender.init_info()
    assert info["rank_offset"] == 1 and info["world_size"] == 3
    parsed = nccl_common.NCCLWeightTransferInitInfo(**info)
    assert parsed.nccl_unique_id_bytes == sender.unique_id == bytes(range(128, 256))
    assert parsed.master_address is None and parsed.master_port is None
    # what vLLM sends on to its workers carries no TCP rendezvous either
    assert "master_port" not in nccl_common.worker_init_payload(parsed)
    # a new handshake (a restarted engine) gets a new id
    sender.init_info()
    assert sender.unique_id == bytes(range(128))
    inspect.signature(nccl_common.uid_init_process_group).bind(
        sender.unique_id, rank=0, world_size=3, device=0
    )
    # the old fallback called NCCLWeightTransferEngine.trainer_init, which vLLM does not have
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine

    assert not hasattr(NCCLWeightTransferEngine, "trainer_init")
    assert "NCCLWeightTransferEngine" not in inspect.getsource(NCCLSender.connect)


def test_the_insecure_serialization_flag_is_set_only_while_an_ipc_engine_starts(monkeypatch):
    monkeypatch.delenv(INSECURE_SERIALIZATION, raising=False)
    with insecure_serialization(True):
        assert os.environ[INSECURE_SERIALIZATION] == "1"
    assert INSECURE_SERIALIZATION not in os.environ
    with pytest.raises(RuntimeError), insecure_serialization(True):
        raise RuntimeError("the engine failed to start")
    assert INSECURE_SERIALIZATION not in os.environ
    with insecure_serialization(False):
        assert INSECURE_SERIALIZATION not in os.environ
    # an operator's own setting survives
    monkeypatch.setenv(INSECURE_SERIALIZATION, "0")
    with insecure_serialization(True):
        pass
    assert os.environ[INSECURE_SERIALIZATION] == "0"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_engine_names_the_extra_to_install():
    with pytest.raises(VLLMUnavailable, match=r"streamrl\[vllm\]"):
        VLLMEngine({"model": "x"})


# -- the parameter template of an engine without a transformers model --------------------------


def test_parameter_template_from_a_saved_checkpoint_matches_the_models_parameters(demo_policy):
    model = load_policy(demo_policy)
    template = parameter_template(demo_policy)
    params = dict(model.named_parameters())
    assert list(template) == list(params)
    assert all(
        template[n].shape == p.shape and template[n].dtype == p.dtype for n, p in params.items()
    )
    # placeholders: no weights loaded, one element per storage
    assert all(t.untyped_storage().nbytes() <= 4 for t in template.values())
    # the learner's published names (wrapped, tied lm_head as an alias) map onto it one to one
    tensors, aliases = canonical_tensors({"module." + n: p for n, p in params.items()})
    published = {name: tuple(t.shape) for name, t in tensors.items()}
    pairs = map_to_template(published, aliases, template)
    assert sorted(engine for engine, _ in pairs) == sorted(params)
    assert next(iter(parameter_template(demo_policy, "bfloat16").values())).dtype == torch.bfloat16


# -- the engine's weight task --------------------------------------------------------------------


class RecordingLLM:
    """Stands in for vLLM's AsyncLLM on the staged path, whose backends (CUDA IPC, NCCL) need a GPU.

    It only records the calls of the six async methods the weight path uses,
    with their arguments, into a shared log: it checks our orchestration of
    vLLM's weight-transfer protocol, not vLLM. ``fail_bucket = k`` makes the
    k-th ``update_weights`` of the next push raise (once).
    """

    def __init__(self, log: list) -> None:
        self.log = log
        self.fail_bucket: int | None = None
        self._bucket = 0

    async def init_weight_transfer_engine(self, request) -> None:
        self.log.append(("init", request.init_info))

    async def pause_generation(self, *, mode: str = "abort", clear_cache: bool = True) -> None:
        self.log.append(("pause", mode))

    async def start_weight_update(self) -> None:
        self._bucket = 0
        self.log.append(("start",))

    async def update_weights(self, request) -> None:
        self.log.append(("update", request.update_info))
        self._bucket += 1
        if self.fail_bucket == self._bucket - 1:
            self.fail_bucket = None
            raise RuntimeError("worker failed to load bucket")

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.log.append(("finish", weight_version))

    async def resume_generation(self) -> None:
        self.log.append(("resume",))

    def shutdown(self) -> None:
        pass


class RecordingSender:
    """This process's side of a backend: logs each bucket it sends, with a copy of the tensors."""

    def __init__(self, log: list, block: threading.Event | None = None) -> None:
        self.log = log
        self.block = block
        self.connected = False
        self.sent: list[dict[str, torch.Tensor]] = []

    def init_info(self) -> dict:
        return {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}

    def connect(self) -> None:
        self.connected = True

    def update_info(self, bucket, tensors) -> dict:
        return bucket.update_info()

    def send(self, bucket, tensors) -> None:
        if self.block is not None:
            self.block.wait(30)
        self.sent.append({s.name: t.clone() for s, t in zip(bucket.specs, tensors, strict=True)})
        self.log.append(("send", [s.name for s in bucket.specs]))

    def close(self) -> None:
        pass


class Recorded:
    """A real weightsync Subscriber whose applied/rejected calls are recorded."""

    def __init__(self, sub) -> None:
        self.sub = sub
        self.applied_versions: list[int] = []
        self.rejected_versions: list[int] = []

    def take_staged(self):
        return self.sub.take_staged()

    def applied(self, version, recycled=None) -> None:
        self.applied_versions.append(version)
        self.sub.applied(version, recycled)

    def rejected(self, version) -> None:
        self.rejected_versions.append(version)
        self.sub.rejected(version)


# several buckets for the ~2 MB demo policy
BUCKET_BYTES = 128 << 10


def _failures() -> float:
    value = REGISTRY.get_sample_value(
        "streamrl_weights_transfer_failures_total", {"reason": "engine_push"}
    )
    return value or 0.0


@pytest.fixture
def rig(redis_cfg, demo_policy):
    """Learner-side publisher (shm), the actor's real subscriber on the checkpoint's template, an engine."""
    cfg = redis_cfg.model_copy(
        update={"weightsync": redis_cfg.weightsync.model_copy(update={"transport": "shm"})}
    )
    params = dict(load_policy(demo_policy).named_parameters())
    pub = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
    sub = Subscriber.from_config(
        cfg.weightsync, cfg.broker, cfg.run, "vllm-actor", parameter_template(demo_policy)
    ).start()
    log: list = []
    state = {"engine": None}

    def versioned(version: int) -> dict[str, torch.Tensor]:
        return {n: p.detach() + version for n, p in params.items()}

    def publish(version: int) -> dict[str, torch.Tensor]:
        tensors = versioned(version)
        pub.publish(version, {"module." + n: t for n, t in tensors.items()})
        return tensors

    def engine(**kwargs) -> tuple[VLLMEngine, RecordingLLM, RecordingSender, Recorded]:
        llm, sender, source = RecordingLLM(log), RecordingSender(log, **kwargs), Recorded(sub)
        timeout_s = 1.0 if "block" in kwargs else 30.0
        state["engine"] = VLLMEngine.with_llm(
            llm,
            weight_source=source,
            sender=sender,
            bucket_bytes=BUCKET_BYTES,
            timeout_s=timeout_s,
            poll_s=0.01,
            sampling_params=SimpleNamespace,
            init_request=lambda info: SimpleNamespace(init_info=info),
            update_request=lambda info: SimpleNamespace(update_info=info),
        )
        return state["engine"], llm, sender, source

    rig = type("Rig", (), {})()
    rig.sub, rig.log, rig.publish, rig.engine = sub, log, publish, engine
    try:
        yield rig
    finally:
        if state["engine"] is not None:
            state["engine"].close()
        sub.close()
        pub.close()


def _pushes(log: list) -> list[list]:
    """The engine calls of each push, pause..resume, sends left out (they run alongside updates)."""
    calls = [c for c in log if c[0] not in ("send", "init")]
    pushes, current = [], None
    for call in calls:
        if call[0] == "pause":
            current = []
        current.append(call)
        if call[0] == "resume":
            pushes.append(current)
    return pushes


def test_a_staged_version_goes_through_the_protocol_bucket_by_bucket(rig):
    engine, _llm, sender, source = rig.engine()
    assert rig.log[0][0] == "init" and rig.log[0][1]["rank_offset"] == 1 and sender.connected
    for version in (1, 2):
        published = rig.publish(version)
        until(lambda v=version: engine.version == v)
        expected = [b.update_info() for b in staged_buckets(published, BUCKET_BYTES)]
        assert len(expected) > 1
        push = _pushes(rig.log)[-1]
        assert push == [
            ("pause", "keep"),
            ("start",),
            *[("update", info) for info in expected],
            ("finish", str(version)),
            ("resume",),
        ]
        # one send per bucket, with the staged values of this version, between start and finish
        sends = sender.sent[-len(expected) :]
        assert [list(s) for s in sends] == [info["names"] for info in expected]
        for bucket in sends:
            for name, tensor in bucket.items():
                assert torch.equal(tensor, published[name]), name
        start = max(i for i, c in enumerate(rig.log) if c[0] == "start")
        finish = max(i for i, c in enumerate(rig.log) if c[0] == "finish")
        sent_at = [i for i, c in enumerate(rig.log) if c[0] == "send" and start < i < finish]
        assert len(sent_at) == len(expected)
    assert source.applied_versions == [1, 2] and source.rejected_versions == []
    assert rig.sub.version == 2 and engine.push_failures == 0


def test_a_failed_bucket_is_followed_by_a_whole_second_push_before_generation_resumes(rig):
    engine, llm, _sender, source = rig.engine()
    llm.fail_bucket = 1
    failures = _failures()
    published = rig.publish(1)
    until(lambda: source.applied_versions == [1])
    push = _pushes(rig.log)[-1]
    buckets = len(staged_buckets(published, BUCKET_BYTES))
    # after start every layer is on meta: start again and push the complete staged version, whole
    assert [c[0] for c in push] == (
        ["pause", "start", "update", "update", "start"]
        + ["update"] * buckets
        + ["finish", "resume"]
    )
    assert push[-2] == ("finish", "1")
    assert engine.version == 1 and rig.sub.version == 1 and source.rejected_versions == []
    assert engine.push_failures == 1 and _failures() == failures + 1


def test_a_hanging_send_ends_the_engine_instead_of_leaving_its_rpc_blocking(rig):
    block = threading.Event()
    try:
        engine, _llm, _sender, _source = rig.engine(block=block)
        rig.publish(1)
        until(lambda: engine.failed is not None)
        # vLLM's update_weights would still be waiting for the data: every later call would queue
        # behind it, so the engine must not be used again; generation was still resumed
        assert isinstance(engine.failed, EngineFailed) and "update_weights" in str(engine.failed)
        assert _pushes(rig.log)[-1][-1] == ("resume",)
        assert engine.version == 0
        with pytest.raises(EngineFailed):
            engine.maybe_swap_weights()
        with pytest.raises(EngineFailed):
            engine.generate([], SamplingParams())
    finally:
        block.set()


def test_two_versions_staged_back_to_back_push_only_the_newest(rig):
    rig.publish(1)
    until(lambda: rig.sub.staged_version == 1)
    rig.publish(2)
    until(lambda: rig.sub.staged_version == 2)
    engine, _llm, _sender, source = rig.engine()
    until(lambda: engine.version == 2)
    # nothing else is pending
    time.sleep(0.1)
    assert source.applied_versions == [2]
    assert [c[1] for c in rig.log if c[0] == "finish"] == ["2"]


HUB_ID_CHILD = """
import json, sys
from streamrl.actors.engines.vllm.engine import engine_args
from streamrl.configs.schema import ActorConfig, ModelConfig
args = {
    path: engine_args(ModelConfig(path=path), ActorConfig(engine="vllm"), "streamrl_shm", gpu=False)
    for path in sys.argv[1:-1]
}
out = {path: a["model"] for path, a in args.items()}
if sys.argv[-1] != "none":
    import vllm
    # vLLM reads the architecture and the tokenizer's files from what it was given
    config = vllm.AsyncEngineArgs(**args[sys.argv[-1]]).create_model_config()
    out["architectures"] = config.architectures
print(json.dumps(out))
"""


def test_a_hub_id_with_a_revision_reaches_vllm_as_its_snapshot_folder(tmp_path, demo_policy):
    """``org/name@rev`` is the learner's snapshot folder (vLLM has no @revision form), offline."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from tests.hub_cache import REVISION, add_to_cache, hub_env

    snapshot = add_to_cache(tmp_path, "org/tiny-demo", Path(demo_policy))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(hub_env(tmp_path), PYTHONPATH=os.getcwd())
    pinned = f"org/tiny-demo@{REVISION}"
    paths = ["org/tiny-demo", pinned, demo_policy]
    with_vllm = importlib.util.find_spec("vllm") is not None
    done = subprocess.run(
        [sys.executable, "-c", HUB_ID_CHILD, *paths, pinned if with_vllm else "none"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["org/tiny-demo"] == got[pinned] == str(snapshot)
    assert got[demo_policy] == demo_policy
    if with_vllm:
        assert got["architectures"] == ["Qwen2ForCausalLM"]
