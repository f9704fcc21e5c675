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


DEFERRED = """
import torch
calls = []
real = torch.compile
torch.compile = lambda *a, **k: calls.append(a) or real(*a, **k)
from deepspeed.runtime import compiler
eager = compiler.compile
from streamrl.learner.engine import defer_muon_compile
defer_muon_compile()
import deepspeed.runtime.zero.muon.original_muon as muon
assert calls == [], calls
assert compiler.compile is eager
fn = muon.zeropower_via_newtonschulz5
assert fn.__wrapped__.__module__ == muon.__name__ and not hasattr(fn.__wrapped__, "__wrapped__")
g = torch.randn(6, 4, dtype=torch.float64)
fn(g, 1)
assert len(calls) == 1 and calls[0][0] is fn.__wrapped__, calls
fn(g, 1)
assert len(calls) == 1, calls
print("ok")
"""


def test_deepspeeds_muon_functions_are_compiled_at_their_first_call_not_at_import():
    # ~1.1 CPU-s of TorchDynamo set-up per learner start otherwise (docs/startup.md)
    done = subprocess.run(
        [sys.executable, "-c", DEFERRED],
        env=dict(_env(), TORCHDYNAMO_DISABLE="1"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
