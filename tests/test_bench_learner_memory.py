"""bench.learner_memory: the estimate's counts against what transformers, peft and autograd hold,
and the measurement's code path at a tiny shape on the CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.learner_memory import (
    SHAPES,
    TINY,
    GiB,
    Knobs,
    Shape,
    activation_bytes_per_token,
    estimate,
    head_bytes_per_token,
    layer_bytes_per_token,
    lora_parameters,
    parameters,
    table,
)

ROOT = Path(__file__).resolve().parents[1]


def _qwen2(s: Shape, device: str = "cpu"):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        tie_word_embeddings=s.tied,
    )  # fmt: skip
    with torch.device(device):
        return Qwen2ForCausalLM(config)


@pytest.mark.parametrize("name", [*SHAPES, "tiny"])
def test_parameter_counts_are_those_of_the_transformers_model(name):
    shape = SHAPES.get(name, TINY)
    model = _qwen2(shape, "meta")
    assert parameters(shape) == sum(p.numel() for p in model.parameters())


def test_lora_counts_are_peft_trainable_parameters():
    from peft import LoraConfig, get_peft_model

    from bench.learner_memory import LORA_TARGETS

    for shape in (SHAPES["Qwen2.5-0.5B"], TINY):
        lora = LoraConfig(r=16, lora_alpha=32, target_modules=list(LORA_TARGETS))
        model = get_peft_model(_qwen2(shape, "meta"), lora)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        assert lora_parameters(shape, 16) == trainable


def _saved_per_token(fn, model, tokens: int) -> float:
    """Bytes of the distinct storages autograd saves while ``fn`` runs, parameters left out, per token."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen.setdefault(ptr, t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values()) / tokens


def _inputs(shape: Shape, rows: int, length: int):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, shape.vocab, (rows, length), generator=gen)
    mask = torch.ones(rows, length, dtype=torch.long)
    # a padded row, so the attention carries its padding mask as in the learner
    mask[0, -5:] = 0
    return ids, mask


# the count leaves out token ids, rotary tables and the like: a few bytes per token
TOLERANCE = 0.02
SMALL = [(Shape(64, 2, 4, 2, 160, 512, True), 32), (Shape(96, 3, 6, 2, 256, 300, True), 48)]


@pytest.mark.parametrize(("shape", "length"), SMALL)
def test_saved_activations_per_token_are_what_autograd_saves(shape, length):
    from streamrl.learner.engine import enable_gradient_checkpointing

    ids, mask = _inputs(shape, 4, length)
    model = _qwen2(shape).to(torch.bfloat16).train()

    def decoder() -> float:
        return _saved_per_token(
            lambda: model.model(input_ids=ids, attention_mask=mask), model, ids.numel()
        )

    assert decoder() == pytest.approx(
        activation_bytes_per_token(shape, False, length), rel=TOLERANCE
    )
    enable_gradient_checkpointing(model)
    # the forward keeps each layer's input; the one layer being recomputed lives in the backward
    expected = activation_bytes_per_token(shape, True, length) - layer_bytes_per_token(
        shape, length
    )
    assert decoder() == pytest.approx(expected, rel=TOLERANCE)


@pytest.mark.parametrize("entropy", [True, False])
def test_the_log_prob_head_saves_what_the_count_says(entropy):
    from streamrl.weightsync.policy import sequence_logprobs

    shape, length = SMALL[0]
    ids, mask = _inputs(shape, 4, length)
    model = _qwen2(shape).to(torch.bfloat16).train()
    whole = _saved_per_token(
        lambda: sequence_logprobs(model, ids, mask, 0.7, with_entropy=entropy), model, ids.numel()
    )
    decoder = _saved_per_token(
        lambda: model.model(input_ids=ids, attention_mask=mask), model, ids.numel()
    )
    # lm_head saves its bf16 input; the head's fp32 tensors cover L - 1 of every L positions
    head = (whole - decoder - 2 * shape.hidden) * length / (length - 1)
    assert head == pytest.approx(head_bytes_per_token(shape, entropy)[0], rel=TOLERANCE)


def test_the_estimate_sits_just_below_the_h200_measurements_of_the_issue():
    """45.7 and 84.0 GiB at 8,192 and 16,384 tokens (Qwen2.5-0.5B shape, today's entropy with
    gradients): the count leaves out the allocator's fragmentation and workspaces, so it must come
    out lower, and by no more than 10 %."""
    shape = SHAPES["Qwen2.5-0.5B"]
    for tokens, measured in ((8192, 45.7), (16384, 84.0)):
        got = estimate(shape, Knobs(tokens)).gpu / GiB
        assert 0.9 * measured <= got <= measured, (tokens, got)


def test_each_knob_lowers_the_estimate_by_what_it_removes():
    shape = SHAPES["Qwen2.5-1.5B"]
    base = estimate(shape, Knobs(8192))
    checkpointed = estimate(shape, Knobs(8192, gradient_checkpointing=True))
    offloaded = estimate(shape, Knobs(8192, offload_optimizer=True))
    lora = estimate(shape, Knobs(8192, lora_rank=16))
    assert checkpointed.activations < base.activations / 10
    assert (
        checkpointed.logits == base.logits and checkpointed.trainable_state == base.trainable_state
    )
    # ZeRO-2's 14 bytes per parameter leave the GPU for 16 in host memory
    assert base.trainable_state == 14 * parameters(shape)
    assert offloaded.trainable_state == 0 and offloaded.host == 16 * parameters(shape)
    assert lora.trainable_state == 14 * lora_parameters(shape, 16) < base.trainable_state / 50
    assert estimate(shape, Knobs(8192, ranks=2)).trainable_state == base.trainable_state // 2
    assert estimate(shape, Knobs(8192, entropy_grad=False)).logits == 8192 * 12 * shape.vocab
    text = table()
    assert all(name in text for name in SHAPES) and text.count("\n") == 1 + 6 * len(SHAPES)


def _bench(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, "-m", "bench.learner_memory", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_the_cpu_smoke_measures_every_knob_set_with_the_learners_step():
    done = _bench("--measure", "--cpu")
    assert done.returncode == 0, done.stderr[-3000:]
    measured = json.loads(done.stdout.strip().splitlines()[-1])["measured"]
    assert [m["knobs"] for m in measured] == [
        "ZeRO-2",
        "+ gradient checkpointing",
        "+ optimizer offload",
    ]
    assert all(m["steps"] >= 2 and m["tokens_per_s"] > 0 and m["peak_rss"] > 0 for m in measured)
    # on a CPU learner the offloaded optimizer stays torch's (DeepSpeedCPUAdam would compile)
    assert {m["optimizer"] for m in measured} == {"AdamW"}
    assert "| + gradient checkpointing |" in done.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_measuring_on_cuda_without_a_gpu_is_refused():
    done = _bench("--measure", "--device", "cuda")
    assert done.returncode == 2 and "no CUDA device" in done.stderr


# the issue's bar for the learner's GPU, and the count's shortfall against measurements (above)
LEARNER_BAR_GIB = 70
SHORTFALL = 1.10


@pytest.mark.parametrize("preset", ["configs/gpu_gsm8k_qwen05b.yaml", "configs/gpu.yaml"])
def test_the_gpu_recipes_fit_the_learner_bar_at_their_defaults(preset):
    from bench.learner_memory import config_estimate
    from streamrl.configs import load_config

    est = config_estimate(load_config(preset, env={}))
    assert est.gpu * SHORTFALL < LEARNER_BAR_GIB * GiB, est.gpu / GiB
