"""Held-out evaluation: sampled and greedy completions of the eval prompts, scored and logged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrl.actors.engines.base import SamplingParams
from streamrl.actors.evaluation import EVAL_LOG, Evaluator, summarize
from streamrl.actors.prompt_data import PromptDataset
from streamrl.actors.rewards import RewardPool
from streamrl.actors.sources import Generation
from streamrl.configs import Config
from streamrl.policy.load import load_policy, load_tokenizer


def test_pass_at_1_counts_samples_that_reach_the_full_reward():
    assert summarize([1.0, 0.5, 1.0, 0.0]) == (pytest.approx(0.625), 0.5)


@pytest.mark.timeout(240)
def test_an_evaluation_logs_sampled_and_greedy_reward_and_pass_at_1(
    tmp_path, demo_policy, demo_dataset
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from streamrl.actors.engines.hf.engine import HFEngine

    cfg = Config.model_validate(
        {
            "run": {"dir": str(tmp_path / "run")},
            "model": {"path": demo_policy},
            "data": {"path": demo_dataset, "eval_path": demo_dataset, "eval_every": 1, "eval_size": 12},
            "rollout": {"max_new_tokens": 6},
            "reward": {"functions": [{"fn": "streamrl.examples.reverse_digits:reverse_digits"}]},
        }
    )  # fmt: skip
    tokenizer = load_tokenizer(demo_policy)
    engine = HFEngine(load_policy(demo_policy), tokenizer, 16, seed=0)
    params = SamplingParams.from_config(cfg.rollout, [tokenizer.eos_token_id])
    gen = Generation(engine, "a0", params, tokenizer, cfg.rollout.group_size)
    with RewardPool(cfg.reward) as rewards:
        # run, not maybe_run: no Redis claims which actor evaluates
        evaluator = Evaluator(
            PromptDataset.from_config(cfg.data, tokenizer, held_out=True),
            size=cfg.data.eval_size,
            every=cfg.data.eval_every,
            run_dir=cfg.run.dir,
            tensorboard="tensorboard" in cfg.run.report_to,
            gen=gen,
            rewards=rewards,
            claims=None,
        )
        first = evaluator.run(version=3)
        second = evaluator.run(version=4)
    evaluator.close()
    assert first["prompts"] == 12
    for row in (first, second):
        for name in ("sampled", "greedy"):
            assert 0.0 <= row[f"{name}/pass@1"] <= 1.0 and 0.0 < row[f"{name}/reward_mean"] <= 1.0
    # greedy decoding of unchanged weights gives the same completions, hence the same scores
    assert first["greedy/reward_mean"] == second["greedy/reward_mean"]
    rows = [json.loads(line) for line in (Path(cfg.run.dir) / EVAL_LOG).open()]
    assert [r["version"] for r in rows] == [3, 4]
    events = EventAccumulator(str(Path(cfg.run.dir) / "tensorboard" / "eval"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("eval/greedy/pass@1")}
    assert logged == {
        3: pytest.approx(first["greedy/pass@1"]),
        4: pytest.approx(second["greedy/pass@1"]),
    }


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_in_a_running_system_each_eval_version_is_evaluated_by_one_actor(
    tmp_path, demo_policy, demo_dataset
):
    """Two real actors race for every multiple of ``data.eval_every``: the Redis claim lets one
    evaluate it, and its row reaches the run's eval log."""
    import uuid

    from streamrl.configs import load_config
    from streamrl.launch.supervisor import Supervisor

    config = "configs/demo_cpu.yaml"
    overrides = [
        f"run.name=eval-{uuid.uuid4().hex[:8]}",
        f"run.dir={tmp_path / 'run'}",
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
        f"data.eval_path={demo_dataset}",
        "data.eval_every=4",
        "data.eval_size=8",
        "run.max_steps=1000",
        "run.max_time_s=0",
    ]
    cfg = load_config(config, overrides, env={})
    log = Path(cfg.run.dir) / EVAL_LOG

    def rows() -> list[dict]:
        return [json.loads(line) for line in log.open()] if log.exists() else []

    sup = Supervisor(cfg, actors=2)
    try:
        sup.start()
        assert sup.wait_until(lambda: len(rows()) >= 3, timeout=240)
    finally:
        sup.stop()
    evaluated = [row["version"] // 4 for row in rows()]
    assert len(evaluated) == len(set(evaluated)), evaluated
    assert all(row["prompts"] == 8 for row in rows())
    assert all(0.0 <= row["greedy/pass@1"] <= 1.0 for row in rows())
