"""The DeepSpeed ZeRO engine around the policy: process group, config, optimizer, log-probs.

CPU: gloo, fp32, torch AdamW as client optimizer (DeepSpeed's fused/CPU Adam
compile for 100+ s here). GPU: NCCL and bf16 (``model.dtype``); the log-prob and
loss math runs in fp32 whatever the weights (``sequence_logprobs`` upcasts the
logits), and ZeRO keeps fp32 master weights and Adam moments. With
``learner.offload_optimizer`` on a GPU the optimizer is DeepSpeedCPUAdam (see
``make_optimizer``). The number of micro-batches of
a step varies with the token budget, so gradient accumulation is set per step
(``set_micro_batches``); each micro-batch is ``backward`` + ``step`` and the
last one is the accumulation boundary.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from datetime import timedelta

import torch
from torch import Tensor

from streamrl.broker.server import free_port
from streamrl.configs.schema import LearnerConfig
from streamrl.learner import nodes
from streamrl.learner.batching import MicroBatch
from streamrl.policy import packed_attention
from streamrl.policy.logprobs import DEFAULT_CHUNK_TOKENS, Sampling, sequence_logprobs
from streamrl.policy.lora import trainable_parameters

DIST_TIMEOUT = timedelta(minutes=30)
# the loopback interface (Linux)
LOOPBACK_IFNAME = "lo"


def accelerator() -> str:
    """``cuda`` or ``cpu``: DeepSpeed's accelerator, the learner's device and its backend follow it.

    ``DS_ACCELERATOR`` decides when set (``cpu`` keeps a GPU host's learner on the CPU); else it is
    set here, before DeepSpeed is imported, to what DeepSpeed's own detection would pick, so that
    detection (and its "unable to detect" warning on CPU) never runs and nothing disagrees with it.
    """
    return os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")


def skip_shm_comm_build() -> None:
    """Keep DeepSpeed from compiling its shm all-reduce op (C++, ~90 s on CPU, on every fresh venv).

    ``deepspeed.init_distributed`` builds it when it creates its torch backend, before
    ``deepspeed.initialize``; the op serves only inference all-reduce, which the learner never runs.
    Must run before the first ``init_distributed`` of the process.
    """
    accelerator()
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def defer_muon_compile() -> None:
    """Import DeepSpeed's Muon module with its ``torch.compile`` deferred to each function's first call.

    ``deepspeed.initialize`` and ZeRO-2's gradient reduction import it whatever the optimizer, and
    its functions are decorated with ``torch.compile`` at import: ~1.1 CPU-s of TorchDynamo set-up
    at every learner start (docs/startup.md), for code an AdamW learner never calls. The module
    cannot be left out (the reduction imports it with no fallback), so it is imported here once,
    each function compiled when first called, as it would have been. A DeepSpeed without the
    module is left alone.
    """
    import functools
    import importlib
    import importlib.util
    import sys

    name = "deepspeed.runtime.zero.muon.original_muon"
    if name in sys.modules or importlib.util.find_spec("deepspeed.runtime.zero.muon") is None:
        return
    from deepspeed.runtime import compiler

    def deferred(*args, **kwargs):
        def wrap(fn):
            compiled = None

            @functools.wraps(fn)
            def call(*a, **k):
                nonlocal compiled
                if compiled is None:
                    compiled = torch.compile(fn, *args, **kwargs)
                return compiled(*a, **k)

            return call

        return wrap

    eager = compiler.compile
    compiler.compile = deferred
    try:
        importlib.import_module(name)
    finally:
        compiler.compile = eager


@contextlib.contextmanager
def _gloo_on_loopback():
    """GLOO_SOCKET_IFNAME=lo while the default group is made (a value the user set is kept),
    restored after, so the dist weight transport's own gloo devices are unaffected."""
    saved = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ["GLOO_SOCKET_IFNAME"] = saved or LOOPBACK_IFNAME
    try:
        yield
    finally:
        if saved is None:
            del os.environ["GLOO_SOCKET_IFNAME"]


def init_distributed() -> tuple[int, int]:
    """Join (or, for plain ``python -m streamrl.learner``, create) the process group; returns (rank, world size).

    torchrun/deepspeed launchers set RANK etc.; without them DeepSpeed would go
    looking for MPI, so a single process fills in a world of one.
    """
    skip_shm_comm_build()
    import deepspeed

    backend = "nccl" if accelerator() == "cuda" else "gloo"
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        if not torch.distributed.is_initialized():
            # A world of one needs no rendezvous: env:// would host a TCPStore on every interface.
            # gloo still opens a pair listener, on the address the host's name resolves to (a
            # LAN address on many hosts) unless told an interface: loopback, for this process only.
            with _gloo_on_loopback():
                torch.distributed.init_process_group(
                    backend,
                    store=torch.distributed.HashStore(),
                    rank=0,
                    world_size=1,
                    timeout=DIST_TIMEOUT,
                )
    if not torch.distributed.is_initialized() and nodes.several_nodes():
        # static rendezvous keeps one store across restarts: fresh keys per incarnation
        nodes.init_process_group(backend, DIST_TIMEOUT)
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(
            dist_backend=backend, auto_mpi_discovery=False, timeout=DIST_TIMEOUT, verbose=False
        )
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def device() -> torch.device:
    if accelerator() == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def sum_over_ranks(values: Tensor) -> Tensor:
    """``values`` summed over every rank (the same tensor in a world of one): a step's figures,
    which each rank holds its share of."""
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        # NCCL reduces only tensors on the rank's GPU
        if torch.distributed.get_backend() == "nccl":
            values = values.to(torch.device("cuda", torch.cuda.current_device()))
        torch.distributed.all_reduce(values)
    return values


def deepspeed_config(lc: LearnerConfig, world_size: int, bf16: bool) -> dict:
    zero: dict = {"stage": lc.zero_stage, "overlap_comm": False, "contiguous_gradients": True}
    if lc.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": accelerator() == "cuda"}
    return {
        # micro-batch "size" 1 is bookkeeping only: micro-batches are token-budgeted, their count set per step
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "train_batch_size": world_size,
        "gradient_clipping": lc.grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": bf16},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def make_optimizer(lc: LearnerConfig, params, on_gpu: bool | None = None) -> torch.optim.Optimizer:
    """AdamW over ``params``: DeepSpeedCPUAdam when ZeRO offloads the optimizer from a GPU (``on_gpu``,
    default: the accelerator is cuda), else torch's.

    DeepSpeed's PyPI wheel ships no prebuilt ops, so DeepSpeedCPUAdam JIT-builds its C++ op on first
    use (ninja and a C++ compiler; cached in TORCH_EXTENSIONS_DIR). Where that fails, torch AdamW
    steps the offloaded fp32 partition instead: the same update, several times slower on the CPU.
    A CPU learner never offloads anything that is not already on the CPU, so it keeps torch AdamW
    rather than pay the compile.
    """
    params = list(params)
    kwargs = {"lr": lc.lr, "betas": tuple(lc.betas), "weight_decay": lc.weight_decay}
    if on_gpu is None:
        on_gpu = accelerator() == "cuda"
    if lc.offload_optimizer and on_gpu:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        try:
            return DeepSpeedCPUAdam(params, adamw_mode=True, **kwargs)
        except RuntimeError as exc:
            warnings.warn(
                f"learner.offload_optimizer: DeepSpeedCPUAdam unavailable ({exc}: {exc.__cause__}); "
                "torch AdamW steps the offloaded state on the CPU, slower",
                stacklevel=2,
            )
    return torch.optim.AdamW(params, **kwargs)


def enable_gradient_checkpointing(model) -> None:
    """transformers' activation checkpointing per decoder layer, non-reentrant (the reentrant form
    gives the parameters no gradient unless a layer's input requires grad, and torch recommends
    against it). transformers 5.24 renamed the call; the vLLM venv's 5.19 has only the old name."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def lr_schedule(lc: LearnerConfig, optimizer: torch.optim.Optimizer, max_steps: int):
    """``learner.lr_scheduler`` after ``learner.warmup_steps`` (transformers' schedules, as TRL
    steps them), stepped once per optimizer step: ``max_steps`` learner steps (``run.max_steps``;
    0 = no horizon: the schema lets only constant and auto through, which then holds the LR after
    the warm-up) of minibatches x updates_per_batch each."""
    from transformers import get_scheduler

    total = max_steps * lc.minibatches * lc.updates_per_batch
    name = lc.lr_scheduler
    if name == "auto":
        name = "linear" if total > 0 else "constant"
    if name == "constant" and lc.warmup_steps:
        name = "constant_with_warmup"
    return get_scheduler(
        name, optimizer, num_warmup_steps=lc.warmup_steps, num_training_steps=total or None
    )


def build_engine(lc: LearnerConfig, model: torch.nn.Module, world_size: int, max_steps: int = 0):
    """``deepspeed.initialize`` with AdamW (``make_optimizer``) over the parameters that require grad
    (a LoRA policy's adapters: ZeRO-2 partitions only those) and ``lr_schedule`` over
    ``max_steps`` learner steps; returns the engine."""
    # deepspeed.initialize creates the process group itself when nobody did
    skip_shm_comm_build()
    defer_muon_compile()
    import deepspeed

    bf16 = next(model.parameters()).dtype == torch.bfloat16
    model.train()
    if packs_by_bounds(lc.packed_attention, model, accelerator() == "cuda"):
        packed_attention.use_varlen(model)
    if lc.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    optimizer = make_optimizer(lc, trainable_parameters(model))
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=lr_schedule(lc, optimizer, max_steps),
        config=deepspeed_config(lc, world_size, bf16),
    )
    return engine


def set_micro_batches(engine, count: int) -> None:
    """Make the next ``count`` backward/step pairs one optimizer step (call ``mark_micro_batch`` before each)."""
    engine.set_train_batch_size(count * engine.dp_world_size)


def mark_micro_batch(engine, index: int, count: int) -> None:
    """Set the accumulation boundary explicitly: DeepSpeed derives it from a running micro-step
    counter, which goes out of phase as soon as two steps have different micro-batch counts."""
    engine.set_gradient_accumulation_boundary(index == count - 1)


# transformers keeps packed samples apart through the mask it builds from their position ids
# (these implementations), or, for flash attention, through the position ids alone and only in
# a batch of one row; policy.packed_attention's function through the samples' bounds
MASKED_PACKING = ("sdpa", "eager", "flex_attention")


def packs_by_bounds(choice: str, model, on_cuda: bool) -> bool:
    """Whether ``learner.packed_attention`` (``choice``) switches this sdpa policy to
    ``policy.packed_attention``: varlen, or auto on a CUDA learner; any other implementation
    keeps its own way of packing."""
    if attention_implementation(model) != "sdpa":
        return False
    return choice == "varlen" or (choice == "auto" and on_cuda)


def attention_implementation(model) -> str:
    """The policy's attention implementation, through a DeepSpeed engine or a peft wrapper."""
    return getattr(model, "module", model).config._attn_implementation


def token_logprobs(
    model,
    batch: MicroBatch,
    sampling: Sampling | float,
    with_entropy: bool = False,
    entropy_grad: bool = True,
    one_row: bool | None = None,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> Tensor | tuple[Tensor, Tensor]:
    """``policy.logprobs.sequence_logprobs`` of a micro-batch's packed rows at its completion
    tokens under ``sampling`` (the run's temperature, top-k and top-p; a number: a temperature
    alone), in its sample layout: [B, L - 1], 0 outside the completions (and the entropy;
    ``entropy_grad``: with its gradient). The loss reads nothing else, so the output layer runs
    on the completion positions only, ``chunk_tokens`` of them at a time
    (``learner.logprob_chunk_tokens``).

    ``one_row`` runs the rows end to end as a single row, as flash attention needs; None picks
    it from the model's attention implementation, and refuses one that cannot keep packed
    samples apart. A policy on ``policy.packed_attention`` gets the samples' bounds.
    """
    attention = attention_implementation(model)
    by_bounds = attention == packed_attention.NAME
    if one_row is None:
        one_row = attention.startswith("flash_attention")
        if not (one_row or by_bounds) and attention not in MASKED_PACKING:
            raise ValueError(
                f"attention implementation {attention!r} cannot keep packed samples apart: "
                f"use one of {', '.join(MASKED_PACKING)} or flash_attention_*"
            )
    ids, positions = batch.packed_ids, batch.position_ids
    width = ids.shape[1]
    completions = batch.completion_mask
    # packed target t of row r predicts from input position r x width + t (one row or many)
    target = batch.packed_index[completions]
    out = sequence_logprobs(
        model,
        ids.reshape(1, -1) if one_row else ids,
        None,
        sampling,
        with_entropy,
        position_ids=positions.reshape(1, -1) if one_row else positions,
        entropy_grad=entropy_grad,
        keep=target + target // (width - 1),
        chunk_tokens=chunk_tokens,
        attention_kwargs=packed_attention.varlen_kwargs(positions) if by_bounds else None,
    )
    outs = out if with_entropy else (out,)
    mask = completions.to(outs[0].device)
    laid_out = tuple(t.new_zeros(mask.shape).masked_scatter(mask, t) for t in outs)
    return laid_out if with_entropy else laid_out[0]
