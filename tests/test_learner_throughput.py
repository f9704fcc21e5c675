"""The step row's MFU: the peak table, the FLOPs a trained token needs, and MFU left empty (not 0)
where the peak is unknown."""

from __future__ import annotations

import re

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from streamrl.learner.throughput import (
    Throughput,
    matmul_parameters,
    mfu,
    peak_flops,
    table_peak_tflops,
    training_flops_per_token,
)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA H200 NVL", 835.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A100 80GB PCIe", 312.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L40", 181.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
def test_the_table_reads_cuda_device_names(name, tflops):
    assert table_peak_tflops(name) == tflops


def test_the_peak_is_the_setting_or_the_tables_times_the_ranks():
    assert peak_flops(None, "NVIDIA H100 80GB HBM3", 4) == 4 * 989e12
    assert peak_flops(0, "NVIDIA H100 80GB HBM3", 1) == 989e12
    assert peak_flops(500.0, "NVIDIA H100 80GB HBM3", 2) == 2 * 500e12
    assert peak_flops(200.0, None, 1) == 200e12
    # a CPU learner, an unknown GPU: no peak
    assert peak_flops(None, None, 1) is None
    assert peak_flops(0.0, "NVIDIA GeForce GTX 1080", 8) is None


def test_mfu_is_model_flops_over_peak_and_empty_when_unknown():
    assert mfu(1000, 2.0, 6e9, 1e13) == pytest.approx(1000 * 6e9 / (2.0 * 1e13))
    assert mfu(1000, 2.0, 6e9, None) is None
    assert mfu(1000, 0.0, 6e9, 1e13) is None


def _tiny(tied: bool) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=50,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=tied,
    )
    return Qwen2ForCausalLM(config)


def reference_matmul_parameters(model) -> int:
    """By hand: every named tensor, the input table dropped unless the output layer is it."""
    named = dict(model.named_parameters(remove_duplicate=False))
    total = sum(p.numel() for name, p in named.items() if name != "lm_head.weight")
    if not model.config.tie_word_embeddings:
        total += named["lm_head.weight"].numel() - named["model.embed_tokens.weight"].numel()
    return total


@pytest.mark.parametrize("tied", [True, False])
def test_n_is_every_parameter_that_multiplies_activations(tied):
    model = _tiny(tied)
    n, trained = matmul_parameters(model)
    assert n == trained == reference_matmul_parameters(model)
    assert training_flops_per_token(n, trained) == 6 * n


def test_frozen_parameters_cost_no_weight_gradient():
    """A LoRA-like policy: 2N forward + 2N activation gradients + 2 x the trained part."""
    model = _tiny(True)
    for name, p in model.named_parameters():
        p.requires_grad_("q_proj" in name)
    n, trained = matmul_parameters(model)
    q_proj = sum(p.numel() for name, p in model.named_parameters() if "q_proj" in name)
    assert trained == q_proj and n == reference_matmul_parameters(model)
    assert training_flops_per_token(n, trained) == 4 * n + 2 * q_proj


def test_a_cpu_policy_has_flops_and_no_peak_unless_set():
    model = _tiny(True).to(torch.float64)
    n = reference_matmul_parameters(model)
    assert Throughput.of(model, None, 1) == Throughput(6.0 * n, None)
    assert Throughput.of(model, 0.5, 2).mfu(100, 1.0) == pytest.approx(100 * 6 * n / 1e12)


def test_the_live_view_shows_the_mfu_only_where_it_is_known():
    from rich.console import Console

    from streamrl.launch.status import Snapshot
    from streamrl.launch.view import live_table

    def shown(step: dict) -> str:
        console = Console(width=120, record=True)
        console.print(live_table(Snapshot(at=0.0, version=1, last_step=step), 1.0, []))
        return console.export_text()

    assert re.search(r"learner MFU\s+│ 31\.2%", shown({"step_s": 1.0, "mfu": 0.3123}))
    assert "MFU" not in shown({"step_s": 1.0, "mfu": None})
