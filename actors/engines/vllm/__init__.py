"""The vLLM engine and everything vLLM-specific about how weights reach it.

- ``engine``: ``VLLMEngine``, a thin adapter around vLLM's AsyncLLM (GPU, or the CPU build):
  its arguments, generation, and the task that pushes each new version in;
- ``outputs``: sampling arguments in, our ``Output`` (behaviour log-probs, per-token versions) out;
- ``push``: vLLM's weight-transfer protocol driven from the actor (pause, start, update per step,
  finish with the version label, resume; a failed push restores a complete version);
- ``senders``: the actor's side of vLLM's ``ipc`` and ``nccl`` backends (a staged set in buckets);
- ``shm_backend``, ``cuda_ipc_backend``: the worker side of our ``streamrl_shm`` and
  ``streamrl_cuda_ipc`` backends (import vLLM; run in vLLM's workers), whose workers load an
  announced slot of the ``shm`` or ``cuda_ipc`` transport in place;
- ``plugin``: registers those two in every vLLM process (``vllm.general_plugins``).

This module is the engine's declaration for the registry (``VLLM``, its ``Options``) and how one is
built from the config (``VLLM.from_config``: the engine arguments, the weight-transfer backend and
the actor's side of it); the engine itself takes plain values and knows no config. It imports
nothing heavy: vLLM itself is imported only where an engine is built or a worker loads weights.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from typing import TYPE_CHECKING

from pydantic import Field

from streamrl.actors.engines.spec import EngineSpec, EngineUnavailable
from streamrl.actors.engines.vllm.plugin import IPC_BACKEND, SHM_BACKEND, SLOT_BACKENDS
from streamrl.configs.section import Section
from streamrl.weightsync import transports

if TYPE_CHECKING:
    from streamrl.actors.engines.base import EngineParts
    from streamrl.actors.engines.vllm.engine import VLLMEngine
    from streamrl.actors.engines.vllm.senders import BucketSender
    from streamrl.configs.actor import ActorConfig
    from streamrl.configs.model import ModelConfig


class Options(Section):
    """vLLM's engine (``actor.vllm``)."""

    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="Fraction of GPU memory for weights and KV cache."
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="Tensor parallel degree of one actor: the GPUs it takes (actor.gpus hands them out in groups of this many).",
    )
    bucket_bytes: int = Field(
        64 << 20,
        ge=1 << 16,
        description="Bucket size of the versions the actor pushes into its engine over vLLM's own ipc and nccl weight-transfer backends (a version staged by the actor's subscriber, or LoRA adapters).",
    )


class VLLM(EngineSpec):
    name = "vllm"
    summary = "vllm (vLLM on GPUs, or its CPU build: make .venv-vllm)"
    options = Options
    computes_on = "gpu"
    places_own_threads = True

    @classmethod
    def gpus_per_actor(cls, options: Options) -> int:
        return options.tensor_parallel_size

    @classmethod
    def check_installed(cls) -> None:
        # find_spec, not an import: importing vLLM takes ~10 s
        if importlib.util.find_spec("vllm") is None:
            raise EngineUnavailable(
                f"a vLLM actor needs vLLM in this interpreter ({sys.executable}): `make run` "
                "switches to .venv-vllm when ARGS name vllm; or pip install 'streamrl[vllm]'"
            )

    @classmethod
    def from_config(
        cls, parts: EngineParts, *, model: ModelConfig, actor: ActorConfig
    ) -> VLLMEngine:
        """The engine of ``model.path`` taking weights the way the transport allows: its workers read
        each announced shm slot themselves; over ``dist`` a subscriber stages each version on
        ``actor.device`` and it is pushed in; adapter versions are loaded as new LoRA adapters."""
        from streamrl.actors.engines.vllm.engine import VLLMEngine
        from streamrl.actors.engines.vllm.senders import IPCSender
        from streamrl.policy.load import parameter_template

        gpu = on_gpu()
        feed = parts.feed
        transport = feed.transport if feed is not None else None
        if not gpu:
            _cpu_build_defaults()
        if model.lora.adapter_versions:
            return cls._with_adapters(parts, model, actor, gpu)
        if (
            not gpu
            and transport is not None
            and transport.publishes
            and not transport.shared_memory
        ):
            raise ValueError(
                f"weightsync.transport={transport.name}: the vLLM CPU build takes weights "
                "over shm only (its ipc and nccl backends need CUDA)"
            )
        backend = None
        announcements = sender = subscriber = None
        if transport is not None and transport.publishes:
            backend = weight_transfer_backend(transport.name, actor.vllm.tensor_parallel_size)
            if backend in SLOT_BACKENDS:
                announcements = feed.announcements()
            else:
                subscriber = feed.subscriber(
                    parameter_template(model.path, model.dtype, actor.device)
                )
                sender = make_sender(backend, actor)
        with insecure_serialization(isinstance(sender, IPCSender)):
            engine = VLLMEngine(
                engine_args(model, actor, backend, parts.seed, gpu=gpu),
                parts.seed,
                weight_source=subscriber,
                sender=sender,
                announcements=announcements,
                **_transfer_limits(feed, actor),
            )
        engine.start_receiving(subscriber)
        return engine

    @classmethod
    def _with_adapters(
        cls, parts: EngineParts, model: ModelConfig, actor: ActorConfig, gpu: bool
    ) -> VLLMEngine:
        """``model.lora.sync: adapter``: a subscriber stages each version's adapters (over any
        transport) and the engine loads them as a new LoRA adapter (``policy.lora.AdapterVersions``)."""
        from streamrl.actors.engines.vllm.engine import VLLMEngine, import_vllm
        from streamrl.policy.lora import AdapterVersions, adapter_template

        dtype = torch_dtype(model, gpu)
        template, config = adapter_template(model.path, model.lora, dtype, actor.device)
        subscriber = parts.feed.subscriber(template) if parts.feed is not None else None
        api = import_vllm()
        engine = VLLMEngine(
            engine_args(model, actor, None, parts.seed, gpu=gpu),
            parts.seed,
            weight_source=subscriber,
            adapters=AdapterVersions(config, api.LoRARequest),
            **_transfer_limits(parts.feed, actor),
        )
        engine.start_receiving(subscriber)
        return engine


def _cpu_build_defaults() -> None:
    """Settings the vLLM CPU build needs on a host it shares with the learner and other actors."""
    # GiB of KV cache. Unset, the CPU build asks for gpu_memory_utilization (0.85) of the host's
    # RAM and refuses to start when that much is not free.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # vLLM's default ("auto") gives its worker its own OpenMP thread count and pins the threads to
    # cores it picks (one core of two held back for the engine core), whatever OMP_NUM_THREADS
    # says: every vLLM actor would be pinned to the same core. nobind keeps the process's threads
    # and leaves placement to the OS.
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def weight_transfer_backend(transport: str, tensor_parallel_size: int) -> str:
    """The vLLM weight-transfer backend between this actor process and its own engine's workers.

    ``shm``: ``streamrl_shm``, the workers read the learner's published slot
    themselves (CPU and GPU). ``cuda_ipc``: ``streamrl_cuda_ipc``, the workers open the
    learner's GPU slots by CUDA IPC handle and load from them in place. ``dist`` moves the weights the subscriber staged
    on ``actor.device`` into the engine: one GPU (``tensor_parallel_size=1``)
    ``ipc``, the staged tensors and the engine share it (NCCL cannot put two
    ranks on one GPU); tensor parallel ``nccl``, a broadcast to every worker,
    so ``actor.device`` must then be a GPU the engine does not use.
    """
    if transports.get(transport).device_ipc:
        return IPC_BACKEND
    if transports.get(transport).shared_memory:
        return SHM_BACKEND
    return "ipc" if tensor_parallel_size == 1 else "nccl"


def torch_dtype(model: ModelConfig, gpu: bool):
    """The dtype the engine computes in: ``model.dtype`` on a GPU or on the CPU build."""
    from streamrl.policy.load import resolve_dtype

    return resolve_dtype(model.dtype, "cuda" if gpu else "cpu")


def engine_args(
    model: ModelConfig, actor: ActorConfig, backend: str | None, seed: int = 0, gpu: bool = True
) -> dict:
    """AsyncEngineArgs keyword arguments for the actor's vLLM engine (``gpu=False``: the CPU build);
    ``backend`` is its ``weight_transfer_backend`` (None: no weight transfer, the versions are LoRA
    adapters). A hub id ``model.path`` (``org/name[@revision]``) becomes the snapshot folder the
    learner loads too (``model_folder``): vLLM has no ``@revision`` form (it takes ``revision``
    apart) and would look up a repository named ``name@revision``; a folder also keeps learner and
    actors on the same files, offline included."""
    from streamrl.policy.load import model_folder
    from streamrl.policy.lora import MAX_LORAS, vllm_max_rank

    dtype = str(torch_dtype(model, gpu)).removeprefix("torch.")
    args = {
        "model": model_folder(model.path),
        "dtype": dtype,
        "gpu_memory_utilization": actor.vllm.gpu_memory_utilization,
        "tensor_parallel_size": actor.vllm.tensor_parallel_size,
        "max_num_seqs": actor.batch_slots,
        "logprobs_mode": "processed_logprobs",
        "seed": seed,
        # the G completions of a group share their prompt
        "enable_prefix_caching": True,
        # model.init_kwargs: the one from_pretrained argument vLLM takes alike (its attention is its own)
        "trust_remote_code": model.init_kwargs.get("trust_remote_code", False),
    }
    if backend is not None:
        # a WeightTransferConfig(**this) when the engine is built
        args["weight_transfer_config"] = {"backend": backend}
    if model.lora.enabled and model.lora.sync == "adapter":
        # each version is a LoRA adapter (policy.lora.AdapterVersions)
        args.update(
            enable_lora=True,
            max_lora_rank=vllm_max_rank(model.lora.rank),
            max_loras=MAX_LORAS,
            max_cpu_loras=MAX_LORAS + 1,
        )
    if not gpu:
        # torch.compile roughly doubles the CPU build's start-up: AsyncLLM on the demo policy started
        # in 24-42 s eager and in 45-57 s compiled, measured by hand on 2 cores
        args["enforce_eager"] = True
    return args


def make_sender(backend: str, actor: ActorConfig) -> BucketSender | None:
    """This process's side of ``backend`` (a ``weight_transfer_backend``; None: the workers read shm
    themselves)."""
    from streamrl.actors.engines.vllm.senders import IPCSender, NCCLSender

    if backend in SLOT_BACKENDS:
        return None
    if backend == "ipc":
        return IPCSender()
    return NCCLSender(world_size=1 + actor.vllm.tensor_parallel_size, device=actor.device)


INSECURE_SERIALIZATION = "VLLM_ALLOW_INSECURE_SERIALIZATION"


@contextlib.contextmanager
def insecure_serialization(wanted: bool):
    """``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` while vLLM's processes start, when ``wanted``.

    The ipc backend needs it: vLLM's workers unpickle the CUDA IPC handles of the tensors this
    actor stages (docs.vllm.ai/en/latest/training/weight_transfer/ipc/), and they read it from the
    environment they start with. Set only around the engine's start and taken back after, so the
    processes this actor starts later (reward sandboxes, agents) never inherit it; no other
    backend sets it (nccl meets through an NCCL unique id, ``senders.NCCLSender``).
    """
    before = os.environ.get(INSECURE_SERIALIZATION)
    if wanted:
        os.environ[INSECURE_SERIALIZATION] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(INSECURE_SERIALIZATION, None)
        else:
            os.environ[INSECURE_SERIALIZATION] = before


def _transfer_limits(feed, actor: ActorConfig) -> dict:
    """``actor.vllm.bucket_bytes`` and the feed's ``weightsync.timeout_s`` (no feed: the engine's
    defaults)."""
    if feed is None:
        return {}
    return {"bucket_bytes": actor.vllm.bucket_bytes, "timeout_s": feed.ws.timeout_s}
