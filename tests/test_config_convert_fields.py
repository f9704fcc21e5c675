"""`streamrl config convert` drops nothing: every field of the installed TRL config classes and of
verl's pinned `ppo_trainer.yaml` is accounted for, the doc's tables are the converter's, and the
fields that interact convert together (a schedule with its horizon, warm-up ratios, reward weights).

Pure and fast: no model, no run; TRL's classes are only read (`dataclasses.fields`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from pathlib import Path

import pytest
import yaml

from streamrl.configs import ConfigError, load_config
from streamrl.configs.__main__ import main
from streamrl.configs.convert import _schema_leaves, convert
from streamrl.configs.convert_doc import tables
from streamrl.configs.convert_fields import CATALOGUES, entry
from streamrl.configs.convert_rules import RULES
from streamrl.configs.convert_verl_fields import VERL

ROOT = Path(__file__).resolve().parents[1]
VERL_KEYS = ROOT / "tests" / "data" / "verl_v0.7.0_ppo_trainer_keys.txt"
CLASSES = {"trl": "GRPOConfig", "trl-sft": "SFTConfig", "trl-dpo": "DPOConfig"}


def _trl_class(dialect: str):
    trl = pytest.importorskip("trl")  # the bench extra
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(trl, CLASSES[dialect])


def _verl_keys() -> list[str]:
    lines = VERL_KEYS.read_text().splitlines()
    return [ln for ln in lines if ln and not ln.startswith("#")]


@pytest.mark.parametrize("dialect", list(CLASSES))
def test_every_field_of_the_installed_trl_class_has_an_entry(dialect):
    fields = {f.name for f in dataclasses.fields(_trl_class(dialect))}
    assert sorted(fields - set(CATALOGUES[dialect])) == []


def test_every_key_of_verls_pinned_ppo_trainer_yaml_has_an_entry_and_no_entry_is_stale():
    keys = _verl_keys()
    assert len(keys) > 500
    assert [k for k in keys if entry("verl", k) is None] == []
    assert sorted(set(VERL) - set(keys)) == []


def test_docs_migrating_holds_the_tables_the_catalogue_writes():
    page = (ROOT / "docs" / "migrating.md").read_text()
    assert tables() in page, "run: python -m streamrl.configs.convert_doc"


def _keys() -> set[str]:
    return {k for keys in _schema_leaves().values() for k in keys} | {
        f"supervised.{n}" for n in ("epochs", "batch_size", "max_length", "beta", "loss", "shuffle")
    }


@pytest.mark.parametrize("dialect", list(CATALOGUES))
def test_each_entry_is_a_schema_key_a_rule_a_list_of_accepted_values_or_a_refusal(dialect):
    rules, keys = RULES[dialect], _keys()
    for name, e in CATALOGUES[dialect].items():
        if name in rules:
            assert e.status != "refused", name
        elif e.status == "refused":
            assert e.note, name
        elif e.target == "-":
            assert e.only and e.note, name
        else:
            assert e.target in keys, (name, e.target)
    assert sorted(set(rules) - set(CATALOGUES[dialect])) == []


@pytest.mark.parametrize("dialect", list(CLASSES))
def test_the_installed_classes_defaults_convert_as_the_catalogue_says(dialect):
    cls = _trl_class(dialect)
    defaults = {
        f.name: getattr(cls, f.name, f.default)
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING and f.default is not None
    }
    defaults = yaml.safe_load(yaml.safe_dump(defaults))  # as a YAML file holds them
    _settings, rows = convert(defaults, dialect, {"trl": "demo_cpu"}.get(dialect, "sft_cpu"))
    by = {r.field: r for r in rows}
    assert set(by) == set(defaults)
    for name, row in by.items():
        e = CATALOGUES[dialect][name]
        if e.status == "refused":
            assert (row.status, row.note) == ("refused", e.note), name
        elif name not in RULES[dialect] and e.target != "-" and row.status != "refused":
            # (refused here: the loader's reason for the value, e.g. a vLLM knob on hf actors)
            assert row.target.startswith(f"{e.target}="), (name, row)


def test_cosine_with_max_steps_in_the_same_file_maps_and_without_a_horizon_is_refused():
    settings, rows = convert({"lr_scheduler_type": "cosine", "max_steps": 500}, "trl")
    assert settings == {"learner.lr_scheduler": "cosine", "run.max_steps": 500}
    assert {r.status for r in rows} == {"mapped"}
    settings, rows = convert({"lr_scheduler_type": "cosine"}, "trl")
    assert settings == {} and "run.max_steps" in rows[0].note
    _settings, rows = convert({"lr_scheduler_type": "cosine_with_restarts"}, "trl")
    assert rows[0].status == "refused" and "cosine" in rows[0].note
    settings, _rows = convert(
        {"actor_rollout_ref": {"actor": {"optim": {"lr_scheduler_type": "cosine"}}},
         "trainer": {"total_training_steps": 300}},
        "verl",
    )  # fmt: skip
    assert settings == {"learner.lr_scheduler": "cosine", "run.max_steps": 300}


def test_a_warm_up_ratio_becomes_the_same_share_of_the_runs_optimizer_steps():
    base = load_config("demo_cpu", env={}).learner
    per = base.minibatches * base.updates_per_batch
    for tree in ({"warmup_ratio": 0.1, "max_steps": 500}, {"warmup_steps": 0.1, "max_steps": 500}):
        settings, rows = convert(tree, "trl", "demo_cpu")
        assert settings["learner.warmup_steps"] == math.ceil(0.1 * 500 * per)
        assert rows[0].status == "approximated" and "ceil(0.1 x 500 steps" in rows[0].note
    settings, rows = convert({"warmup_ratio": 0.1}, "trl")
    assert "learner.warmup_steps" not in settings and rows[0].status == "refused"
    optim = {"lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.05, "total_training_steps": 200}
    tree = {"actor_rollout_ref": {"actor": {"optim": optim, "ppo_epochs": 2}}}
    settings, _rows = convert(tree, "verl")
    assert settings["learner.warmup_steps"] == math.ceil(0.05 * 200 * 2)


def test_reward_weights_weigh_the_files_functions_or_the_bases_and_a_count_mismatch_is_one_line():
    settings, _rows = convert({"reward_funcs": ["math", "gsm8k"], "reward_weights": [1, 2]}, "trl")
    assert settings["reward.functions"] == [
        {"fn": "math", "weight": 1},
        {"fn": "gsm8k", "weight": 2},
    ]
    functions = load_config("demo_cpu", env={}).reward.functions
    weights = [0.5 + i for i in range(len(functions))]
    settings, rows = convert({"reward_weights": weights}, "trl", "demo_cpu")
    # the base's own reward functions are no new code: mapped, live
    assert rows[0].status == "mapped"
    assert [f["weight"] for f in settings["reward.functions"]] == weights
    assert [f["fn"] for f in settings["reward.functions"]] == [f.fn for f in functions]
    with pytest.raises(ConfigError) as err:
        convert({"reward_funcs": ["math", "gsm8k"], "reward_weights": [1.0]}, "trl")
    assert "\n" not in str(err.value) and "reward_weights" in str(err.value)
    with pytest.raises(ConfigError, match="reward_weights"):
        convert({"reward_weights": weights + [1.0]}, "trl", "demo_cpu")


def test_chat_template_kwargs_and_verls_reward_file_template_and_resume_mode_are_not_lost():
    kwargs = {"enable_thinking": False}
    settings, rows = convert({"chat_template_kwargs": kwargs}, "trl")
    assert settings == {"rollout.chat_template_kwargs": kwargs}
    tree = {
        "data": {"apply_chat_template_kwargs": kwargs},
        "custom_reward_function": {"path": "my_reward.py", "name": "score"},
        "trainer": {"resume_mode": "auto"},
    }
    settings, rows = convert(tree, "verl")
    by = {r.field: r for r in rows}
    assert settings == {"rollout.chat_template_kwargs": kwargs}
    assert by["custom_reward_function.path"].status == "code reference"
    assert by["custom_reward_function.path"].held[0][1] == [{"fn": "my_reward.py:score"}]
    assert by["trainer.resume_mode"].status == "mapped"
    _settings, rows = convert({"trainer": {"resume_mode": "disable"}}, "verl")
    assert rows[0].status == "approximated" and "--overwrite" in rows[0].note
    _settings, rows = convert({"trainer": {"resume_mode": "resume_path"}}, "verl")
    assert rows[0].status == "refused" and "run.dir" in rows[0].note


def test_an_accepted_value_maps_to_streamrls_behaviour_and_another_is_refused_with_the_note():
    _settings, rows = convert({"optim": "adamw_torch", "adam_epsilon": 1e-6}, "trl")
    by = {r.field: r for r in rows}
    assert by["optim"].status == "mapped"
    assert by["adam_epsilon"].status == "refused" and "1e-8" in by["adam_epsilon"].note
    settings, rows = convert({"model_init_kwargs": {"torch_dtype": "bfloat16",
                                                    "attn_implementation": "sdpa"}}, "trl")  # fmt: skip
    assert settings == {
        "model.dtype": "bfloat16",
        "model.init_kwargs": {"attn_implementation": "sdpa"},
    }


def test_trls_sft_and_dpo_configs_convert_into_streamrl_sft_and_dpo_configs(tmp_path):
    sft = {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 4,
           "num_train_epochs": 2.5, "max_length": 512, "packing": True, "learning_rate": 2e-5}  # fmt: skip
    settings, _rows = convert({**sft, "max_steps": 100, "warmup_ratio": 0.1}, "trl-sft", "sft_cpu")
    # an SFT step is one optimizer step, whatever the base's RL minibatches
    assert settings["learner.warmup_steps"] == 10
    assert settings["supervised.batch_size"] == 32 and settings["supervised.epochs"] == 3
    assert settings["supervised.max_length"] == 512 and settings["learner.lr"] == 2e-5
    (tmp_path / "dpo.yaml").write_text("beta: 0.2\nloss_type: [ipo]\nmax_steps: 40\n")
    out = tmp_path / "mine.yaml"
    assert main(["convert", "--from", "trl-dpo", str(tmp_path / "dpo.yaml"),
                 "--base", "dpo_cpu", "--out", str(out)]) == 0  # fmt: skip
    cfg = load_config(out, env={})
    assert (cfg.supervised.beta, cfg.supervised.loss, cfg.run.max_steps) == (0.2, "ipo", 40)
    # DPO's beta is the preference loss's, not GRPO's KL coefficient
    assert cfg.algo.kl_coef == load_config("dpo_cpu", env={}).algo.kl_coef


def test_a_trl_file_of_another_class_stops_naming_the_from_to_use():
    with pytest.raises(ConfigError, match="packing is not a field of --from trl: --from trl-sft"):
        convert({"beta": 0.1, "packing": True}, "trl")
    with pytest.raises(ConfigError, match="--from trl-dpo"):
        convert({"beta": 0.1, "precompute_ref_log_probs": True}, "trl-sft")
