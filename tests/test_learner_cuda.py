"""The learner on a CUDA GPU, started the way the launcher starts it (``python -m streamrl.learner`` with no
``DS_ACCELERATOR``, so it picks DeepSpeed's cuda accelerator itself): it trains on the GPU, with
more than one micro-batch per step, publishes every version to shared memory from GPU tensors and
checkpoints GPU weights. Skipped without CUDA (CI has no GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from learner_rollouts import xadd_groups
from test_learner_processes import ROOT, _config, _env, _overrides, _stream_of

from streamrl.policy.load import load_policy

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.slow,
]


@pytest.mark.timeout(300)
def test_the_learner_trains_on_the_gpu_of_a_host_that_has_one(redis_cfg, demo_policy, tmp_path):
    cfg = _config(
        redis_cfg,
        demo_policy,
        redis_cfg.run.name,
        tmp_path,
        run={"max_steps": 2},
        weightsync={"transport": "shm"},
    )
    xadd_groups(cfg, _stream_of(demo_policy, 2, seed=5))
    env = _env()
    env.pop("DS_ACCELERATOR")
    proc = subprocess.run(
        [sys.executable, "-m", "streamrl.learner", *_overrides(cfg)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    rows = [json.loads(line) for line in (Path(cfg.run.dir) / "learner_steps.jsonl").open()]
    assert [r["trained"] for r in rows] == [True, True]
    latest = Path(cfg.run.dir) / "checkpoints" / "latest"
    # no map_location: tensors come back on the device they were saved from
    module = torch.load(latest / "state" / "mp_rank_00_model_states.pt", weights_only=False)[
        "module"
    ]
    assert all(t.is_cuda for t in module.values())
    start = load_policy(demo_policy).state_dict()
    assert any(not torch.equal(t.float().cpu(), start[n].float()) for n, t in module.items())
