"""The learner with ``model.lora`` on (a real Redis stream and DeepSpeed ZeRO-2): only the adapters
train, the KL term's reference is the policy with its adapters off, and the export holds the merged
policy and its PEFT adapter folder."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from learner_rollouts import sample_groups, xadd_groups
from rounding import assert_within_rounding
from safetensors.torch import load_file

from streamrl.configs import Config
from streamrl.policy.load import load_policy, load_tokenizer

STEPS = 2


def digest(folder: str) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in Path(folder).iterdir()
        if p.is_file()
    }


@pytest.fixture
def trained(redis_cfg, demo_policy):
    from streamrl.learner.grpo import GRPO

    model, tokenizer = load_policy(demo_policy), load_tokenizer(demo_policy)
    groups = sample_groups(model, tokenizer, random.Random(5), 4 * STEPS, 8, version=0)
    xadd_groups(redis_cfg, groups)
    cfg = Config.model_validate(
        {
            "run": {"name": redis_cfg.run.name, "dir": redis_cfg.run.dir, "max_steps": STEPS},
            "broker": {"redis_url": redis_cfg.broker.redis_url, "block_ms": 200},
            "model": {"path": demo_policy, "lora": {"rank": 8, "alpha": 16}},
            "rollout": {"group_size": 8},
            # a KL scored on the learner: its reference is the adapters-off view
            "algo": {"kl_coef": 0.1, "skip_zero_variance": False},
            "learner": {"groups_per_step": 4, "read_timeout_s": 3.0, "lr": 1e-2},
            "weightsync": {"transport": "none"},
            "metrics": {"enabled": False},
        }
    )
    learner = GRPO(cfg)
    progress = learner.run(echo=lambda line: None)
    assert progress.step == STEPS
    return cfg, learner


@pytest.mark.timeout(300)
def test_only_the_adapters_train_and_the_reference_is_the_base(trained, demo_policy):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from streamrl.learner import export
    from streamrl.policy.lora import (
        ADAPTER_DIR,
        AdaptersDisabled,
        adapter_tensors,
        merged_tensors,
    )

    cfg, learner = trained
    before = digest(demo_policy)
    base = load_policy(demo_policy)
    base_params = dict(base.named_parameters())
    # ZeRO-2's partitions hold the adapters alone (bit16_groups: the module parameters it flattened)
    stepped = {id(p) for group in learner.engine.optimizer.bit16_groups for p in group}
    adapters = {n: p for n, p in learner.model.named_parameters() if "lora_" in n}
    assert stepped == {id(p) for p in adapters.values()} and adapters
    # the base weights did not move; the adapters' B did (it starts at zero)
    for name, param in learner.model.get_base_model().named_parameters():
        if "lora_" not in name:
            assert torch.equal(param, base_params[name.replace("base_layer.", "")]), name
    assert any(p.abs().max() > 0 for n, p in adapters.items() if "lora_B" in n)

    ids = torch.tensor([load_tokenizer(demo_policy).encode("123>")])
    with torch.no_grad():
        reference = AdaptersDisabled(learner.model)(input_ids=ids).logits
        torch.testing.assert_close(reference, base(input_ids=ids).logits, rtol=0, atol=0)
        assert not torch.allclose(learner.model(input_ids=ids).logits, reference)

    folder = export.default_out(cfg.run.dir)
    merged = AutoModelForCausalLM.from_pretrained(folder).eval()
    live = merged_tensors(learner.model)
    for name, param in merged.named_parameters():
        assert torch.equal(param, live[name]), name
    out = merged.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape[1] > ids.shape[1]
    with_adapter = PeftModel.from_pretrained(load_policy(demo_policy), folder / ADAPTER_DIR).eval()
    with torch.no_grad():
        assert_within_rounding(
            with_adapter(input_ids=ids).logits.numpy(),
            merged(input_ids=ids).logits.numpy(),
            merged.double()(input_ids=ids).logits.numpy(),
        )

    # the CLI rebuilds the same folder from the DeepSpeed checkpoint
    again = folder.parent / "from-checkpoint"
    code = export.main(
        [
            f"run.dir={cfg.run.dir}",
            f"model.path={demo_policy}",
            "model.lora.rank=8",
            "--out",
            str(again),
        ]
    )
    assert code == 0
    # which part differs, when one does: the checkpoint's step, its adapters, or the base under them
    assert json.loads((again / export.INFO_FILE).read_text())["step"] == STEPS
    saved = load_file(again / ADAPTER_DIR / "adapter_model.safetensors")
    for name, tensor in adapter_tensors(learner.model).items():
        assert torch.equal(saved[name], tensor), name
    assert digest(demo_policy) == before, f"{demo_policy} changed while the test ran"
    rebuilt = AutoModelForCausalLM.from_pretrained(again)
    for name, param in rebuilt.named_parameters():
        assert torch.equal(param, live[name]), name


def test_adapters_train_under_gradient_checkpointing_and_optimizer_offload(demo_policy):
    """The memory knobs with LoRA: checkpointed layers still give the adapters (and nothing else)
    their gradients, and ZeRO-2's offloaded optimizer steps them."""
    from streamrl.learner.batching import Sample, collate
    from streamrl.learner.engine import build_engine, init_distributed, token_logprobs
    from streamrl.policy.lora import training_policy

    _, world = init_distributed()
    cfg = Config.model_validate(
        {
            "model": {"path": demo_policy, "lora": {"rank": 8}},
            "learner": {"gradient_checkpointing": True, "offload_optimizer": True, "lr": 1e-2},
        }
    )
    model = training_policy(load_policy(demo_policy), cfg.model.lora)
    engine = build_engine(cfg.learner, model, world)
    assert engine.optimizer.cpu_offload
    assert all(layer.gradient_checkpointing for layer in model.get_base_model().model.layers)
    before = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    ids = np.array(load_tokenizer(demo_policy).encode("123>321"), dtype=np.int64)
    completion = len(ids) - 4
    sample = Sample(
        ids, 4, np.zeros(completion, np.float32), np.zeros(completion, np.int64), 1.0, 1.0, "g"
    )
    batch = collate([sample], pad_id=0)
    engine.set_gradient_accumulation_boundary(True)
    loss = -token_logprobs(engine.module, batch, 1.0).mean()
    engine.backward(loss)
    engine.step()
    moved = {n for n, p in engine.module.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("lora_" in n for n in moved)
    assert any("lora_B" in n for n in moved)


@pytest.mark.timeout(300)
def test_a_restarted_learner_resumes_the_adapters_from_its_checkpoint(trained):
    from streamrl.learner.grpo import GRPO

    cfg, first = trained
    adapters = {n: p.detach().clone() for n, p in first.model.named_parameters() if "lora_" in n}
    again = GRPO(cfg)
    try:
        assert again.progress.step == STEPS
        resumed = {n: p for n, p in again.model.named_parameters() if "lora_" in n}
        assert resumed.keys() == adapters.keys()
        for name, tensor in adapters.items():
            assert torch.equal(resumed[name], tensor), name
    finally:
        again.release()
