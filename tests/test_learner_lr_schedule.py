"""learner.lr_scheduler: transformers' schedules over run.max_steps, as TRL steps them."""

from __future__ import annotations

import math

import pytest
import torch

from streamrl.configs import ConfigError, load_config
from streamrl.configs.schema import LearnerConfig
from streamrl.learner.engine import lr_schedule

# 3 learner steps of 2 mini-batches: 6 optimizer steps, the first 2 warming up (0, then 1/2)
WARM = [0.0, 0.5]
COS = 0.5 * (1 + math.cos(math.pi / 4))
BY_HAND = {
    # after the warm-up, (6 - k) / (6 - 2) at optimizer step k
    "linear": [*WARM, 1.0, 0.75, 0.5, 0.25],
    # 0.5 (1 + cos(pi (k - 2) / 4))
    "cosine": [*WARM, 1.0, COS, 0.5, 1 - COS],
    "constant": [*WARM, 1.0, 1.0, 1.0, 1.0],
}


def _lrs(scheduler: str, max_steps: int, steps: int = 6) -> list[float]:
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=1.0)
    lc = LearnerConfig(lr_scheduler=scheduler, warmup_steps=2, minibatches=2)
    schedule = lr_schedule(lc, optimizer, max_steps)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


@pytest.mark.parametrize("scheduler", list(BY_HAND))
def test_the_lr_at_each_optimizer_step_is_the_schedules(scheduler):
    assert _lrs(scheduler, max_steps=3) == pytest.approx(BY_HAND[scheduler], abs=1e-12)


def test_the_default_is_trls_linear_decay_and_without_a_step_limit_holds_the_lr():
    assert LearnerConfig().lr_scheduler == "auto"
    assert _lrs("auto", max_steps=3) == pytest.approx(BY_HAND["linear"], abs=1e-12)
    assert _lrs("auto", max_steps=0, steps=5) == pytest.approx([*WARM, 1.0, 1.0, 1.0])


def test_naming_a_decay_needs_max_steps_and_a_saved_config_loads_back(tmp_path):
    from streamrl.configs import write_config

    assert load_config(None, ["run.max_steps=10", "learner.lr_scheduler=cosine"], env={})
    for scheduler in ("linear", "cosine"):
        with pytest.raises(ConfigError, match=f"learner.lr_scheduler={scheduler} .*run.max_steps"):
            load_config(None, [f"learner.lr_scheduler={scheduler}"], env={})
    # every key spelled out, as a run saves its config for its children: the default still loads
    saved = write_config(load_config("demo_cpu", env={}), tmp_path / "config.yaml")
    assert load_config(saved, env={}).learner.lr_scheduler == "auto"
