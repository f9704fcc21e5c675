"""Packed rows through torch's variable-length flash kernel on a CUDA GPU (policy.packed_attention):
the same log-probs and gradients as the 4D-mask path, up to bf16 rounding, the kernel really
called, and no [rows, width, width] mask. Skipped without CUDA (CI has no GPU)."""

from __future__ import annotations

import pytest
import torch
from test_learner_packed_attention import _micro_batch

from streamrl.learner.engine import token_logprobs
from streamrl.policy import packed_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def tiny_bf16():
    from streamrl.examples.reverse_digits.task import build_model

    model = build_model(vocab_size=64, eos_id=1, pad_id=0, seed=5).to("cuda", torch.bfloat16)
    model.config._attn_implementation = "sdpa"
    return model


def _pass(model, mb, attention: str):
    model.config._attn_implementation = attention
    model.zero_grad(set_to_none=True)
    logprobs, entropy = token_logprobs(model, mb, 0.7, with_entropy=True)
    weights = torch.linspace(-1.0, 1.0, logprobs.numel(), device="cuda").view_as(logprobs)
    ((logprobs * weights).sum() + 0.1 * entropy.sum()).backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logprobs.detach(), entropy.detach(), grads


def test_the_flash_kernel_gives_the_mask_paths_log_probs_and_gradients(tiny_bf16, monkeypatch):
    calls = []
    kernel = packed_attention.flash_varlen

    def spy(*args):
        calls.append(args[0].shape)
        return kernel(*args)

    monkeypatch.setattr(packed_attention, "flash_varlen", spy)
    packed_attention.register()
    mb = _micro_batch().to(torch.device("cuda"))
    try:
        masked = _pass(tiny_bf16, mb, "sdpa")
        varlen = _pass(tiny_bf16, mb, packed_attention.NAME)
    finally:
        tiny_bf16.config._attn_implementation = "sdpa"
    assert len(calls) == tiny_bf16.config.num_hidden_layers
    real = mb.completion_mask
    # bf16 attention in two kernels: equal to a few bf16 ulps, not bit for bit
    torch.testing.assert_close(varlen[0][real], masked[0][real], atol=0.05, rtol=0.02)
    torch.testing.assert_close(varlen[1][real], masked[1][real], atol=0.05, rtol=0.02)
    for name, grad in masked[2].items():
        scale = grad.abs().max().item() + 1e-6
        diff = (varlen[2][name] - grad).abs().max().item()
        assert diff <= 0.05 * scale, f"{name}: differs by {diff:.2e} (scale {scale:.2e})"
