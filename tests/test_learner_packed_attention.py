"""Packed rows without a 4D mask (policy.packed_attention): the samples' bounds from the position
ids, and log-probs, entropy and gradients through it equal to the mask path's, in float64 on a
tiny GQA Qwen2 (4 query heads, 2 key/value heads) with several samples per row."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from streamrl.learner.batching import Sample, collate
from streamrl.learner.engine import packs_by_bounds, token_logprobs
from streamrl.policy import packed_attention

PAD = 0


def reference_bounds(position_ids: torch.Tensor) -> list[int]:
    """The obvious loop: walk the rows end to end, a sample starting at each row's first column
    and wherever the position is not the previous one plus one."""
    starts = []
    for r, row in enumerate(position_ids.tolist()):
        for c, p in enumerate(row):
            if c == 0 or p != row[c - 1] + 1:
                starts.append(r * len(row) + c)
    return [*starts, position_ids.numel()]


def test_sample_bounds_are_where_the_positions_restart():
    rng = np.random.default_rng(0)
    for _ in range(20):
        rows = []
        for _ in range(rng.integers(1, 4)):
            lengths = rng.integers(1, 6, size=rng.integers(1, 5))
            row = np.concatenate([np.arange(n) for n in lengths])
            # a padding tail keeps counting columns, as collate writes it
            tail = np.arange(len(row), 20)
            rows.append(np.concatenate([row, tail])[:20])
        positions = torch.tensor(np.stack(rows))
        bounds = packed_attention.sample_bounds(positions)
        assert bounds.dtype == torch.int32
        assert bounds.tolist() == reference_bounds(positions)


@pytest.fixture(scope="module")
def tiny64():
    """The demo's Qwen2 shape (GQA), random weights, float64, sdpa."""
    from streamrl.examples.reverse_digits.task import build_model

    model = build_model(vocab_size=64, eos_id=1, pad_id=PAD, seed=5).double()
    model.config._attn_implementation = "sdpa"
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    return model


def _micro_batch(seed: int = 4):
    rng = np.random.default_rng(seed)
    samples = [
        Sample(
            input_ids=rng.integers(4, 60, size=n),
            prompt_len=2,
            behaviour_logprobs=np.zeros(n - 2, dtype=np.float32),
            versions=np.zeros(n - 2, dtype=np.int64),
            advantage=float(rng.normal()),
            reward=0.0,
            group_id="0",
        )
        for n in (5, 31, 7, 12, 3, 9, 9, 20, 4, 16, 6, 11)
    ]
    mb = collate(samples, PAD, token_budget=64)
    # several rows, each with several samples: a leak across samples or across rows shows
    assert 1 < mb.packed_ids.shape[0] < len(samples)
    return mb


def _pass(model, mb, attention: str):
    model.config._attn_implementation = attention
    model.zero_grad(set_to_none=True)
    logprobs, entropy = token_logprobs(model, mb, 0.7, with_entropy=True)
    weights = torch.linspace(-1.0, 1.0, logprobs.numel(), dtype=logprobs.dtype).view_as(logprobs)
    ((logprobs * weights).sum() + 0.1 * entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy.detach(), grads


def assert_close(ours: torch.Tensor, reference: torch.Tensor, name: str) -> None:
    """Equal up to float32 rounding (Qwen2's RMSNorm computes in float32 inside the float64
    model); attending across samples is off by percents."""
    scale = max(reference.abs().max().item(), 1e-3)
    diff = (ours - reference).abs().max().item()
    assert diff <= 1e-6 * scale, f"{name}: differs by {diff:.2e} (scale {scale:.2e})"


def test_varlen_log_probs_entropy_and_gradients_equal_the_mask_paths(tiny64):
    packed_attention.register()
    mb = _micro_batch()
    try:
        masked = _pass(tiny64, mb, "sdpa")
        varlen = _pass(tiny64, mb, packed_attention.NAME)
    finally:
        tiny64.config._attn_implementation = "sdpa"
    real = mb.completion_mask
    assert_close(varlen[0][real], masked[0][real], "log-probs")
    assert_close(varlen[1][real], masked[1][real], "entropy")
    assert set(varlen[2]) == set(masked[2])
    for name, grad in masked[2].items():
        assert_close(varlen[2][name], grad, name)


def _varlen_then_masked(model, mb) -> tuple[torch.Tensor, torch.Tensor]:
    """``mb``'s token log-probs under ``NAME``, then under sdpa's mask."""
    try:
        with torch.no_grad():
            model.config._attn_implementation = packed_attention.NAME
            varlen = token_logprobs(model, mb, 1.0)
            model.config._attn_implementation = "sdpa"
            masked = token_logprobs(model, mb, 1.0)
    finally:
        model.config._attn_implementation = "sdpa"
    return varlen, masked


def test_the_flash_kernel_gets_the_bounds_causal_and_gqa_unrepeated(tiny64, monkeypatch):
    """The CUDA branch's call, on the CPU: a stand-in for torch's varlen kernel checks its
    arguments and answers with per-sample attention, so the log-probs must still equal the mask's."""
    calls = []

    def stand_in(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size, enable_gqa):
        assert q.dim() == 3 and k.shape[1] < q.shape[1] and enable_gqa
        assert window_size == (-1, 0) and cu_q is cu_k and cu_q.dtype == torch.int32
        assert max_q == max_k == int(cu_q.diff().max())
        calls.append(q.shape)
        return packed_attention.per_sample_attention(q, k, v, cu_q.tolist(), scale)

    monkeypatch.setattr(packed_attention, "flash_varlen_applies", lambda q: True)
    monkeypatch.setattr(packed_attention, "_varlen_attn", lambda: stand_in)
    packed_attention.register()
    mb = _micro_batch(seed=9)
    varlen, masked = _varlen_then_masked(tiny64, mb)
    assert len(calls) == tiny64.config.num_hidden_layers
    real = mb.completion_mask
    assert_close(varlen[real], masked[real], "log-probs")


@pytest.mark.parametrize(
    ("choice", "attention", "on_cuda", "switched"),
    [
        ("auto", "sdpa", True, True),
        ("auto", "sdpa", False, False),
        ("varlen", "sdpa", False, True),
        ("mask", "sdpa", True, False),
        ("varlen", "eager", True, False),
        ("auto", "flash_attention_2", True, False),
    ],
)
def test_the_knob_switches_only_an_sdpa_policy(tiny64, choice, attention, on_cuda, switched):
    tiny64.config._attn_implementation = attention
    try:
        assert packs_by_bounds(choice, tiny64, on_cuda) is switched
    finally:
        tiny64.config._attn_implementation = "sdpa"


def test_a_torch_whose_varlen_kernel_takes_no_enable_gqa_gets_the_per_sample_path(
    tiny64, monkeypatch, caplog
):
    """torch 2.11's ``varlen_attn`` has no ``enable_gqa`` (the last lent GPU had it): the module
    is imported against a stand-in with that signature on a device that would otherwise take the
    flash branch, and the kernel is never called, the mask's log-probs come out, and the reason
    is logged."""

    def older_kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        raise AssertionError("a kernel without enable_gqa was called")

    stand_in = types.ModuleType("torch.nn.attention.varlen")
    stand_in.varlen_attn = older_kernel
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", stand_in)
    monkeypatch.setattr(packed_attention, "_device_fits", lambda q: True)
    packed_attention._varlen_attn.cache_clear()
    packed_attention.register()
    mb = _micro_batch(seed=4)
    try:
        with caplog.at_level("WARNING", logger=packed_attention.__name__):
            varlen, masked = _varlen_then_masked(tiny64, mb)
    finally:
        packed_attention._varlen_attn.cache_clear()
    real = mb.completion_mask
    assert_close(varlen[real], masked[real], "log-probs")
    reasons = [r.getMessage() for r in caplog.records if "enable_gqa" in r.getMessage()]
    assert len(reasons) == 1, caplog.text
    assert "per-sample attention" in reasons[0]
