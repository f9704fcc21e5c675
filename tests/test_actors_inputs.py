"""A run's inputs: a missing model or dataset is built only by the hook a config names for it."""

from __future__ import annotations

import json

import pytest

from streamrl.actors import inputs
from streamrl.actors.prompt_data import PromptDataError, PromptDataset
from streamrl.configs.errors import ConfigError
from streamrl.configs.schema import DataConfig, ModelConfig
from streamrl.examples.reverse_digits.task import build_tokenizer

HOOKS = """
import json, pathlib

def model(path, seed):
    pathlib.Path(path).mkdir()
    pathlib.Path(path, "made.json").write_text(json.dumps({"seed": seed}))

def data(path, seed):
    pathlib.Path(path).write_text(json.dumps({"prompt": "1>", "answer": str(seed)}) + "\\n")
"""


def test_hooks_build_a_missing_model_and_dataset_once_with_the_run_seed(tmp_path):
    (tmp_path / "hooks.py").write_text(HOOKS)
    hooks = tmp_path / "hooks.py"
    model = ModelConfig(path=str(tmp_path / "m"), build=f"{hooks}:model")
    data = DataConfig(path=str(tmp_path / "d.jsonl"), build=f"{hooks}:data")
    said: list[str] = []
    inputs.prepare(model, data, seed=7, announce=said.append)
    assert json.loads((tmp_path / "m" / "made.json").read_text()) == {"seed": 7}
    assert len(PromptDataset.from_config(data, build_tokenizer())) == 1
    assert len(said) == 2 and "model.build" in said[0] and "data.build" in said[1]
    # what exists is never rebuilt
    (tmp_path / "m" / "made.json").write_text("{}")
    inputs.prepare(model, data, seed=8, announce=said.append)
    assert (tmp_path / "m" / "made.json").read_text() == "{}" and len(said) == 2


def test_without_a_hook_a_missing_model_or_dataset_is_an_error_naming_the_key(tmp_path):
    (tmp_path / "hooks.py").write_text(HOOKS)
    hooks = tmp_path / "hooks.py"
    policy = tmp_path / "m"
    inputs.prepare(
        ModelConfig(path=str(policy), build=f"{hooks}:model"),
        DataConfig(path=str(tmp_path / "d.jsonl"), build=f"{hooks}:data"),
        seed=0,
    )
    before = sorted(p.name for p in tmp_path.iterdir())
    missing_model = ModelConfig(path=str(tmp_path / "no-policy"))
    missing_data = DataConfig(path=str(tmp_path / "no-data.jsonl"))
    # the other input's hook never runs: a failing start builds nothing
    with pytest.raises(FileNotFoundError, match="model.path"):
        inputs.prepare(
            missing_model, DataConfig(path=str(tmp_path / "x.jsonl"), build=f"{hooks}:data"), 0
        )
    with pytest.raises(PromptDataError, match="data.path: .*does not exist"):
        inputs.prepare(
            ModelConfig(path=str(tmp_path / "y"), build=f"{hooks}:model"), missing_data, 0
        )
    with pytest.raises(PromptDataError, match="data.path: .*does not exist"):
        inputs.prepare(ModelConfig(path=str(policy)), missing_data, 0)
    # nothing stood in for them
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("model", "data", "key"),
    [
        ({}, {"path": "d.jsonl"}, "model.path is not set"),
        ({"path": "m"}, {}, "data.path is not set"),
        ({"path": "m", "build": "no_such_module_xyz:build"}, {"path": "d"}, "model.build"),
        ({"path": "m"}, {"path": "d", "build": "build_without_module"}, "data.build"),
    ],
)
def test_an_unset_path_or_a_hook_that_cannot_load_fails_naming_the_key(tmp_path, model, data, key):
    # what has no hook exists: the hook is what fails
    for name, section in (("m", model), ("d", data)):
        if "build" not in section:
            (tmp_path / name).mkdir()
    with pytest.raises(ConfigError, match=key):
        inputs.prepare(
            ModelConfig(
                **{**model, "path": str(tmp_path / model["path"]) if "path" in model else ""}
            ),
            DataConfig(**{**data, "path": str(tmp_path / data["path"]) if "path" in data else ""}),
            seed=0,
        )


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


DEMO_PATHS = {"model.path": "runs/demo-policy", "data.path": "runs/demo-data/train.jsonl"}


@pytest.mark.parametrize(
    "override",
    ["data.path=typo.jsonl", "model.path=no-such-org/no-such-model", "model.path=no-such-model"],
)
def test_the_demo_hooks_fill_only_their_own_paths(tmp_path, monkeypatch, override):
    """A path the user sets over the demo preset's is checked as any other: the start fails
    naming its key, and nothing is built, there or at the demo's paths."""
    import shutil

    from streamrl.configs import load_config
    from streamrl.launch.supervisor import Supervisor

    monkeypatch.chdir(tmp_path)
    key = override.partition("=")[0]
    cfg = load_config("demo_cpu", [override, "run.dir=run"], env={})
    section = getattr(cfg, key.split(".")[0])
    assert section.build is None
    # the other hook stays with the path it was declared with
    other = cfg.data if key == "model.path" else cfg.model
    assert other.build and other.path == DEMO_PATHS[({*DEMO_PATHS} - {key}).pop()]
    # an existing run directory is left as it was
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises((FileNotFoundError, PromptDataError), match=key):
        Supervisor(cfg, actors=1, python=shutil.which("true")).start()
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["notes.txt", "run"]


def test_a_hook_keeps_a_path_spelled_otherwise_or_set_with_it():
    from streamrl.configs import load_config

    same = load_config("demo_cpu", ["model.path=./runs/demo-policy/"], env={})
    assert same.model.build == "streamrl.examples.reverse_digits:build_policy"
    declared = load_config("demo_cpu", ["model.path=elsewhere", "model.build=hooks:model"], env={})
    assert (declared.model.path, declared.model.build) == ("elsewhere", "hooks:model")
    assert load_config("demo_cpu", env={}).model.build == same.model.build
