"""A multi-turn actor process against a real Redis: it publishes trajectories with their loss
masks and what they did (turns, step time, ends), a raising environment ends only its own
trajectories, and its Prometheus endpoint counts them (the vLLM engine's run:
test_actors_vllm_multiturn)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import pytest
import redis

from streamrl.broker.keys import Keys
from streamrl.broker.wire import decode_group
from streamrl.configs import Config
from streamrl.examples.multiturn import feedback
from streamrl.examples.reverse_digits.task import EOS
from streamrl.policy.load import load_tokenizer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BOUND = 6
ROWS = ["123", "214", "305", "436", "547", "658"]


def test_multiturn_actor_publishes_masked_trajectories_and_survives_a_raising_env(
    redis_server, tmp_path, multiturn_policy
):
    check_multiturn_actor(redis_server, tmp_path, multiturn_policy, "actor.engine=hf")


def check_multiturn_actor(redis_server, tmp_path, policy, *extra: str) -> None:
    """An actor process (``extra``: more overrides, e.g. its engine) publishes the demo's
    two-attempt trajectories with their loss masks, through a raising environment."""
    tokenizer = load_tokenizer(str(policy))
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{n}>", "answer": n[::-1]}) + "\n" for n in ROWS)
    )
    run_name = f"multiturn-{uuid.uuid4().hex[:8]}"
    overrides = [
        f"run.name={run_name}",
        f"run.dir={tmp_path / 'run'}",
        f"broker.redis_url={redis_server.url}",
        f"model.path={policy}",
        f"data.path={data}",
        "env.name=multiturn_envs:Flaky",
        "rollout.group_size=4",
        "actor.batch_slots=8",
        f"learner.groups_per_step={BOUND}",
        "algo.max_staleness=0",
        "weightsync.transport=none",
        *extra,
    ]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{ROOT / 'tests'}", OMP_NUM_THREADS="1")
    with open(tmp_path / "actor.log", "w") as log:
        actor = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamrl.actors",
                "--config",
                "examples/multiturn/config.yaml",
                "--actor-id",
                "a",
                *overrides,
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    cfg = Config.model_validate(
        {
            "run": {"name": run_name},
            "learner": {"groups_per_step": BOUND},
            "algo": {"max_staleness": 0},
        }
    )
    keys = Keys.from_config(cfg.run, cfg.broker)
    client = redis.Redis.from_url(redis_server.url)
    try:
        deadline = time.monotonic() + 300
        while client.xlen(keys.stream) < BOUND:
            assert actor.poll() is None, (tmp_path / "actor.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "timed out waiting for the groups"
            time.sleep(0.2)
        groups = [decode_group(f[b"g"]) for _, f in client.xrange(keys.stream)]
        # it stopped at the admission bound, alive, through the raising rows
        assert len(groups) == BOUND and actor.poll() is None
        for g in groups:
            answer = ROWS[int(g.meta["row"])][::-1]
            prompt = tokenizer.decode(g.prompt_token_ids.tolist(), skip_special_tokens=False)
            assert prompt == ROWS[int(g.meta["row"])] + ">"
            # the group's env map: one step per model turn (the mask's runs of 1), one end each
            turns = sum(int(np.diff(c.loss_mask, prepend=0).clip(0).sum()) for c in g.completions)
            ends = "end/error" if int(answer[0]) % 2 == 0 else "end/done"
            assert {k: v for k, v in g.env.items() if k != "step_s"} == {
                "turns": turns,
                "steps": turns,
                "tool_calls": 0,
                ends: len(g.completions),
            }
            assert g.env["step_s"] > 0
            for c in g.completions:
                assert c.loss_mask is not None and c.ref_logprobs is not None
                mask = c.loss_mask.astype(bool)
                if int(answer[0]) % 2 == 0:
                    # the raising step ended the trajectory after its first turn, flagged truncated
                    assert mask.all() and c.finish_reason == "length"
                    continue
                assert c.finish_reason == "stop"
                if mask.all():
                    # right at once: one turn, no environment tokens
                    assert (
                        tokenizer.decode(c.token_ids.tolist(), skip_special_tokens=False)
                        == answer + EOS
                    )
                    continue
                # model turn, environment tokens (mask 0: the hint), model turn
                edges = np.flatnonzero(np.diff(mask.astype(np.int8)))
                assert len(edges) == 2
                first = c.token_ids[: edges[0] + 1].tolist()
                env_tokens = c.token_ids[edges[0] + 1 : edges[1] + 1].tolist()
                attempt = tokenizer.decode(first, skip_special_tokens=False).removesuffix(EOS)
                # the template closes the turn after the model's own end-of-sequence
                assert tokenizer.decode(env_tokens, skip_special_tokens=False) == (
                    "<|im_end|>" + feedback(prompt, answer, attempt)
                )
                assert (c.logprobs[~mask] == 0).all()
        assert "environment step failed" in (tmp_path / "actor.log").read_text()
        # the actor's Prometheus endpoint counts the same trajectories (and maybe a few more,
        # generated past the admission bound's check and not published)
        target = client.hget(keys.metrics_targets, "actor:a").decode()
        with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as response:
            metrics = _samples(response.read().decode())
        published = sum(g.env["steps"] for g in groups)
        assert metrics["streamrl_actor_env_step_seconds_count"] >= published
        assert metrics["streamrl_actor_env_turns_total"] >= sum(g.env["turns"] for g in groups)
        errors = sum(g.env.get("end/error", 0) for g in groups)
        assert metrics['streamrl_actor_env_trajectories_total{reason="error"}'] >= errors > 0
        assert metrics["streamrl_actor_env_tool_calls_total"] == 0
        actor.send_signal(signal.SIGTERM)
        assert actor.wait(timeout=60) == 0
    finally:
        if actor.poll() is None:
            actor.kill()
            actor.wait()
        client.close()


def _samples(text: str) -> dict[str, float]:
    """The Prometheus text format's samples, name{labels} -> value."""
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }
