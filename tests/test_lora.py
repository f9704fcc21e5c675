"""LoRA through peft (``policy.lora``): what a version publishes in merged and adapter mode,
checked against the obvious W + (alpha / r) B A, and how an actor applies adapter versions."""

from __future__ import annotations

import pytest
import torch

from streamrl.configs.schema import LoraConfig
from streamrl.policy import lora as L
from streamrl.weightsync.subscriber import swap_into_model

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def _policy(seed: int = 0):
    """The demo's tiny Qwen2 in float64, so every comparison below is exact to rounding."""
    from streamrl.examples.reverse_digits.task import build_model

    return build_model(16, 1, 0, seed=seed).double().eval()


def _randomise_adapters(model, seed: int) -> None:
    # peft starts B at zero (the wrapped policy equals the base): give every adapter a real update
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)


def _logits(model, ids) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.tensor([[3, 4, 5, 6, 7, 2]])


@pytest.mark.parametrize("targets", [ATTENTION, "all-linear"])
def test_merged_tensors_are_the_base_names_holding_w_plus_scaled_ba(targets):
    cfg = LoraConfig(rank=4, alpha=8.0, target_modules=targets)
    base_names = [n for n, _ in _policy().named_parameters()]
    wrapped = L.wrap(_policy(), cfg)
    _randomise_adapters(wrapped, seed=1)
    merged = L.merged_tensors(wrapped)
    assert list(merged) == base_names

    # the reference: every wrapped layer by hand, from its base weight and its A and B
    params = dict(wrapped.get_base_model().named_parameters())
    touched = 0
    for name in base_names:
        layer, _, leaf = name.rpartition(".")
        base_weight = params.get(f"{layer}.base_layer.{leaf}")
        if base_weight is None:
            assert torch.equal(merged[name], params[name]), name
            continue
        expected = base_weight
        if leaf == "weight":
            a, b = (
                params[f"{layer}.lora_A.default.weight"],
                params[f"{layer}.lora_B.default.weight"],
            )
            expected = base_weight + (8.0 / 4) * (b @ a)
            touched += 1
        torch.testing.assert_close(merged[name], expected, rtol=0, atol=1e-12)
    assert touched == (8 if targets == ATTENTION else 14)

    # a plain model holding the merged weights computes what the wrapped one does
    plain = _policy(seed=5)
    plain.load_state_dict(merged, strict=False)
    torch.testing.assert_close(_logits(plain, IDS), _logits(wrapped, IDS), rtol=0, atol=1e-10)


def test_published_tensors_per_mode():
    model = _policy()
    off = L.published_tensors(model, LoraConfig())
    assert off.keys() == dict(model.named_parameters()).keys()

    wrapped = L.wrap(_policy(), LoraConfig(rank=8, target_modules=ATTENTION, sync="adapter"))
    adapters = L.published_tensors(wrapped, LoraConfig(rank=8, sync="adapter"))
    assert adapters and all(".lora_A.weight" in n or ".lora_B.weight" in n for n in adapters)
    assert all(n.startswith("base_model.model.") for n in adapters)
    full = sum(t.numel() for t in off.values())
    # the demo policy at rank 8 on the attention projections: 2.8 % of the weights
    assert sum(t.numel() for t in adapters.values()) / full < 0.05
    merged = L.published_tensors(wrapped, LoraConfig(rank=8, sync="merged"))
    assert merged.keys() == off.keys()


def test_an_actor_applies_adapter_versions_without_stacking():
    cfg = LoraConfig(rank=4, alpha=8.0, target_modules="all-linear", sync="adapter")
    learner = L.wrap(_policy(), cfg)
    actor = _policy()
    targets = L.adapter_targets(L.wrap(actor, cfg))
    assert targets.keys() == L.adapter_tensors(learner).keys()
    before = _logits(actor, IDS)
    torch.testing.assert_close(before, _logits(_policy(), IDS), rtol=0, atol=0)

    for version in (1, 2, 3):
        _randomise_adapters(learner, seed=version)
        # what a subscriber stages: a copy of the published tensors
        staged = {n: t.clone() for n, t in L.adapter_tensors(learner).items()}
        swap_into_model(actor, staged, targets)
        # the actor equals the learner's version: W + this version's BA, not the previous ones' too
        plain = _policy(seed=9)
        plain.load_state_dict(L.merged_tensors(learner), strict=False)
        torch.testing.assert_close(_logits(actor, IDS), _logits(plain, IDS), rtol=0, atol=1e-10)


def test_adapter_template_and_folder_round_trip(tmp_path):
    from peft import PeftModel

    from streamrl.examples.reverse_digits.task import build_model

    policy = tmp_path / "policy"
    build_model(16, 1, 0).save_pretrained(policy)
    cfg = LoraConfig(rank=8, alpha=16.0, target_modules="all-linear", sync="adapter")
    template, config = L.adapter_template(policy, cfg, torch.float32)
    learner = L.wrap(_policy(), cfg)
    _randomise_adapters(learner, seed=4)
    published = L.adapter_tensors(learner)
    assert {n: tuple(t.shape) for n, t in template.items()} == {
        n: tuple(t.shape) for n, t in published.items()
    }
    # all-linear is spelled out, as vLLM reads the folder
    assert isinstance(config["target_modules"], list) and "q_proj" in str(config["target_modules"])

    folder = L.write_adapter(tmp_path / "adapter", published, config)
    loaded = PeftModel.from_pretrained(build_model(16, 1, 0).double(), folder).eval()
    torch.testing.assert_close(_logits(loaded, IDS), _logits(learner, IDS), rtol=0, atol=1e-10)


def test_vllm_rank_and_schema_bounds():
    assert [L.vllm_max_rank(r) for r in (1, 2, 8, 9, 300, 512)] == [1, 8, 8, 16, 320, 512]
    with pytest.raises(ValueError, match="up to 512"):
        LoraConfig(rank=513)
    assert not LoraConfig().enabled


def test_vllm_engine_args_per_sync_mode(tmp_path):
    from streamrl.actors.engines.vllm.engine import engine_args
    from streamrl.configs.schema import ActorConfig, ModelConfig

    adapter = ModelConfig(path=str(tmp_path), lora={"rank": 5, "sync": "adapter"})
    args = engine_args(adapter, ActorConfig(), None, gpu=False)
    assert args["enable_lora"] and args["max_lora_rank"] == 8 and args["max_loras"] >= 2
    assert "weight_transfer_config" not in args
    merged = ModelConfig(path=str(tmp_path), lora={"rank": 5, "sync": "merged"})
    args = engine_args(merged, ActorConfig(), "streamrl_shm", gpu=False)
    assert "enable_lora" not in args
    assert args["weight_transfer_config"] == {"backend": "streamrl_shm"}
