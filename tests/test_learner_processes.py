"""The learner as real processes: two ZeRO-2 ranks under torchrun, and a SIGKILL followed by a resume."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import torch
from learner_rollouts import sample_groups, xadd_groups
from test_learner_sync import learner_config

from streamrl.broker.keys import Keys
from streamrl.configs import Config
from streamrl.policy.load import load_policy, load_tokenizer

ROOT = Path(__file__).resolve().parents[1]
GROUPS_PER_STEP = 4
TIMEOUT_S = 120


def _env() -> dict:
    # the inherited path is kept: a host whose packages were installed with --target (a lent GPU
    # machine's carried wheels) finds them only through it
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        # the pytest process may have set them up for its own in-process learner
        env.pop(var, None)
    return env


def _overrides(cfg: Config) -> list[str]:
    """The same config on a command line: learner processes take dotted overrides."""
    flat = []
    for section in (
        "run",
        "broker",
        "model",
        "rollout",
        "learner",
        "algo",
        "weightsync",
        "metrics",
    ):
        for key, value in getattr(cfg, section).model_dump(exclude_defaults=True).items():
            flat.append(f"{section}.{key}={json.dumps(value)}")
    return flat


def _stream_of(policy: str, steps: int, seed: int) -> list:
    groups = sample_groups(
        load_policy(policy),
        load_tokenizer(policy),
        random.Random(seed),
        steps * GROUPS_PER_STEP,
        8,
        0,
    )
    return groups


def _in_process_weights(cfg: Config) -> dict[str, torch.Tensor]:
    from streamrl.learner.grpo import GRPO

    learner = GRPO(cfg)
    learner.run(echo=lambda line: None)
    return {n: p.detach().clone() for n, p in learner.model.named_parameters()}


def _checkpoint_weights(cfg: Config) -> dict[str, torch.Tensor]:
    latest = Path(cfg.run.dir) / "checkpoints" / "latest"
    state = torch.load(
        latest / "state" / "mp_rank_00_model_states.pt", weights_only=False, map_location="cpu"
    )
    return state["module"]


def _steps_logged(cfg: Config) -> list[dict]:
    path = Path(cfg.run.dir) / "learner_steps.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _assert_same_weights(actual: dict, expected: dict, atol: float) -> None:
    for name, value in expected.items():
        diff = (actual[name] - value).abs().max().item()
        assert diff <= atol, f"{name} differs by {diff:.2e}"


def _config(redis_cfg: Config, policy: str, name: str, tmp_path: Path, **sections) -> Config:
    base = Config.model_validate(
        {
            "run": {"name": name, "dir": str(tmp_path / name)},
            "broker": {"redis_url": redis_cfg.broker.redis_url},
        }
    )
    # the stream was sampled at version 0
    sections.setdefault("algo", {}).update(max_staleness=100)
    sections.setdefault("learner", {}).update(
        groups_per_step=GROUPS_PER_STEP, micro_batch_tokens=64
    )
    return learner_config(base, policy, **sections)


HARNESS = """
import sys, torch
torch.set_num_threads(1)
from streamrl.configs.load import load_config
from streamrl.learner.grpo import GRPO
learner = GRPO(load_config(None, sys.argv[2:]))
learner.run(echo=print)
torch.save({n: p.detach() for n, p in learner.model.named_parameters()}, f"{sys.argv[1]}-{learner.rank}.pt")
"""


def two_rank_command(cfg: Config, tmp_path: Path) -> tuple[list[str], Path]:
    """torchrun over HARNESS with two ranks on ``cfg``; each rank saves its weights to
    ``{out}-{rank}.pt``. Returns (command, out)."""
    script = tmp_path / "harness.py"
    script.write_text(HARNESS)
    out = tmp_path / "weights"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script), str(out), *_overrides(cfg)]  # fmt: skip
    return cmd, out


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_zero2_ranks_under_torchrun_train_identical_weights_equal_to_one_rank(
    redis_cfg, demo_policy, tmp_path
):
    run_id = redis_cfg.run.name
    two = _config(redis_cfg, demo_policy, f"{run_id}-two", tmp_path, run={"max_steps": 3})
    one = _config(redis_cfg, demo_policy, f"{run_id}-one", tmp_path, run={"max_steps": 3})
    groups = _stream_of(demo_policy, 3, seed=3)
    xadd_groups(two, groups)
    xadd_groups(one, groups)
    cmd, out = two_rank_command(two, tmp_path)
    proc = subprocess.run(
        cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rank0, rank1 = torch.load(f"{out}-0.pt"), torch.load(f"{out}-1.pt")
    _assert_same_weights(rank1, rank0, atol=0.0)
    assert len(_steps_logged(two)) == 3
    # Two ranks sum the same gradients in another order than one rank: equal to float tolerance.
    _assert_same_weights(rank0, _in_process_weights(one), atol=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_sigkilled_learner_resumes_from_checkpoint_with_nothing_lost_or_trained_twice(
    redis_cfg, demo_policy, tmp_path
):
    run_id, steps = redis_cfg.run.name, 5
    common = dict(
        run={"max_steps": steps},
        learner={"checkpoint_every": 2, "ack_policy": "checkpoint", "read_timeout_s": 60},
    )
    # The killed learner also serves metrics and publishes weights over shm, as in a real run.
    killed = _config(
        redis_cfg, demo_policy, f"{run_id}-killed", tmp_path,
        metrics={"enabled": True}, weightsync={"transport": "shm"}, **common,
    )  # fmt: skip
    straight = _config(redis_cfg, demo_policy, f"{run_id}-straight", tmp_path, **common)
    groups = _stream_of(demo_policy, steps, seed=5)
    xadd_groups(straight, groups)

    # Three steps and half of the fourth are in the stream: the learner trains 3, checkpoints after 2,
    # holds 2 entries of step 4 and waits. SIGKILL it there.
    cut = 3 * GROUPS_PER_STEP + GROUPS_PER_STEP // 2
    xadd_groups(killed, groups[:cut])
    cmd = [sys.executable, "-m", "streamrl.learner", *_overrides(killed)]
    first = subprocess.Popen(
        cmd, env=_env(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + TIMEOUT_S
    while len(_steps_logged(killed)) < 3:
        assert first.poll() is None, first.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "learner did not train 3 steps in time"
        time.sleep(0.1)
    time.sleep(0.5)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    keys = Keys.from_config(killed.run, killed.broker)
    client = redis.Redis.from_url(killed.broker.redis_url)
    try:
        # only the checkpointed steps are acked
        assert client.scard(keys.trained) == 2 * GROUPS_PER_STEP

        xadd_groups(killed, groups[cut:])
        second = subprocess.run(
            cmd, env=_env(), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S
        )
        assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
        assert client.scard(keys.trained) == steps * GROUPS_PER_STEP
        # every entry acked (and deleted), none left pending
        assert client.xlen(keys.stream) == 0
        # the killed learner had announced version 3; its successor re-publishes the step-2
        # checkpoint as version 4 (learner.lineage), so step 5 is version 7
        assert int(client.get(keys.version)) == steps + 2
        # the endpoint was unregistered on shutdown
        assert client.hlen(keys.metrics_targets) == 0
    finally:
        client.close()
    # step 3 replayed once
    assert [r["step"] for r in _steps_logged(killed)] == [1, 2, 3, 3, 4, 5]
    _assert_same_weights(_checkpoint_weights(killed), _in_process_weights(straight), atol=1e-6)
