"""The config is one typed schema: presets validate, bad values fail at load naming the key and the reason."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from streamrl.configs import Config, ConfigError, load_config, parse_overrides, write_config
from streamrl.configs.reference import render
from streamrl.configs.renamed import RENAMED

PRESETS = sorted(Path("configs").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_every_shipped_preset_validates(preset):
    assert isinstance(load_config(preset, env={}), Config)


def test_dotted_overrides_are_typed_yaml_values():
    cfg = load_config(
        overrides=["learner.lr=1e-5", "rollout.stop=[a, b]", "broker.appendonly=true"], env={}
    )
    assert cfg.learner.lr == 1e-5
    assert cfg.rollout.stop == ["a", "b"]
    assert cfg.broker.appendonly is True


@pytest.mark.parametrize(
    ("override", "key", "reason"),
    [
        ("learner.lr=-1", "learner.lr", "greater than 0"),
        ("learner.lrr=1", "learner.lrr", "unknown key"),
        ("rollout.group_size=abc", "rollout.group_size", "valid integer"),
        ("actor.engine=tpu", "actor.engine", "'hf' or 'vllm'"),
        ("bogus.key=1", "bogus", "unknown key"),
        ("broker.block_ms=20000", "broker", "must be below socket_timeout_s"),
        # a host's files live at run.dir/hosts/<host_id>
        ("run.host_id=..", "run.host_id", "names a directory, not a host"),
    ],
)
def test_a_bad_value_names_the_key_and_the_reason(override, key, reason):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override], env={})
    message = str(err.value)
    assert f"  {key}:" in message and reason in message


@pytest.mark.parametrize("item", ["no_equals_sign", "=1", "a..b=1", "learner.lr=[unclosed"])
def test_a_malformed_override_is_refused(item):
    with pytest.raises(ConfigError, match="override"):
        parse_overrides([item])


def test_a_bad_file_names_the_file(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="missing.yaml"):
        load_config(missing, env={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner: [1, 2")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML"):
        load_config(bad, env={})
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(listy, env={})
    typo = tmp_path / "typo.yaml"
    typo.write_text("learner:\n  lr: 1e-4\n  warmup: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(typo, env={})
    assert "typo.yaml" in str(err.value) and "learner.warmup: unknown key" in str(err.value)


def test_a_target_part_the_task_does_not_report_is_refused():
    """Target parts are the reward functions' parts: ``fn`` or ``fn/key``; anything else never
    reaches its bar, so the run would never stop at its target."""
    ok = load_config("configs/demo_cpu.yaml", ["run.target_parts.reverse_digits/position=0.8"])
    assert ok.run.target_parts == {"reverse_digits_exact": 0.85, "reverse_digits/position": 0.8}
    with pytest.raises(ConfigError) as err:
        load_config("configs/demo_cpu.yaml", ["run.target_parts.exact=0.9"])
    assert "['exact'], not a reward part of this task" in str(err.value)
    assert "reverse_digits_exact" in str(err.value)


def test_the_schema_defaults_are_for_a_real_model_not_the_demo():
    cfg = Config()
    # TRL's GRPOConfig values: max_completion_length 256, learning_rate 1e-6, adam_beta2 0.999
    assert (cfg.rollout.max_new_tokens, cfg.learner.lr, cfg.learner.betas) == (
        256,
        1e-6,
        (0.9, 0.999),
    )
    # a run names its model, data and rewards; no key builds them
    assert (cfg.model.path, cfg.data.path, cfg.reward.functions) == ("", "", [])
    assert not {"build"} & (set(cfg.model.model_fields) | set(cfg.data.model_fields))
    assert "demo" not in cfg.run.name and "demo" not in cfg.run.dir


def test_the_run_directory_follows_the_run_name_unless_set():
    assert load_config(overrides=["run.name=exp1"], env={}).run.dir == "runs/exp1"
    assert Config().run.dir == f"runs/{Config().run.name}"
    assert load_config(overrides=["run.name=a", "run.dir=/tmp/b"], env={}).run.dir == "/tmp/b"


@pytest.mark.parametrize(
    ("example", "config"),
    [
        ("demo", "configs/demo_cpu.yaml"),
        ("sft", "configs/sft_cpu.yaml"),
        ("dpo", "configs/dpo_cpu.yaml"),
        ("longtail", "configs/longtail_cpu.yaml"),
        ("multiturn", "examples/multiturn/config.yaml"),
    ],
)
def test_each_example_makes_the_paths_its_config_names(example, config):
    from operator import attrgetter

    from streamrl.configs.example_inputs import EXAMPLES
    from streamrl.examples.assets_cli import config_targets, makers

    cfg = load_config(config, env={})
    named = EXAMPLES[example]
    assert {key: attrgetter(key)(cfg) for key in named} == named
    assert set(makers()[example]) == set(named)
    assert {(key, path) for _, key, path in config_targets(config, [])} == set(named.items())


def test_a_config_of_ones_own_names_no_example_input():
    from streamrl.examples.assets_cli import config_targets

    assert config_targets("configs/gpu_gsm8k_qwen05b.yaml", []) == []
    assert config_targets("demo_cpu", ["model.path=mine", "data.path=mine.jsonl"]) == []


def test_redis_url_from_the_environment_wins():
    cfg = load_config(
        overrides=["broker.redis_url=redis://127.0.0.1:1/0"],
        env={"REDIS_URL": "redis://127.0.0.1:2/0"},
    )
    assert cfg.broker.redis_url == "redis://127.0.0.1:2/0"


def test_configuration_reference_is_generated_from_the_schema():
    committed = Path("docs/configuration.md").read_text()
    assert committed == render(), (
        "docs/configuration.md is stale: run `python -m streamrl.configs.reference > docs/configuration.md`"
    )


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_a_key_that_moved_fails_naming_where_it_went(old):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{old}=1"], env={})
    assert f"{old}: unknown key; {old} moved: it is " in str(err.value)
    assert all(new in str(err.value) for new in RENAMED[old])


def _schema_keys(model, prefix: str = "") -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            keys |= _schema_keys(field.annotation, f"{prefix}{name}.")
        else:
            keys.add(f"{prefix}{name}")
    return keys


def test_every_key_a_moved_key_names_is_a_key_of_the_schema():
    assert {new for news in RENAMED.values() for new in news} <= _schema_keys(Config)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["weightsync.dist.port=29700"],
            "weightsync.dist.port=29700 is set, but weightsync.transport=shm does not read it: "
            "leave it at its default (29600)",
        ),
        (
            ["weightsync.transport=dist", "weightsync.shm.slots=4"],
            "weightsync.shm.slots=4 is set, but weightsync.transport=dist does not read it",
        ),
        (
            ["actor.vllm.tensor_parallel_size=2"],
            "actor.vllm.tensor_parallel_size=2 is set, but no actor runs that engine",
        ),
    ],
)
def test_a_setting_of_a_backend_nobody_runs_is_refused_naming_it(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, overrides, env={})


def test_the_backends_that_run_read_their_settings_and_a_saved_config_loads_back(tmp_path):
    cfg = load_config(
        None,
        [
            "weightsync.transport=dist",
            "weightsync.dist.relay=true",
            "weightsync.dist.port=29700",
            "weightsync.dist.relay_slots=4",
            "actor.engines=[vllm, hf]",
            "actor.vllm.tensor_parallel_size=2",
            "actor.hf.cuda_graphs=off",
        ],
        env={},
    )
    assert (cfg.weightsync.options.port, cfg.weightsync.options.relay_slots) == (29700, 4)
    assert cfg.actor.gpus_per_actor == 2 and cfg.actor.computes_on == {"device", "gpu"}
    # a saved run config spells out every backend's defaults, and loads
    write_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml", env={}) == cfg
    # moved to another transport, it names what the new one would ignore
    with pytest.raises(ConfigError, match=re.escape("weightsync.dist.port=29700 is set")):
        load_config(tmp_path / "config.yaml", ["weightsync.transport=shm"], env={})
