"""The shared policy loader: from_pretrained folder -> eval-mode model in the resolved dtype."""

from __future__ import annotations

import pytest
import torch

from streamrl.policy.load import load_policy, load_tokenizer, resolve_dtype


def test_load_policy_gives_an_eval_model_in_the_requested_dtype(tmp_path):
    from streamrl.examples.reverse_digits.task import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = load_policy(tmp_path)
    assert not loaded.training and next(loaded.parameters()).dtype == torch.float32
    assert torch.equal(loaded.lm_head.weight, model.lm_head.weight)
    assert next(load_policy(tmp_path, dtype="bfloat16").parameters()).dtype == torch.bfloat16
    assert load_tokenizer(tmp_path).encode("12>") == tokenizer.encode("12>")


def test_auto_dtype_is_bf16_on_cuda_and_fp32_on_cpu_and_bad_input_is_clear(tmp_path):
    assert resolve_dtype("auto", "cpu") == torch.float32
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        resolve_dtype("fp8")
    with pytest.raises(FileNotFoundError):
        load_policy(tmp_path / "missing")
