"""The one-process reference loop (bench.reference_loop): its reward, masks and one short real run."""

from __future__ import annotations

import shutil

import pytest
import torch

from bench.reference_loop import completion_mask, run_reference, score
from streamrl.examples.reverse_digits.task import EOS, PAD, build_tokenizer


def test_the_mask_ends_at_the_first_eos_and_the_reward_sees_special_tokens():
    tokenizer = build_tokenizer()
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in ["4", "1", "3", PAD, EOS]}
    eos = ids[EOS]
    completions = torch.tensor([[ids["4"], eos, ids["1"]], [ids["4"], ids["1"], ids["3"]]])
    assert completion_mask(completions, eos).tolist() == [[True, True, False], [True] * 3]
    exact = [ids["4"], ids["1"], ids["3"], eos, ids[PAD]]
    assert score(tokenizer, exact, eos, "413") == pytest.approx(1.0)
    padded = [ids["4"], ids[PAD], ids["1"], ids["3"], eos]
    assert score(tokenizer, padded, eos, "413") == pytest.approx(0.3)


@pytest.mark.timeout(120)
def test_a_short_run_trains_rollouts_and_reports_throughput(tmp_path, demo_policy):
    # the session's warmed policy stands in for the one the loop would build in its workdir
    shutil.copytree(demo_policy, tmp_path / "policy")
    overrides = ["learner.groups_per_step=2", "rollout.group_size=4", "algo.kl_coef=0.1"]
    result = run_reference(0, 3.0, tmp_path, overrides, echo=lambda line: None)
    assert result["steps"] >= 1 and len(result["curve"]) == result["steps"]
    assert all(0.0 <= r <= 1.0 and 0.0 <= e <= 1.0 for _, r, e in result["curve"])
    assert result["samples_per_s"] > 0
    # 3 s from a warm start at chance
    assert result["time_to_target_s"] is None


@pytest.mark.timeout(120)
def test_a_lag_longer_than_the_run_samples_every_rollout_from_the_warmed_policy(
    tmp_path, demo_policy
):
    shutil.copytree(demo_policy, tmp_path / "policy")
    small = ["learner.groups_per_step=2", "rollout.group_size=4", "algo.kl_coef=0"]

    def rewards(overrides, lag=0):
        result = run_reference(0, 4.0, tmp_path, overrides, lag=lag, echo=lambda line: None)
        return [r for _, r, _ in result["curve"]]

    # an lr too small to move a float32 weight: every rollout comes from the warmed policy
    frozen = rewards([*small, "learner.lr=1e-30"])
    lagged = rewards([*small, "learner.lr=1e-2"], lag=10_000)
    learning = rewards([*small, "learner.lr=1e-2"])
    n = min(len(frozen), len(lagged), len(learning))
    assert n >= 3
    assert lagged[:n] == frozen[:n]
    assert learning[:n] != frozen[:n]


@pytest.mark.timeout(120)
def test_with_a_lag_the_proximal_policy_is_recomputed_unless_the_config_says_behaviour(
    tmp_path, demo_policy
):
    shutil.copytree(demo_policy, tmp_path / "policy")
    # with a KL the policy keeps learning at this lr (without one it collapses to reward 0 within
    # the 6 rollouts either way, and the rewards no longer tell the two anchors apart)
    small = [
        "learner.groups_per_step=2",
        "rollout.group_size=4",
        "learner.lr=1e-2",
        "algo.kl_coef=0.1",
    ]

    def rewards(proximal, lag):
        result = run_reference(
            0,
            60.0,
            tmp_path,
            [*small, f"algo.proximal={proximal}"],
            lag=lag,
            max_rollouts=6,
            echo=lambda line: None,
        )
        return [r for _, r, _ in result["curve"]]

    # no lag: the sampling policy is the proximal one either way
    assert rewards("behaviour", 0) == rewards("recompute", 0)
    # two steps stale: the ratio's anchor and the importance weight differ, and so does training
    assert rewards("behaviour", 2) != rewards("recompute", 2)
