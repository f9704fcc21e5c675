"""A run's inputs: a missing model or dataset is built only by the hook a config names for it."""

from __future__ import annotations

import json

import pytest

from streamrl.actors import inputs
from streamrl.actors.prompts import PromptDataError, PromptDataset
from streamrl.configs.errors import ConfigError
from streamrl.configs.schema import DataConfig, ModelConfig
from streamrl.examples.reverse_digits.task import build_tokenizer
from streamrl.policy.load import load_tokenizer

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
    model = ModelConfig(path=str(tmp_path / "no-policy"))
    data = DataConfig(path=str(tmp_path / "no-data.jsonl"))
    inputs.prepare(model, data, seed=0)
    with pytest.raises(FileNotFoundError, match="model.path"):
        load_tokenizer(model.path)
    with pytest.raises(PromptDataError, match="data.path: .*does not exist"):
        PromptDataset.from_config(data, build_tokenizer())
    # nothing stood in for them
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("model", "data", "key"),
    [
        ({}, {"path": "d.jsonl"}, "model.path is not set"),
        ({"path": "m"}, {}, "data.path is not set"),
        ({"path": "m", "build": "no_such_module_xyz:build"}, {"path": "d.jsonl"}, "model.build"),
        ({"path": "m"}, {"path": "d.jsonl", "build": "build_without_module"}, "data.build"),
    ],
)
def test_an_unset_path_or_a_hook_that_cannot_load_fails_naming_the_key(tmp_path, model, data, key):
    with pytest.raises(ConfigError, match=key):
        inputs.prepare(
            ModelConfig(
                **{**model, "path": str(tmp_path / model["path"]) if "path" in model else ""}
            ),
            DataConfig(**{**data, "path": str(tmp_path / data["path"]) if "path" in data else ""}),
            seed=0,
        )


def test_a_run_without_reward_functions_stops_before_any_process_starts(tmp_path):
    import shutil

    from streamrl.configs import load_config
    from streamrl.launch.supervisor import Supervisor

    (tmp_path / "d.jsonl").write_text('{"prompt": "1>", "answer": "1"}\n')
    run_dir = tmp_path / "run"
    overrides = [f"run.dir={run_dir}", "model.path=m", f"data.path={tmp_path / 'd.jsonl'}"]
    sup = Supervisor(load_config(None, overrides, env={}), actors=1, python=shutil.which("true"))
    with pytest.raises(ConfigError, match="reward.functions is empty"):
        sup.start()
    assert sup.learner is None and not sup.actors and not (run_dir / "redis").exists()
