"""A run's inputs: a missing model or dataset stops the start naming its key; nothing is built."""

from __future__ import annotations

import pytest

from streamrl.actors import inputs
from streamrl.actors.prompt_data import PromptDataError
from streamrl.configs.errors import ConfigError
from streamrl.configs.schema import DataConfig, ModelConfig


def test_a_missing_model_or_dataset_is_an_error_naming_the_key_and_nothing_is_made(tmp_path):
    policy = tmp_path / "m"
    policy.mkdir()
    (tmp_path / "d.jsonl").write_text('{"prompt": "1>", "answer": "1"}\n')
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(FileNotFoundError, match="model.path"):
        inputs.check(
            ModelConfig(path=str(tmp_path / "no-policy")),
            DataConfig(path=str(tmp_path / "d.jsonl")),
        )
    with pytest.raises(PromptDataError, match="data.path: .*does not exist"):
        inputs.check(ModelConfig(path=str(policy)), DataConfig(path=str(tmp_path / "no.jsonl")))
    # nothing stood in for them
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("key", "path", "example"),
    [
        ("model.path", "runs/demo-policy", "demo"),
        ("data.path", "runs/demo-data/train.jsonl", "demo"),
        ("model.path", "./runs/longtail-policy/", "longtail"),
        ("data.path", "runs/longtail-data/train.jsonl", "longtail"),
    ],
)
def test_a_missing_example_path_names_the_command_that_makes_it(
    tmp_path, monkeypatch, key, path, example
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "d.jsonl").write_text('{"prompt": "1>", "answer": "1"}\n')
    paths = {"model.path": "m", "data.path": "d.jsonl", key: path}
    with pytest.raises(ConfigError) as err:
        inputs.check(ModelConfig(path=paths["model.path"]), DataConfig(path=paths["data.path"]))
    assert str(err.value) == (
        f"{key} {path!r} does not exist: make it with `streamrl example {example}`"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "m"]


@pytest.mark.parametrize(
    ("model", "data", "key"),
    [
        ({}, {"path": "d.jsonl"}, "model.path is not set"),
        # (the model is checked first: here one that is there)
        ({"path": "."}, {}, "data.path is not set"),
    ],
)
def test_an_unset_path_fails_naming_the_key(model, data, key):
    with pytest.raises(ConfigError, match=key):
        inputs.check(ModelConfig(**model), DataConfig(**data))


def test_a_run_without_reward_functions_stops_before_any_process_starts(tmp_path, demo_policy):
    import shutil

    from streamrl.configs import load_config
    from streamrl.launch.supervisor import Supervisor

    (tmp_path / "d.jsonl").write_text('{"prompt": "1>", "answer": "1"}\n')
    run_dir = tmp_path / "run"
    overrides = [
        f"run.dir={run_dir}",
        f"model.path={demo_policy}",
        f"data.path={tmp_path / 'd.jsonl'}",
    ]
    sup = Supervisor(load_config(None, overrides, env={}), actors=1, python=shutil.which("true"))
    with pytest.raises(ConfigError, match="reward.functions is empty"):
        sup.start()
    assert sup.learner is None and not sup.actors and not (run_dir / "redis").exists()


@pytest.mark.parametrize(
    "override",
    ["data.path=typo.jsonl", "model.path=no-such-org/no-such-model", "model.path=no-such-model"],
)
def test_a_typo_or_an_uncached_hub_id_over_the_demo_preset_stops_naming_its_key(
    tmp_path, monkeypatch, override
):
    """A path the user sets over the demo preset's is checked as any other: the start fails
    naming its key, and nothing is made, there, at the demo's paths or in the run directory."""
    import shutil

    from streamrl.configs import load_config
    from streamrl.launch.supervisor import Supervisor

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    (tmp_path / "d.jsonl").write_text('{"prompt": "1>", "answer": "1"}\n')
    key = override.partition("=")[0]
    other = "data.path=d.jsonl" if key == "model.path" else "model.path=m"
    cfg = load_config("demo_cpu", [override, other, "run.dir=run"], env={})
    # an existing run directory is left as it was
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises((FileNotFoundError, PromptDataError), match=key):
        Supervisor(cfg, actors=1, python=shutil.which("true")).start()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["d.jsonl", "m", "notes.txt", "run"]


@pytest.mark.parametrize(
    "overrides",
    [["model.build=streamrl.examples.reverse_digits:build_policy"], ["data.build=null"]],
)
def test_a_config_naming_a_removed_build_hook_stops_at_load_saying_what_replaced_it(overrides):
    from streamrl.configs import load_config

    key = overrides[0].partition("=")[0]
    with pytest.raises(ConfigError) as err:
        load_config("demo_cpu", overrides, env={})
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{key} (preset demo_cpu + overrides) was removed")
    assert "streamrl example" in line
