"""The optimizer state a new run starts from: a fresh AdamW, or the one its warm start left.

A policy builder that warms the policy with AdamW (supervised fine-tuning, the demo's format
warm start) saves that AdamW's state next to the weights with ``save``: ``optimizer.pt`` holds
``exp_avg`` and ``exp_avg_sq`` per trainable parameter name, the step count and the settings
the moments depend on (betas, eps, amsgrad), read back with ``weights_only``. With
``learner.init_optimizer: auto`` the learner of a run without a checkpoint (a resumed run's
checkpoint holds its own optimizer) loads them into its optimizer, each ZeRO-1/2 rank into the
fp32 partition it owns, when they fit it: the same parameter names and shapes, betas and eps, no
amsgrad. Otherwise it starts a fresh AdamW and says why. The learning rate and weight decay are
the learner's own: AdamW's moments do not depend on them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from streamrl.learner import checkpoint

log = logging.getLogger(__name__)

# vLLM loads every *.safetensors of a model folder as weights, and skips optimizer.pt
FILE = "optimizer.pt"
FORMAT = "streamrl-adamw-1"
MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class Moments:
    """A saved AdamW state: per parameter name, each of ``MOMENTS``, at optimizer step ``step``."""

    step: int
    betas: tuple[float, float]
    eps: float
    amsgrad: bool
    tensors: dict[str, dict[str, torch.Tensor]]


def trainable(model) -> dict[str, torch.nn.Parameter]:
    """The parameters the optimizer steps, by name (tied weights once)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def settings(optimizer) -> tuple[tuple[float, float], float, bool]:
    """(betas, eps, amsgrad) shared by every parameter group; ValueError when the groups differ."""
    settings = {
        (tuple(map(float, g["betas"])), float(g["eps"]), bool(g.get("amsgrad", False)))
        for g in optimizer.param_groups
    }
    if len(settings) != 1:
        raise ValueError(
            f"the optimizer's parameter groups differ in betas/eps/amsgrad: {settings}"
        )
    return settings.pop()


def save(folder: str | os.PathLike, model, optimizer: torch.optim.Optimizer) -> Path:
    """Write ``optimizer``'s AdamW state of ``model``'s trainable parameters to ``folder/FILE``.

    Every trainable parameter must have been stepped, all the same number of times.
    """
    betas, eps, amsgrad = settings(optimizer)
    moments: dict[str, dict[str, torch.Tensor]] = {key: {} for key in MOMENTS}
    steps = set()
    for name, param in trainable(model).items():
        state = optimizer.state.get(param)
        if not state or any(key not in state for key in MOMENTS):
            raise ValueError(f"parameter {name} has no AdamW state: save after a step")
        steps.add(int(state["step"]))
        for key in MOMENTS:
            moments[key][name] = state[key].detach().to("cpu", torch.float32).clone()
    if len(steps) != 1:
        raise ValueError(f"the parameters were stepped different numbers of times: {sorted(steps)}")
    return write(folder, steps.pop(), betas, eps, amsgrad, moments)


def write(
    folder: str | os.PathLike,
    step: int,
    betas: tuple[float, float],
    eps: float,
    amsgrad: bool,
    moments: dict[str, dict[str, torch.Tensor]],
) -> Path:
    """Write an AdamW state (``moments``: per moment of ``MOMENTS``, per parameter name, float32 on
    the CPU) at optimizer step ``step`` to ``folder/FILE``, atomically."""
    path = Path(folder) / FILE
    tmp = path.with_name(path.name + ".tmp")
    torch.save(
        {
            "format": FORMAT,
            "step": step,
            "betas": list(betas),
            "eps": eps,
            "amsgrad": amsgrad,
            **moments,
        },
        tmp,
    )
    os.replace(tmp, path)
    return path


def engine_moments(engine) -> tuple:
    """Collective: (step, betas, eps, amsgrad, moments by name) of the engine's AdamW, gathered
    from the ZeRO partitions, as ``write`` takes them."""
    optimizer = engine.optimizer
    base = base_optimizer(optimizer)
    betas, eps, amsgrad = settings(base)
    params = trainable(engine.module)
    moments: dict[str, dict[str, torch.Tensor]] = {key: {} for key in MOMENTS}
    if hasattr(optimizer, "single_partition_of_fp32_groups"):
        from deepspeed.utils import safe_get_full_optimizer_state

        step = int(base.state[optimizer.single_partition_of_fp32_groups[0]]["step"])
        for name, param in params.items():
            for key in MOMENTS:
                full = safe_get_full_optimizer_state(param, key)
                moments[key][name] = full.detach().to("cpu", torch.float32).clone()
    else:
        step = int(base.state[next(iter(params.values()))]["step"])
        for name, param in params.items():
            for key in MOMENTS:
                moments[key][name] = (
                    base.state[param][key].detach().to("cpu", torch.float32).clone()
                )
    return step, betas, eps, amsgrad, moments


def read(folder: str | os.PathLike) -> Moments | None:
    """The moments saved in ``folder`` (None: no ``FILE`` there); ValueError naming the file when
    it is not one ``save`` wrote. Only tensors and plain values are unpickled."""
    path = Path(folder) / FILE
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise ValueError(f"expected a dict of format {FORMAT!r}")
        names = set(saved["exp_avg"])
        if names != set(saved["exp_avg_sq"]):
            raise ValueError("exp_avg and exp_avg_sq name different parameters")
        tensors = {n: {key: saved[key][n] for key in MOMENTS} for n in names}
        if not all(isinstance(t, torch.Tensor) for m in tensors.values() for t in m.values()):
            raise ValueError("a moment is not a tensor")
        moments = Moments(
            step=int(saved["step"]),
            betas=tuple(float(b) for b in saved["betas"]),
            eps=float(saved["eps"]),
            amsgrad=bool(saved["amsgrad"]),
            tensors=tensors,
        )
    except Exception as exc:
        raise ValueError(f"{path}: not an AdamW state saved by streamrl ({exc})") from None
    if len(moments.betas) != 2 or moments.step < 1:
        raise ValueError(f"{path}: betas {moments.betas}, step {moments.step}")
    return moments


def mismatch(moments: Moments, params: dict[str, torch.Tensor], optimizer) -> str | None:
    """Why ``moments`` cannot continue ``optimizer`` over ``params`` (None: they can)."""
    betas, eps, amsgrad = settings(optimizer)
    if amsgrad or moments.amsgrad:
        return "amsgrad is not supported"
    if moments.betas != betas or moments.eps != eps:
        return (
            f"saved betas {moments.betas}, eps {moments.eps:g}; the learner's betas {betas}, "
            f"eps {eps:g}"
        )
    missing, extra = (
        sorted(set(params) - set(moments.tensors)),
        sorted(set(moments.tensors) - set(params)),
    )
    if missing or extra:
        return f"parameter names differ: not saved {missing[:3]}, not trained {extra[:3]}"
    for name, param in params.items():
        for key, value in moments.tensors[name].items():
            if value.shape != param.shape:
                return f"{key} of {name}: saved shape {tuple(value.shape)}, parameter {tuple(param.shape)}"
    return None


def _step_value(optimizer, step: int):
    """The step count as ``optimizer`` keeps it: torch's Adam(W) a float tensor, DeepSpeedCPUAdam an int."""
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        return torch.tensor(float(step), dtype=torch.float32)
    return step


def base_optimizer(engine_optimizer):
    """The AdamW under DeepSpeed's ZeRO-1/2 wrapper (or the optimizer itself, ZeRO stage 0)."""
    return getattr(engine_optimizer, "optimizer", engine_optimizer)


def supported(engine_optimizer) -> str | None:
    """Why ``install`` cannot fill this optimizer (None: it can)."""
    base = base_optimizer(engine_optimizer)
    if type(base).__name__ not in ("AdamW", "DeepSpeedCPUAdam"):
        return f"the learner's optimizer is {type(base).__name__}, not AdamW"
    partitioned = hasattr(engine_optimizer, "single_partition_of_fp32_groups")
    if base is not engine_optimizer and not partitioned:
        return f"the DeepSpeed optimizer {type(engine_optimizer).__name__} is not supported"
    return None


def install(engine_optimizer, params: dict[str, torch.nn.Parameter], moments: Moments) -> None:
    """Set the optimizer's state to ``moments`` before its first step (checked by ``mismatch``).

    Under ZeRO-1/2 each rank holds the AdamW state of its flat fp32 partition only: the state is
    created over those flat tensors, DeepSpeed links each parameter's fragment of it (as it does
    after its first step), and its ``safe_set_full_optimizer_state`` writes each parameter's share.
    """
    base = base_optimizer(engine_optimizer)
    flats = getattr(engine_optimizer, "single_partition_of_fp32_groups", None)
    if flats is None:
        for name, param in params.items():
            base.state[param] = {
                "step": _step_value(base, moments.step),
                **{
                    k: v.to(param.device, param.dtype).clone()
                    for k, v in moments.tensors[name].items()
                },
            }
        return
    from deepspeed.utils import safe_set_full_optimizer_state

    for flat in flats:
        base.state[flat] = {
            "step": _step_value(base, moments.step),
            **{key: torch.zeros_like(flat) for key in MOMENTS},
        }
    engine_optimizer._lazy_init_hp_params_optimizer_state()
    for name, param in params.items():
        for key, value in moments.tensors[name].items():
            safe_set_full_optimizer_state(param, value.to(param.device), key)


def start(engine, policy_folder: str | os.PathLike, mode: str) -> str:
    """``learner.init_optimizer`` for a run without a checkpoint: load the saved moments where
    ``mode`` is auto and they fit. Returns what the learner starts from, for its log."""
    if mode == "fresh":
        return "a fresh AdamW (learner.init_optimizer: fresh)"
    moments = read(policy_folder)
    if moments is None:
        return f"a fresh AdamW (no {FILE} next to the policy)"
    params = trainable(engine.module)
    reason = supported(engine.optimizer) or mismatch(
        moments, params, base_optimizer(engine.optimizer)
    )
    if reason:
        return f"a fresh AdamW: {FILE} does not fit the learner's optimizer ({reason})"
    install(engine.optimizer, params, moments)
    return f"the AdamW state of {Path(policy_folder) / FILE} (step {moments.step})"


def resume_or_start(
    engine, ckpt_root: Path, rank: int, policy_folder: str | os.PathLike, mode: str, who: str
) -> dict | None:
    """The latest checkpoint under ``ckpt_root`` loaded into ``engine`` (its state), or, where
    there is none, ``start``'s AdamW state, logged on rank 0 as ``who``'s."""
    state = checkpoint.load(engine, ckpt_root, rank)
    if state is None:
        started_from = start(engine, policy_folder, mode)
        if rank == 0:
            log.info("%s optimizer: %s", who, started_from)
    return state
