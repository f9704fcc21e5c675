"""A short real learner run (Redis stream -> DeepSpeed ZeRO-2) leaves an exported Hugging Face policy
and TensorBoard event files with every scalar of its step rows and sample completions."""

from __future__ import annotations

import json
import random

import pytest
import torch
from learner_rollouts import sample_groups, xadd_groups

from streamrl.configs import Config
from streamrl.policy.load import load_policy, load_tokenizer

STEPS = 2


@pytest.fixture
def trained(redis_cfg, demo_policy):
    """A learner that trained STEPS steps on demo rollouts and stopped (checkpointed, exported)."""
    from streamrl.learner.grpo import GRPO

    model, tokenizer = load_policy(demo_policy), load_tokenizer(demo_policy)
    groups = sample_groups(model, tokenizer, random.Random(3), 4 * STEPS * 2, 8, version=0)
    xadd_groups(redis_cfg, groups)
    cfg = Config.model_validate(
        {
            "run": {
                "name": redis_cfg.run.name,
                "dir": redis_cfg.run.dir,
                "max_steps": STEPS,
                "log_samples_every": 2,
            },
            "broker": {"redis_url": redis_cfg.broker.redis_url, "block_ms": 200},
            "model": {"path": demo_policy},
            "rollout": {"group_size": 8},
            "learner": {"groups_per_step": 4, "read_timeout_s": 3.0, "lr": 1e-3},
            "weightsync": {"transport": "none"},
            "metrics": {"enabled": False},
        }
    )
    learner = GRPO(cfg)
    progress = learner.run(echo=lambda line: None)
    assert progress.step == STEPS
    return cfg, learner


def _generate(folder) -> list[int]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    ids = torch.tensor([tokenizer.encode("123>")])
    out = model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.timeout(240)
def test_the_run_ends_with_a_from_pretrained_policy_equal_to_the_learners(trained, demo_policy):
    from transformers import AutoModelForCausalLM

    from streamrl.learner import export

    cfg, learner = trained
    folder = export.default_out(cfg.run.dir)
    assert (folder / "model.safetensors").exists() and (folder / "config.json").exists()
    assert json.loads((folder / export.INFO_FILE).read_text())["step"] == STEPS
    exported = AutoModelForCausalLM.from_pretrained(folder)
    live = dict(learner.model.named_parameters())
    for name, param in exported.named_parameters():
        assert torch.equal(param, live[name]), name
    initial = load_policy(demo_policy)
    assert not torch.equal(initial.lm_head.weight, exported.lm_head.weight)
    assert len(_generate(folder)) >= 1

    # the CLI rebuilds the same folder from the DeepSpeed checkpoint
    out = folder.parent / "from-checkpoint"
    code = export.main([f"run.dir={cfg.run.dir}", f"model.path={demo_policy}", "--out", str(out)])
    assert code == 0
    again = AutoModelForCausalLM.from_pretrained(out)
    for (name, a), b in zip(exported.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert _generate(out) == _generate(folder)


def test_export_without_a_checkpoint_is_a_clear_error(tmp_path, capsys, demo_policy):
    from streamrl.learner import export

    code = export.main([f"run.dir={tmp_path}", f"model.path={demo_policy}"])
    assert code == 2
    assert "no checkpoint under" in capsys.readouterr().err


@pytest.mark.timeout(240)
def test_tensorboard_holds_every_scalar_of_the_step_rows_and_a_samples_table(trained):
    from pathlib import Path

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from streamrl.learner.tracking import TENSORBOARD_DIR, scalars

    cfg, _learner = trained
    rows = [json.loads(line) for line in (Path(cfg.run.dir) / "learner_steps.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2]
    events = EventAccumulator(str(Path(cfg.run.dir) / TENSORBOARD_DIR))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"loss", "reward_mean", "kl", "entropy", "grad_norm", "step_s"} <= tags
    assert {"reward_parts/reverse_digits/position", "reward_parts/reverse_digits/stop"} <= tags
    for row in rows:
        for name, value in scalars(row).items():
            logged = {e.step: e.value for e in events.Scalars(name)}
            assert logged[row["step"]] == pytest.approx(value, rel=1e-6), name
    # log_samples_every=2: a table at step 2, none at step 1
    texts = events.Tensors("samples/text_summary")
    assert [t.step for t in texts] == [2]
    table = texts[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| prompt | completion | reward | advantage |") and ">" in table
