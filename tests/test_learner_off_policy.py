"""The off-policy path end to end: two ZeRO-2 learner ranks on delayed data equal plain torch.

The stream carries what a run with one on-time actor and one delayed actor would
carry: completions tagged with the policy version that sampled each token, some
one or two versions behind, some switching version mid-completion, one group
entirely past ``max_staleness``. Everything of the objective is switched on:
recomputed pi_prox with the truncated importance weight, clipping (tight, two
updates per batch so the second update's ratio leaves the range), stale-token
masking and dropping, the k3 KL to the initial policy. The reference is written
here in plain torch from the objective as README.md states it, one
process, one sample at a time; it shares no code with the learner.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from learner_rollouts import sample_groups, xadd_groups
from test_learner_processes import ROOT, _env, two_rank_command
from test_learner_sync import learner_config

from streamrl.configs import Config
from streamrl.policy.load import load_policy, load_tokenizer

STEPS, GROUPS, GROUP_SIZE, UPDATES = 3, 4, 4, 2
TIMEOUT_S = 480
MAX_STALENESS, CLIP, RHO, KL, LR, GRAD_CLIP, EPS = 2, 0.02, 1.05, 0.1, 1e-3, 1.0, 1e-4
# Version tags per step and group, as (old, new): the first half of each completion was sampled
# at ``old``, the rest at ``new``. The learner is at version 2 * (step - 1) when it takes step's batch.
TAGS = [
    [(0, 0), (0, 0), (0, 0), (0, 0)],
    # v2: on time, one behind, two behind (at the bound, kept), a swap mid-completion
    [(2, 2), (1, 1), (0, 0), (0, 2)],
    # v4: on time, first half three behind (masked), wholly three behind (dropped), two behind
    [(4, 4), (1, 3), (1, 1), (2, 2)],
]


def _recorded_stream(policy: str) -> list[list]:
    """Groups sampled from the initial policy, rewards made distinct (every group carries a signal),
    versions tagged as the delayed actor would tag them."""
    groups = sample_groups(
        load_policy(policy),
        load_tokenizer(policy),
        random.Random(11),
        STEPS * GROUPS,
        GROUP_SIZE,
        0,
    )
    rng = np.random.default_rng(11)
    steps = []
    for step, tags in enumerate(TAGS):
        batch = groups[step * GROUPS : (step + 1) * GROUPS]
        for group, (old, new) in zip(batch, tags, strict=True):
            for c in group.completions:
                n = len(c.token_ids)
                c.versions = np.where(np.arange(n) < n // 2, old, new).astype(np.int32)
                c.reward = float(rng.random())
                c.reward_parts = {"r": c.reward}
        steps.append(batch)
    return steps


def _logprobs(model, prompt, completion) -> torch.Tensor:
    ids = torch.cat([prompt, completion])[None]
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return F.log_softmax(logits, dim=-1).gather(-1, completion[:, None]).squeeze(-1)


def reference_run(policy: str, steps: list[list]) -> tuple[dict, list[dict]]:
    """Decoupled PPO, token mean over the batch's fresh tokens, AdamW + global-norm clipping:

    for each batch at learner version v: drop groups whose every token has v - version > S;
    A = (r - mean) / (population std + eps) per group; fresh_t = v - version_t <= S;
    pi_prox = the policy at the start of the batch; for each of the updates:
    L = sum over fresh tokens of [-w min(r A, clip(r, 1 - c, 1 + c) A) + beta k3] / (fresh tokens),
    w = min(pi_prox / mu, rho), r = pi_theta / pi_prox, k3 = pi_ref/pi_theta - log(pi_ref/pi_theta) - 1.
    """
    model, ref_model = load_policy(policy), load_policy(policy)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.99), weight_decay=0.0)
    version, stats = 0, []
    for groups in steps:
        rows, dropped = [], 0
        # every completion token read, those masked or dropped as stale, the kept ones by lag
        read = masked = 0
        lags: dict[str, int] = {}
        for group in groups:
            fresh = [
                torch.from_numpy(version - c.versions.astype(np.int64)) <= MAX_STALENESS
                for c in group.completions
            ]
            read += sum(len(f) for f in fresh)
            masked += sum(int((~f).sum()) for f in fresh)
            if not any(bool(f.any()) for f in fresh):
                dropped += 1
                continue
            for c in group.completions:
                for lag in (version - c.versions.astype(np.int64)).tolist():
                    lags[str(lag)] = lags.get(str(lag), 0) + 1
            rewards = torch.tensor([c.reward for c in group.completions], dtype=torch.float64)
            adv = (rewards - rewards.mean()) / (rewards.std(unbiased=False) + EPS)
            prompt = torch.from_numpy(group.prompt_token_ids.astype(np.int64))
            for c, a, f in zip(group.completions, adv.tolist(), fresh, strict=True):
                completion = torch.from_numpy(c.token_ids.astype(np.int64))
                with torch.no_grad():
                    ref = _logprobs(ref_model, prompt, completion)
                rows.append([prompt, completion, torch.from_numpy(c.logprobs), a, f, ref, None])
        tokens = sum(int(f.sum()) for *_, f, _, _ in rows)
        clipped = truncated = 0
        w_sum = w_sq_sum = drift = 0.0
        for update in range(UPDATES):
            optimizer.zero_grad()
            total, clipped, truncated = 0.0, 0, 0
            for row in rows:
                prompt, completion, mu, a, fresh, ref, prox = row
                theta = _logprobs(model, prompt, completion)
                if update == 0:
                    prox = row[6] = theta.detach()
                    # the off-policy figures, in float64, over the first pass's tokens
                    d = (prox.double() - mu.double())[fresh]
                    w64 = torch.exp(d).clamp(max=RHO)
                    w_sum, w_sq_sum = w_sum + w64.sum().item(), w_sq_sum + w64.square().sum().item()
                    drift += (torch.exp(d) - d - 1).sum().item()
                w = torch.exp(prox - mu).clamp(max=RHO)
                r = torch.exp(theta - prox)
                r_clip = r.clamp(1 - CLIP, 1 + CLIP)
                k3 = torch.exp(ref - theta) - (ref - theta) - 1
                per_token = -w * torch.minimum(r * a, r_clip * a) + KL * k3
                total = total + per_token[fresh].sum()
                clipped += int(((r * a > r_clip * a) & fresh).sum())
                truncated += int(((torch.exp(prox - mu) > RHO) & fresh).sum())
            (total / tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            version += 1
        stats.append(
            {
                "tokens": tokens, "dropped": dropped, "clipped": clipped, "truncated": truncated,
                "ess": (w_sum / tokens) ** 2 / (w_sq_sum / tokens), "behaviour_kl": drift / tokens,
                "stale_fraction": masked / read, "lags": lags,
            }
        )  # fmt: skip
    return {n: p.detach().clone() for n, p in model.named_parameters()}, stats


def _config(redis_cfg: Config, policy: str, tmp_path: Path) -> Config:
    name = f"{redis_cfg.run.name}-off-policy"
    base = Config.model_validate(
        {
            "run": {"name": name, "dir": str(tmp_path / name)},
            "broker": {"redis_url": redis_cfg.broker.redis_url},
        }
    )
    return learner_config(
        base, policy,
        run={"max_steps": STEPS},
        rollout={"group_size": GROUP_SIZE},
        learner={"lr": LR, "grad_clip": GRAD_CLIP, "groups_per_step": GROUPS,
                 "updates_per_batch": UPDATES, "micro_batch_tokens": 48, "read_timeout_s": 60},
        algo={"max_staleness": MAX_STALENESS, "clip_low": CLIP, "clip_high": CLIP, "rho_max": RHO,
              "kl_coef": KL, "adv_eps": EPS, "importance_correction": True, "proximal": "recompute",
              "aggregation": "token_mean", "staleness_tighten": 0.0},
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_two_ranks_on_delayed_data_equal_a_plain_torch_decoupled_ppo_run(
    redis_cfg, demo_policy, tmp_path
):
    steps = _recorded_stream(demo_policy)
    cfg = _config(redis_cfg, demo_policy, tmp_path)
    xadd_groups(cfg, [g for batch in steps for g in batch])
    cmd, out = two_rank_command(cfg, tmp_path)
    proc = subprocess.Popen(
        cmd, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        # the reference trains while the two ranks do
        expected, reference_stats = reference_run(demo_policy, steps)
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            # torchrun and both ranks: a failing reference must not leave them training
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, output[-6000:]

    rows = [
        json.loads(line)
        for line in (Path(cfg.run.dir) / "learner_steps.jsonl").read_text().splitlines()
    ]
    assert [r["version"] for r in rows] == [UPDATES * (k + 1) for k in range(STEPS)]
    assert [r["tokens"] for r in rows] == [s["tokens"] for s in reference_stats]
    assert [r["dropped_stale_groups"] for r in rows] == [s["dropped"] for s in reference_stats]
    # every part of the objective was exercised, and counted the same on both sides
    assert reference_stats[2]["dropped"] == 1
    masked = sum(len(c.token_ids) for g in steps[2] for c in g.completions)
    assert reference_stats[2]["tokens"] < masked
    for row, ref in zip(rows, reference_stats, strict=True):
        assert row["clip_fraction"] == pytest.approx(ref["clipped"] / ref["tokens"])
        assert row["is_truncated_fraction"] == pytest.approx(ref["truncated"] / ref["tokens"])
    # the off-policy figures against float64 ones from the same tensors. Two float32 passes give
    # log-probs ~1e-6 apart (the weights above agree to 2e-5 after six updates), which moves a
    # weight exp(d) by ~1e-6 relative and its k3 by ~1e-6 * |d|: 1e-4 relative bounds both
    for row, ref in zip(rows, reference_stats, strict=True):
        assert row["is_ess"] == pytest.approx(ref["ess"], rel=1e-4)
        assert row["behaviour_kl"] == pytest.approx(ref["behaviour_kl"], rel=1e-4, abs=1e-9)
        assert row["stale_token_fraction"] == pytest.approx(ref["stale_fraction"], rel=1e-12)
        assert row["staleness_hist"] == ref["lags"]
    # the recomputed pi_prox moved from mu once the policy had: drift, and an ESS below 1
    assert rows[0]["behaviour_kl"] < rows[2]["behaviour_kl"] and rows[2]["is_ess"] < 1
    assert rows[2]["stale_token_fraction"] > 0
    assert any(s["clipped"] for s in reference_stats)
    assert any(s["truncated"] for s in reference_stats)
    assert all(r["kl"] > 0 for r in rows[1:])

    rank0, rank1 = torch.load(f"{out}-0.pt"), torch.load(f"{out}-1.pt")
    moved = 0.0
    initial = dict(load_policy(demo_policy).named_parameters())
    for name, value in expected.items():
        assert torch.equal(rank0[name], rank1[name]), f"{name}: the ranks disagree"
        diff = (rank0[name] - value).abs().max().item()
        if name.endswith("k_proj.bias"):
            # A key bias adds the same q.b to every logit of a query, which softmax ignores: its
            # exact gradient is 0, so both sides' gradients are rounding noise that Adam scales to
            # steps of up to ~lr each. Only that bound is common to two summation orders.
            assert diff <= 2 * LR * STEPS * UPDATES, f"{name}: moved {diff:.2e}"
            continue
        # summation order differs between two ranks and one process: ~6e-6 seen on parameters
        # with a real gradient; a reversed IS weight is ~1e-4 off
        assert diff <= 2e-5, f"{name}: learner and plain-torch reference differ by {diff:.2e}"
        moved = max(moved, (value - initial[name]).abs().max().item())
    # the comparison is not between two untouched models
    assert moved > 1e-3
