"""The learner's memory knobs reach the engine: gradient checkpointing (same gradients, layers
recomputed in the backward) and ZeRO optimizer offload (DeepSpeed's own, torch AdamW on a CPU learner)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from bench.learner import _model, random_samples
from streamrl.configs import Config
from streamrl.learner import algorithm
from streamrl.learner.batching import collate
from streamrl.learner.engine import (
    build_engine,
    enable_gradient_checkpointing,
    init_distributed,
    make_optimizer,
    token_logprobs,
)
from streamrl.learner.step import train_batch

# hidden, layers, heads, kv heads, intermediate, vocab
SHAPE = (64, 3, 4, 2, 128, 101)


def _grads(model, batch) -> tuple[dict[str, torch.Tensor], int]:
    """The learner's forward (token log-probs with entropy) and loss; the gradients and how many
    times the decoder layers' MLPs started (a checkpointed layer runs again in the backward; a
    pre-hook, because the recompute stops once the last saved tensor is back, inside the MLP)."""
    calls = []
    hooks = [
        layer.mlp.register_forward_pre_hook(lambda *_: calls.append(1))
        for layer in model.model.layers
    ]
    model.train()
    model.zero_grad(set_to_none=True)
    logprobs, entropy = token_logprobs(model, batch, 0.7, with_entropy=True)
    loss, _ = algorithm.policy_loss(
        logprobs, batch.behaviour_logprobs.double(), batch.advantages.double(),
        batch.completion_mask, clip_low=0.2, clip_high=0.28, rho_max=2.0,
        entropy=entropy, entropy_coef=0.01,
    )  # fmt: skip
    loss.backward()
    for h in hooks:
        h.remove()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, len(calls)


def test_gradient_checkpointing_gives_the_same_gradients_in_float64():
    plain = _model(*SHAPE, seed=3).double()
    checkpointed = copy.deepcopy(plain)
    enable_gradient_checkpointing(checkpointed)
    batch = collate(random_samples(6, SHAPE[-1], seed=4), 0)
    want, plain_calls = _grads(plain, batch)
    got, checkpointed_calls = _grads(checkpointed, batch)
    layers = SHAPE[1]
    assert (plain_calls, checkpointed_calls) == (layers, 2 * layers)
    assert want.keys() == got.keys()
    scale = max(g.abs().max().item() for g in want.values())
    assert scale > 0
    for name, g in want.items():
        # the recompute repeats the forward's operations on the same inputs: differences are
        # rounding of a few float64 operations at most
        torch.testing.assert_close(got[name], g, rtol=1e-9, atol=1e-12 * scale, msg=name)


def test_the_engine_checkpoints_layers_offloads_the_optimizer_and_trains():
    rank, world = init_distributed()
    cfg = Config.model_validate(
        {
            "algo": {"proximal": "behaviour", "max_staleness": 100},
            "learner": {
                "micro_batch_tokens": 600,
                "gradient_checkpointing": True,
                "offload_optimizer": True,
                "lr": 1e-3,
            },
        }
    )
    engine = build_engine(cfg.learner, _model(*SHAPE, seed=5), world)
    layers = engine.module.model.layers
    assert all(layer.gradient_checkpointing for layer in layers)
    offload = engine.zero_offload_optimizer()
    assert offload is not None and offload.device == "cpu"
    assert engine.optimizer.cpu_offload
    # a CPU learner keeps torch AdamW (DeepSpeedCPUAdam would compile for minutes)
    assert type(engine.basic_optimizer) is torch.optim.AdamW
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    samples = random_samples(8, SHAPE[-1], seed=6)
    stats = train_batch(
        engine, samples, 0, algo=cfg.algo, learner=cfg.learner, rollout=cfg.rollout,
        seed=0, rank=rank, world=world, pad_id=0,
    )  # fmt: skip
    assert len(stats) == 1 and torch.isfinite(torch.tensor(stats[0].grad_norm))
    assert stats[0].grad_norm > 0
    changed = [n for n, p in engine.module.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)


def test_without_the_knobs_nothing_is_checkpointed_or_offloaded():
    _, world = init_distributed()
    engine = build_engine(Config().learner, _model(*SHAPE, seed=5), world)
    assert not any(layer.gradient_checkpointing for layer in engine.module.model.layers)
    assert engine.zero_offload_optimizer() is None
    assert not engine.optimizer.cpu_offload


def test_without_a_compiler_an_offloaded_gpu_optimizer_degrades_to_torch_adamw(
    tmp_path, monkeypatch
):
    """DeepSpeedCPUAdam is built on first use; a host that cannot build it (here: no working C++
    compiler) gets a warning naming why and torch AdamW stepping the offloaded state."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", "/bin/false")
    lc = Config.model_validate({"learner": {"offload_optimizer": True, "lr": 3e-4}}).learner
    params = list(_model(*SHAPE).parameters())
    with pytest.warns(UserWarning, match="DeepSpeedCPUAdam unavailable.*torch AdamW"):
        optimizer = make_optimizer(lc, params, on_gpu=True)
    assert type(optimizer) is torch.optim.AdamW
    assert optimizer.defaults["lr"] == 3e-4 and len(optimizer.param_groups[0]["params"]) == len(
        params
    )
    # a CPU learner never tries the build
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert type(make_optimizer(lc, params, on_gpu=False)) is torch.optim.AdamW
