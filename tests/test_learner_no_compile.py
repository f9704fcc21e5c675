"""A fresh learner compiles nothing: DeepSpeed's torch-extensions cache stays empty on every start."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from learner_rollouts import xadd_groups
from test_learner_processes import ROOT, _config, _env, _overrides, _stream_of

TIMEOUT_S = 120


def _contents(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_learner_process_starts_and_trains_without_building_a_torch_extension(
    redis_cfg, demo_policy, tmp_path
):
    cfg = _config(redis_cfg, demo_policy, redis_cfg.run.name, tmp_path, run={"max_steps": 1})
    xadd_groups(cfg, _stream_of(demo_policy, 1, seed=11))
    extensions = tmp_path / "torch_extensions"
    extensions.mkdir()
    env = dict(_env(), TORCH_EXTENSIONS_DIR=str(extensions))
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.learner", *_overrides(cfg)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + TIMEOUT_S
    try:
        # a compile writes its build folder within seconds and then runs for ~90 s: fail at once
        while proc.poll() is None and not _contents(extensions):
            assert time.monotonic() < deadline, "learner did not finish its step in time"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        out = proc.communicate(timeout=30)[0]
    assert _contents(extensions) == [], out[-3000:]
    assert proc.returncode == 0, out[-3000:]
    assert "built successfully" not in out
    # it trained, so every start-up path ran
    assert "step     1" in out
