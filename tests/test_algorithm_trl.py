"""streamrl's loss against TRL's own GRPO loss on the same model, tokens and log-probs.

TRL's loss lives in ``GRPOTrainer._compute_loss(model, inputs)``, which reads the
trainer's settings and computes the policy's log-probs itself; the smallest way in is a
real ``GRPOTrainer`` on the demo policy, never trained, fed hand-built ``inputs``. The
two implementations coincide where both define the same objective:

- TRL ``bnpo`` (token mean) = streamrl ``token_mean``; TRL ``grpo`` (sequence mean) =
  ``seq_mean``; TRL ``dr_grpo`` (sum / (B x max_completion_length)) = ``constant`` with
  that normaliser;
- TRL's ``old_per_token_logps`` is streamrl's pi_prox; TRL's vLLM importance-sampling
  correction in ``token_truncate`` mode multiplies each token's clipped term by
  ``min(exp(old - sampling), clip_max)`` before the KL is added, which is streamrl's
  truncated weight ``min(exp(pi_prox - mu), rho_max)`` with mu = the sampling log-probs;
- ``beta`` x k3 to ``ref_per_token_logps`` = ``kl_coef`` x k3 (with TRL's default
  ``use_bias_correction_kl`` off: on, TRL multiplies k3 by the ratio r); TRL's entropy bonus
  subtracts ``entropy_coef`` x the token-mean entropy (= streamrl's only for token_mean).

Loss values and every parameter's gradient must agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from streamrl.learner import algorithm
from streamrl.learner.batching import Sample, collate
from streamrl.learner.engine import token_logprobs
from streamrl.policy.load import load_policy, load_tokenizer

TEMPERATURE = 0.7
CLIP_LOW, CLIP_HIGH, RHO, BETA = 0.2, 0.28, 1.4, 0.05
PROMPT_LEN, COMPLETION_LENS = 4, (5, 3, 6, 2)
TRL_AGGREGATIONS = {"bnpo": "token_mean", "grpo": "seq_mean", "dr_grpo": "constant"}


def _trainer(
    policy: str, tmp_path, loss_type: str, entropy_coef: float, level: str = "token", clip=None
):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model = load_policy(policy)
    model.eval()
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to="none",
        save_strategy="no", disable_tqdm=True, use_bias_correction_kl=False,
        num_generations=2, per_device_train_batch_size=len(COMPLETION_LENS),
        max_completion_length=max(COMPLETION_LENS), temperature=TEMPERATURE,
        epsilon=(clip or (CLIP_LOW, CLIP_HIGH))[0], epsilon_high=(clip or (CLIP_LOW, CLIP_HIGH))[1],
        beta=BETA, loss_type=loss_type, importance_sampling_level=level,
        entropy_coef=entropy_coef, vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=RHO,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["123"] * 4}),
        processing_class=load_tokenizer(policy),
    )
    # The importance-sampling correction is TRL's answer to sampler/trainer mismatch and is
    # only read when vLLM samples; no vLLM here, so switch the loss onto that path directly.
    trainer.use_vllm = True
    trainer.vllm_importance_sampling_correction = True
    return trainer, model


def _batch(vocab: int):
    rng = np.random.default_rng(7)
    prompt = rng.integers(4, vocab, PROMPT_LEN)
    samples = [
        Sample(
            np.concatenate([prompt, rng.integers(4, vocab, n)]), PROMPT_LEN,
            np.zeros(n, np.float32), np.zeros(n, np.int64), adv, 0.0, "g",
        )
        for n, adv in zip(COMPLETION_LENS, (1.3, -0.7, 0.4, -1.0), strict=True)
    ]  # fmt: skip
    return samples, collate(samples, pad_id=0)


def _completion_view(full: torch.Tensor, lengths) -> torch.Tensor:
    """[B, L-1] target positions -> [B, C] aligned with the completion tokens (zero-padded)."""
    out = torch.zeros(len(lengths), max(lengths), dtype=full.dtype)
    for i, n in enumerate(lengths):
        out[i, :n] = full[i, PROMPT_LEN - 1 : PROMPT_LEN - 1 + n]
    return out


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


# GSPO's clip range is a sequence's: its ratio is a mean over tokens, so it moves much less than
# one token's; with these bounds some of the 4 sequences clip and some do not
GSPO_CLIP = (0.05, 0.08)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("loss_type", "level"),
    [*((t, "token") for t in TRL_AGGREGATIONS), ("grpo", "sequence")],
)
def test_loss_and_gradients_equal_trls_grpo_loss(demo_policy, tmp_path, loss_type, level):
    aggregation = TRL_AGGREGATIONS[loss_type]
    entropy_coef = 0.03 if aggregation == "token_mean" else 0.0
    clip = GSPO_CLIP if level == "sequence" else (CLIP_LOW, CLIP_HIGH)
    trainer, model = _trainer(demo_policy, tmp_path, loss_type, entropy_coef, level, clip)
    samples, mb = _batch(model.config.vocab_size)
    mask = mb.completion_mask

    with torch.no_grad():
        current = token_logprobs(model, mb, TEMPERATURE)
    g = torch.Generator().manual_seed(3)
    # pi_prox, mu and the reference a few tenths of a nat away, so that ratios leave the clip
    # range on both sides, some weights exceed rho_max and the KL is not negligible.
    prox = current + torch.randn(current.shape, generator=g) * 0.3
    mu = prox + torch.randn(current.shape, generator=g) * 0.4
    ref = current + torch.randn(current.shape, generator=g) * 0.3

    lengths = COMPLETION_LENS
    comp_mask = _completion_view(mask.long(), lengths)
    old, sampling = _completion_view(prox, lengths), _completion_view(mu, lengths)
    inputs = {
        "prompt_ids": mb.input_ids[:, :PROMPT_LEN],
        "prompt_mask": torch.ones(len(samples), PROMPT_LEN, dtype=torch.long),
        "completion_ids": _completion_view(mb.input_ids[:, 1:], lengths),
        "completion_mask": comp_mask,
        "advantages": mb.advantages,
        "old_per_token_logps": old,
        "ref_per_token_logps": _completion_view(ref, lengths),
        # TRL computes this in its generation step as exp(old - sampling) clamped to clip_max
        "importance_sampling_ratio": torch.exp(old - sampling).clamp(max=RHO) * comp_mask,
    }
    theirs = trainer._compute_loss(model, inputs)
    theirs.backward()
    their_grads = _grads(model)

    logprobs, entropy = token_logprobs(model, mb, TEMPERATURE, with_entropy=True)
    ours, stats = algorithm.policy_loss(
        logprobs, mu, mb.advantages, mask, clip_low=clip[0], clip_high=clip[1], rho_max=RHO,
        importance_level=level,
        proximal_logprobs=prox, ref_logprobs=ref, kl_coef=BETA, entropy=entropy,
        entropy_coef=entropy_coef, aggregation=aggregation,
        normalizer=float(len(samples) * max(lengths)) if aggregation == "constant" else None,
    )  # fmt: skip
    ours.backward()
    our_grads = _grads(model)

    # the comparison exercises what it claims to
    assert 0 < stats.clip_fraction < 1 and stats.is_truncated_fraction > 0 and stats.kl > 1e-3
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
    assert set(our_grads) == set(their_grads)
    for name, grad in their_grads.items():
        scale = grad.abs().max().item()
        diff = (our_grads[name] - grad).abs().max().item()
        assert diff <= 1e-5 * max(scale, 1e-3), f"{name}: differs by {diff:.2e} (scale {scale:.2e})"
