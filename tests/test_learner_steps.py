"""Steps with nothing to train: they still write a step row and count their groups for admission."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import redis
from learner_rollouts import sample_groups, xadd_groups
from test_learner_sync import learner_config

from streamrl.broker.keys import Keys
from streamrl.policy.load import load_policy, load_tokenizer


@pytest.mark.timeout(180)
def test_a_batch_of_zero_variance_groups_writes_a_row_and_frees_its_admission_slots(
    redis_cfg, demo_policy
):
    from streamrl.learner.grpo import GRPO

    groups = sample_groups(
        load_policy(demo_policy), load_tokenizer(demo_policy), random.Random(7), 8, 4, 0
    )
    for i, g in enumerate(groups):
        for j, c in enumerate(g.completions):
            # the first batch has no signal at all, the second one has
            c.reward = 0.5 if i < 4 else float(j == 0)
    cfg = learner_config(
        redis_cfg,
        demo_policy,
        run={"max_steps": 1},
        algo={"max_staleness": 0, "skip_zero_variance": True},
        # two optimizer steps over the run's one step: the linear schedule's LR is lr, then lr / 2
        learner={
            "groups_per_step": 4,
            "minibatches": 2,
            "lr_scheduler": "linear",
            # a CPU learner has no peak of its own: mfu is over the one set here
            "peak_tflops": 0.001,
        },
        rollout={"group_size": 4},
    )
    xadd_groups(cfg, groups)
    progress = GRPO(cfg).run(echo=lambda line: None)
    # one version per optimizer step
    assert progress.step == 1 and progress.version == 2 and progress.consumed == 8

    rows = [json.loads(line) for line in (Path(cfg.run.dir) / "learner_steps.jsonl").open()]
    assert [(r["trained"], r["samples"], r["groups"]) for r in rows] == [
        (False, 0, 4),
        (True, 16, 4),
    ]
    assert rows[0]["zero_variance_groups"] == 4
    # the row shows the LR of the step's last optimizer step (none for a step that took none)
    assert rows[1]["lr"] == pytest.approx(cfg.learner.lr / 2, rel=1e-12)
    assert rows[0]["lr"] != rows[0]["lr"]
    # the trained step counts its prompt + completion tokens, what its packed rows ran on, and
    # its tokens per second of step (one pass, so the batch's tokens)
    real = sum(
        len(g.prompt_token_ids) + len(c.token_ids) for g in groups[4:] for c in g.completions
    )
    assert rows[1]["sequence_tokens"] == real <= rows[1]["packed_tokens"]
    assert rows[1]["tokens_per_s"] == pytest.approx(real / rows[1]["step_s"])
    # 6N per token (N: every parameter, the tied embedding counted once as the output layer)
    n = sum(p.numel() for p in load_policy(demo_policy).parameters())
    assert rows[1]["mfu"] == pytest.approx(6 * n * rows[1]["tokens_per_s"] / 1e9)
    assert rows[0]["mfu"] is None
    client = redis.Redis.from_url(cfg.broker.redis_url)
    try:
        assert int(client.get(Keys.from_config(cfg.run, cfg.broker).consumed)) == 8
    finally:
        client.close()
