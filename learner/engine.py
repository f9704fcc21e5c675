"""The DeepSpeed ZeRO engine around the policy: process group, config, optimizer, log-probs.

CPU: gloo, fp32, torch AdamW as client optimizer (DeepSpeed's fused/CPU Adam
compile for 100+ s here). GPU: NCCL and bf16. The number of micro-batches of
a step varies with the token budget, so gradient accumulation is set per step
(``set_micro_batches``); each micro-batch is ``backward`` + ``step`` and the
last one is the accumulation boundary.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
from torch import Tensor

from streamrl.broker.server import free_port
from streamrl.configs.schema import LearnerConfig
from streamrl.learner.batching import MicroBatch
from streamrl.weightsync.policy import sequence_logprobs

DIST_TIMEOUT = timedelta(minutes=30)


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
            torch.distributed.init_process_group(
                backend,
                store=torch.distributed.HashStore(),
                rank=0,
                world_size=1,
                timeout=DIST_TIMEOUT,
            )
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(
            dist_backend=backend, auto_mpi_discovery=False, timeout=DIST_TIMEOUT, verbose=False
        )
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def device() -> torch.device:
    if accelerator() == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


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


def build_engine(lc: LearnerConfig, model: torch.nn.Module, world_size: int):
    """``deepspeed.initialize`` with torch AdamW and a linear warmup; returns the engine."""
    # deepspeed.initialize creates the process group itself when nobody did
    skip_shm_comm_build()
    import deepspeed

    bf16 = next(model.parameters()).dtype == torch.bfloat16
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=lc.lr, betas=tuple(lc.betas), weight_decay=lc.weight_decay
    )
    warmup = lc.warmup_steps
    # lr_k = lr * min(1, (k + 1) / warmup)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min(1.0, (k + 1) / warmup) if warmup else 1.0
    )
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        optimizer=optimizer,
        lr_scheduler=scheduler,
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


def token_logprobs(
    model, batch: MicroBatch, temperature: float, with_entropy: bool = False
) -> Tensor | tuple[Tensor, Tensor]:
    """``weightsync.policy.sequence_logprobs`` of a micro-batch: [B, L - 1] (and the entropy)."""
    return sequence_logprobs(
        model, batch.input_ids, batch.attention_mask, temperature, with_entropy
    )
