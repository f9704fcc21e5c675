"""`streamrl config convert`: TRL's GRPOConfig defaults and verl's GRPO example, field by field.

The fixtures (tests/data) are TRL 1.16's dataclass defaults and verl's
examples/grpo_trainer/run_qwen2-7b.sh written out as YAML. Each converted onto the demo preset
loads; a 5-step demo run of each is in docs/migrating.md ("Converting a config").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamrl.configs import load_config
from streamrl.configs.__main__ import main
from streamrl.configs.convert import convert

DATA = Path(__file__).parent / "data"


def _rows(dialect: str, name: str, base: str | None = "demo_cpu"):
    tree = yaml.safe_load((DATA / name).read_text())
    settings, rows = convert(tree, dialect, base)
    return tree, settings, {r.field: r for r in rows}


def test_trls_grpo_defaults_convert_field_by_field_onto_the_demo_and_load(tmp_path):
    tree, settings, rows = _rows("trl", "trl_grpo_defaults.yaml")
    # every field of the file gets exactly one row
    assert set(rows) == set(tree)
    assert settings["rollout.group_size"] == 8
    assert settings["rollout.max_new_tokens"] == 512
    assert settings["learner.lr"] == 1e-6
    assert settings["learner.betas"] == [0.9, 0.999]
    assert settings["run.report_to"] == []
    # TRL clips both sides at epsilon while epsilon_high is unset
    assert (settings["algo.clip_low"], settings["algo.clip_high"]) == (0.2, 0.2)
    assert rows["epsilon"].status == "mapped"
    # loss_type dapo normalises by the batch's tokens; scale_rewards group is GRPO's std scaling
    assert settings["algo.aggregation"] == "token_mean"
    assert settings["algo.advantage"] == "grpo"
    assert rows["per_device_train_batch_size"].status == "approximated"
    assert settings["learner.groups_per_step"] == 1
    assert rows["max_steps"].status == "refused"
    assert "num_train_epochs" in rows["max_steps"].note
    assert rows["vllm_mode"].status == "refused"
    assert rows["epsilon_high"].status == "unset"
    assert rows["log_completions"].target == "run.log_samples_every=0"
    out, victim = tmp_path / "trl.yaml", tmp_path / "victim"
    victim.write_text("kept\n")
    out.symlink_to(victim)  # planted at --out: replaced, never written through
    assert main(["convert", "--from", "trl", str(DATA / "trl_grpo_defaults.yaml"),
                 "--base", "demo_cpu", "--out", str(out)]) == 0  # fmt: skip
    assert victim.read_text() == "kept\n" and not out.is_symlink()
    cfg = load_config(out, env={})
    assert cfg.rollout.group_size == 8 and cfg.algo.aggregation == "token_mean"
    assert cfg.run.seed == 42 and cfg.learner.checkpoint_every == 500
    # the demo's own settings stay where TRL's file says nothing
    assert cfg.model.path == load_config("demo_cpu", env={}).model.path


def test_verls_grpo_example_converts_field_by_field_onto_the_demo_and_loads(tmp_path, capsys):
    tree, settings, rows = _rows("verl", "verl_grpo_qwen2_7b.yaml")
    leaves = {r for r in rows}
    assert "actor_rollout_ref.actor.fsdp_config.param_offload" in leaves
    assert settings["model.path"] == "Qwen/Qwen2-7B-Instruct"
    assert settings["rollout.group_size"] == 5
    assert settings["learner.groups_per_step"] == 1024
    # verl counts mini-batch prompts, streamrl mini-batches: 1024 / 256
    assert settings["learner.minibatches"] == 4
    assert settings["algo.kl_coef"] == 0.001
    assert settings["run.report_to"] == ["wandb"]
    assert settings["actor.engine"] == "vllm"
    assert rows["trainer.n_gpus_per_node"].status == "approximated"
    assert rows["actor_rollout_ref.actor.fsdp_config.param_offload"].status == "refused"
    assert rows["actor_rollout_ref.actor.kl_loss_type"].status == "mapped"
    assert main(["convert", "--from", "verl", str(DATA / "verl_grpo_qwen2_7b.yaml"),
                 "--base", "demo_cpu"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    (tmp_path / "verl.yaml").write_text(out)
    cfg = load_config(tmp_path / "verl.yaml", env={})
    assert cfg.learner.minibatches == 4 and cfg.run.name == "qwen2_7b_function_rm"
    assert "| `trainer.nnodes` | `1` | refused |" in err
    assert "approximated" in err.splitlines()[-1]


def test_a_value_the_schema_rejects_or_a_second_value_for_one_key_is_refused_with_why():
    settings, rows = convert(
        {"num_generations": 0, "loss_type": "dr_grpo", "scale_rewards": "batch"}, "trl"
    )
    by = {r.field: r for r in rows}
    assert by["num_generations"].status == "refused"
    assert "rollout.group_size" in by["num_generations"].note
    assert "rollout.group_size" not in settings
    # dr_grpo sets the unscaled advantage itself
    assert settings["algo.advantage"] == "drgrpo" and by["scale_rewards"].status == "mapped"
    settings, rows = convert(
        {"algorithm": {"adv_estimator": "grpo", "norm_adv_by_std_in_grpo": False},
         "data": {"train_batch_size": 6},
         "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4}}},
        "verl",
    )  # fmt: skip
    by = {r.field: r for r in rows}
    assert settings["algo.advantage"] == "drgrpo"
    assert by["actor_rollout_ref.actor.ppo_mini_batch_size"].status == "refused"
    settings, rows = convert({"beta": 0.1, "kl_loss_coef": 0.2}, "verl")
    assert settings == {"algo.kl_coef": 0.1}
    assert "algo.kl_coef already 0.1 from beta" in rows[1].note


@pytest.mark.parametrize("base", [["--base", "demo_cpu"], []], ids=["onto-the-demo", "alone"])
def test_a_converted_trl_config_stops_the_run_naming_model_path_and_makes_nothing(tmp_path, base):
    """The documented recipe on a model that is not cached: the run stops at start in one line
    naming model.path; no run directory, no model folder, nothing trained (the demo preset's
    policy is never built in its place)."""
    work = tmp_path / "work"
    work.mkdir()
    grpo = work / "grpo.yaml"
    grpo.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct\nlearning_rate: 1.0e-6\n")
    out = work / "converted.yaml"
    assert main(["convert", "--from", "trl", str(grpo), *base, "--out", str(out)]) == 0
    # an empty hub cache, kept to: the model is not there and nothing is downloaded
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1")
    env.pop("REDIS_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "streamrl", "run", "--config", str(out), "--actors", "1"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    # the one line is all the terminal shows: nothing on stdout about stopping what never started
    assert done.returncode == 2 and len(lines) == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert not done.stdout.strip(), done.stdout[-2000:]
    assert "model.path 'Qwen/Qwen2.5-0.5B-Instruct'" in lines[0]
    assert sorted(p.name for p in work.rglob("*")) == ["converted.yaml", "grpo.yaml"]
    assert not (tmp_path / "hf").exists() or not any((tmp_path / "hf").rglob("*.safetensors"))
