"""DPO on the learner: hand-worked sigmoid and IPO cases, TRL's own ``DPOTrainer`` loss, and a whole
step against a slow per-pair loop.

TRL's loss lives in ``DPOTrainer._compute_loss(model, inputs)``; the smallest way in is a real
trainer on the demo policy, never trained, fed hand-built ``inputs`` with the reference
log-probs precomputed (``precompute_ref_log_probs``). streamrl's side runs the learner's packed
rows (both responses of a pair in one micro-batch) on the same pairs and reference log-probs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from streamrl.learner import supervised_batches as sb
from streamrl.learner import supervised_loss as L
from streamrl.learner.batching import Sample
from streamrl.learner.engine import token_logprobs
from streamrl.policy.load import load_policy, load_tokenizer

BETA = 0.3
# (prompt, chosen, rejected) lengths: the responses of a pair differ in length
PAIRS = [(4, 3, 5), (6, 2, 2), (3, 5, 1)]


def test_sigmoid_by_hand():
    # margin = (-1 - -2) - (-3 - -2.5) = 1.5; loss = -log sigmoid(0.3 x 1.5) = log(1 + e^-0.45)
    margin = L.dpo_margin(*(torch.tensor([v]) for v in (-1.0, -3.0, -2.0, -2.5)), "sigmoid")
    assert margin.item() == pytest.approx(1.5)
    loss = L.dpo_losses(margin, BETA, "sigmoid")
    assert loss.item() == pytest.approx(math.log1p(math.exp(-0.45)))
    # a zero margin costs log 2 whatever beta
    assert L.dpo_losses(torch.zeros(1), 7.0, "sigmoid").item() == pytest.approx(math.log(2))


def test_ipo_by_hand():
    # per-token ratios: chosen (-1 - -2) / 2 = 0.5, rejected (-3 - -2.5) / 4 = -0.125; margin 0.625;
    # loss = (0.625 - 1 / (2 x 0.3))^2 = (0.625 - 1.6667)^2
    args = [torch.tensor([v]) for v in (-1.0, -3.0, -2.0, -2.5)]
    margin = L.dpo_margin(*args, "ipo", torch.tensor([2.0]), torch.tensor([4.0]))
    assert margin.item() == pytest.approx(0.625)
    loss = L.dpo_losses(margin, BETA, "ipo")
    assert loss.item() == pytest.approx((0.625 - 1 / 0.6) ** 2)
    # IPO's minimum sits at margin 1 / (2 beta), not at infinity
    assert L.dpo_losses(torch.tensor([1 / 0.6]), BETA, "ipo").item() == pytest.approx(0.0)
    with pytest.raises(ValueError, match="counts"):
        L.dpo_margin(*args, "ipo")


def test_preference_rows_train_the_responses_only():
    from streamrl.examples.reverse_digits.task import build_tokenizer
    from streamrl.learner.supervised_data import pair_samples

    tokenizer = build_tokenizer()
    user = {"role": "user", "content": "31>"}
    implicit = {
        "chosen": [user, {"role": "assistant", "content": "13"}],
        "rejected": [user, {"role": "assistant", "content": "31"}],
    }
    explicit = {"prompt": [user], "chosen": "13", "rejected": "31"}
    for row in (implicit, explicit):
        chosen, rejected = pair_samples(tokenizer, row, 64, "row")
        for sample, text in ((chosen, "13"), (rejected, "31")):
            trained = sample.input_ids[sample.prompt_len :][sample.trained()]
            assert tokenizer.decode(trained).startswith(text)
            assert tokenizer.decode(sample.input_ids[: sample.prompt_len]).endswith("assistant\n")
    with pytest.raises(ValueError, match="row: .*chosen"):
        pair_samples(tokenizer, {"prompt": "31>", "chosen": [user]}, 64, "row")


def _pairs(vocab: int) -> list[tuple[Sample, Sample]]:
    rng = np.random.default_rng(11)

    def sample(prompt, n):
        ids = np.concatenate([prompt, rng.integers(4, vocab, n)])
        return Sample(
            ids, len(prompt), np.zeros(n, np.float32), np.zeros(n, np.int64), 0.0, 0.0, "p"
        )

    out = []
    for p, c, r in PAIRS:
        prompt = rng.integers(4, vocab, p)
        out.append((sample(prompt, c), sample(prompt, r)))
    return out


def _trl_inputs(pairs, pad_id: int):
    """TRL's batch: every chosen row, then every rejected row, right-padded, with its
    completion mask over the input tokens."""
    rows = [pair[0] for pair in pairs] + [pair[1] for pair in pairs]
    width = max(len(s) for s in rows)
    ids = torch.full((len(rows), width), pad_id)
    attention = torch.zeros(len(rows), width, dtype=torch.long)
    completion = torch.zeros(len(rows), width, dtype=torch.long)
    for i, s in enumerate(rows):
        ids[i, : len(s)] = torch.from_numpy(s.input_ids)
        attention[i, : len(s)] = 1
        completion[i, s.prompt_len : len(s)] = 1
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": completion}


def _grads(model) -> dict[str, torch.Tensor]:
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.timeout(180)
@pytest.mark.parametrize("loss", ["sigmoid", "ipo"])
def test_loss_and_gradients_equal_trls_dpo_loss(demo_policy, tmp_path, loss):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    model = load_policy(demo_policy)
    model.eval()
    tokenizer = load_tokenizer(demo_policy)
    args = DPOConfig(
        output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to="none",
        save_strategy="no", disable_tqdm=True, beta=BETA, loss_type=[loss],
        precompute_ref_log_probs=True, per_device_train_batch_size=len(PAIRS),
    )  # fmt: skip
    trainer = DPOTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["1"], "chosen": ["2"], "rejected": ["3"]}),
        processing_class=tokenizer,
    )
    pairs = _pairs(model.config.vocab_size)
    g = torch.Generator().manual_seed(5)
    # reference sums a few nats from the policy's, so that the sigmoid is off its linear middle
    ref_chosen = -8.0 + torch.randn(len(PAIRS), generator=g) * 2
    ref_rejected = -8.0 + torch.randn(len(PAIRS), generator=g) * 2
    inputs = {
        **_trl_inputs(pairs, tokenizer.pad_token_id),
        "ref_chosen_logps": ref_chosen,
        "ref_rejected_logps": ref_rejected,
    }
    theirs = trainer._compute_loss(model, inputs, return_outputs=False)
    theirs.backward()
    their_grads = _grads(model)

    batches, real = sb.pair_micro_batches(
        pairs, 1, 0, 4096, tokenizer.pad_token_id, torch.device("cpu")
    )
    assert real == len(batches) == 1
    mb = batches[0]
    mask = mb.completion_mask
    sums = L.row_sums(token_logprobs(model, mb, 1.0), mask)
    counts = mask.sum(-1).float()
    # the micro-batch holds the pairs longest first: put the reference sums in its order
    order = sorted(range(len(PAIRS)), key=lambda i: -sum(PAIRS[i][1:]) - 2 * PAIRS[i][0])
    margin = L.dpo_margin(
        sums[0::2], sums[1::2], ref_chosen[order], ref_rejected[order], loss,
        counts[0::2], counts[1::2],
    )  # fmt: skip
    ours = L.dpo_losses(margin, BETA, loss).mean()
    ours.backward()
    our_grads = _grads(model)

    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
    assert set(our_grads) == set(their_grads)
    for name, grad in their_grads.items():
        scale = grad.abs().max().item()
        assert (our_grads[name] - grad).abs().max().item() <= 1e-4 * scale + 1e-7, name


def _slow_sum(model, sample: Sample) -> float:
    """log pi(response | prompt) of one unpadded sample, one forward pass of its own, in float64."""
    ids = torch.from_numpy(sample.input_ids)[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    logprobs = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
    trained = torch.from_numpy(sample.trained())
    return float(logprobs[sample.prompt_len - 1 :][trained].sum())


@pytest.mark.timeout(180)
def test_a_dpo_step_row_equals_a_slow_per_pair_computation_against_the_starting_weights(
    demo_policy, tmp_path
):
    """Step 2 of a run (the policy one update away from its reference), split over several
    micro-batches: its loss, margin and accuracy are those of a plain loop that scores each
    response alone with the policy of that moment and with the starting weights loaded afresh
    (a reference that moved with the policy would fail here)."""
    from streamrl.configs import load_config
    from streamrl.examples.reverse_digits.assets import write_preference_dataset
    from streamrl.learner.dpo import DPO

    beta = 0.5
    data = write_preference_dataset(tmp_path / "pairs.jsonl", size=24)
    cfg = load_config(None, [
        f"run.dir={tmp_path / 'run'}", "run.report_to=[]", f"model.path={demo_policy}",
        f"supervised.path={data}", "supervised.batch_size=8", f"supervised.beta={beta}",
        "learner.lr=3e-3", "learner.lr_scheduler=constant", "learner.micro_batch_tokens=64",
        "learner.init_optimizer=fresh",
    ], env={})  # fmt: skip
    runner = DPO(cfg)
    try:
        runner.train_next()
        policy = load_policy(demo_policy)
        policy.load_state_dict(runner.engine.module.state_dict())
        picked = [
            runner.examples[i]
            for i in sb.step_indices(len(runner.examples), 8, 1, cfg.run.seed, True)
        ]
        assert len(runner.micro_batches(picked, sb.pair_micro_batches)[0]) > 1
        row = runner.train_next()
    finally:
        runner.close()
    reference = load_policy(demo_policy)
    rewards = [
        [beta * (_slow_sum(policy, s) - _slow_sum(reference, s)) for s in pair] for pair in picked
    ]
    margins = [chosen - rejected for chosen, rejected in rewards]
    assert any(abs(m) > 1e-3 for m in margins)
    losses = [math.log1p(math.exp(-m)) for m in margins]
    assert row["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-4)
    assert row["reward_margin"] == pytest.approx(sum(margins) / len(margins), rel=1e-4, abs=1e-6)
    assert row["reward_accuracy"] == sum(m > 0 for m in margins) / len(margins)
