"""The TRL baseline's scoring, time-to-target arithmetic and GRPOConfig (its runs are bench.system's and bench.longtail's)."""

from __future__ import annotations

from bench.trl_baseline import EXACT_REWARD, score, time_to_target


def test_the_reward_sees_special_tokens_and_the_stop():
    assert score("413<|endoftext|>", "413") >= EXACT_REWARD
    # truncated: no stop reward, not exact
    assert abs(score("413", "413") - 0.9) < 1e-9
    # TRL's own text of this completion is "413"
    assert score("4<|pad|>13<|endoftext|>", "413") < 0.5


def test_time_to_target_is_the_first_rollout_whose_window_means_reach_both_bars():
    curve = [(float(t), 0.5, 0.0) for t in range(1, 6)]
    curve += [(6.0, 1.0, 1.0), (7.0, 1.0, 1.0), (8.0, 1.0, 1.0), (9.0, 1.0, 1.0), (10.0, 1.0, 1.0)]
    # means over steps 6-10: reward 1.0, exact 1.0; over 5-9: reward 0.9, exact 0.8 -> reached at t=9
    assert time_to_target(curve, 0.9, 0.8, 5) == 9.0
    assert time_to_target(curve[:8], 0.9, 0.8, 5) is None
    assert time_to_target([(1.0, 1.0, 0.7)] * 10, 0.9, 0.8, 5) is None


def test_trl_takes_every_shared_hyper_parameter_from_the_streamrl_config(tmp_path):
    import yaml

    from bench.trl_baseline import DEMO_CONFIG, grpo_config_kwargs

    preset = yaml.safe_load(open(DEMO_CONFIG))
    preset["learner"].update(lr=1.5e-4, updates_per_batch=3, groups_per_step=4, minibatches=2)
    preset["algo"].update(kl_coef=0.07, clip_low=0.1, clip_high=0.3)
    preset["rollout"].update(group_size=6, temperature=0.8)
    path = tmp_path / "preset.yaml"
    path.write_text(yaml.safe_dump(preset))
    kwargs = grpo_config_kwargs(0, "out", str(path))
    assert kwargs["learning_rate"] == 1.5e-4 and kwargs["num_iterations"] == 3
    assert kwargs["num_generations"] == 6 and kwargs["per_device_train_batch_size"] == 12
    assert kwargs["steps_per_generation"] == 2
    assert grpo_config_kwargs(0, "out", str(path), ["learner.lr=6e-4"])["learning_rate"] == 6e-4
    assert (kwargs["beta"], kwargs["epsilon"], kwargs["epsilon_high"]) == (0.07, 0.1, 0.3)
    assert kwargs["temperature"] == 0.8
