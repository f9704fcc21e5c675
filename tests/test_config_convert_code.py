"""`streamrl config convert` never maps a code reference silently.

A foreign field that would make a run import code (a plug-in reward, a verl custom reward
file, ``trust_remote_code``) is its own status in the table, *code reference*, listed first,
and the written config carries it only as a commented-out override to set after review.
Converting imports nothing the file names, and neither does loading what it wrote: a module
that leaves a marker file when imported is named, and the marker never appears until the user
sets the reference and a run loads it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from streamrl.configs import load_config, parse_overrides
from streamrl.configs.convert import convert
from streamrl.configs.convert_rules import code_in
from streamrl.configs.schema import Config

PLUGIN = """
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("imported")

def accuracy(messages, answer, **columns):
    return 1.0
"""


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    # the plug-in is importable from where the command runs, as a user's project would be
    env = dict(os.environ, PYTHONPATH=str(cwd))
    env.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


@pytest.mark.timeout(600)
def test_a_plug_in_reward_of_a_trl_file_is_a_code_reference_that_nothing_imports_until_set(
    tmp_path,
):
    (tmp_path / "evil_rewards.py").write_text(PLUGIN)
    marker = tmp_path / "IMPORTED"
    (tmp_path / "grpo.yaml").write_text(
        "learning_rate: 1.0e-6\n"
        "reward_funcs: [math, evil_rewards.accuracy]\n"
        "reward_weights: [1.0, 0.5]\n"
    )
    done = _run("-m", "streamrl", "config", "convert", "--from", "trl", "grpo.yaml",
                "--base", "demo_cpu", "--out", "mine.yaml", cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr
    table = done.stdout.splitlines()
    row = next(line for line in table if line.startswith("| `reward_funcs`"))
    assert "| code reference |" in row and "evil_rewards:accuracy" in row
    # what needs a look comes first
    assert table[2] == row
    assert "1 code reference" in done.stdout
    shown = _run("-m", "streamrl", "config", "show", "--config", "mine.yaml", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "evil_rewards" not in shown.stdout
    assert not marker.exists()
    # the base's rewards stand; the file names the reference only in a comment
    written = (tmp_path / "mine.yaml").read_text()
    cfg = load_config(tmp_path / "mine.yaml", env={})
    assert cfg.reward.functions == load_config("demo_cpu", env={}).reward.functions
    assert cfg.learner.lr == 1e-6
    line = next(ln for ln in written.splitlines() if ln.startswith("#   reward.functions="))
    override = line.removeprefix("#   ").split("    (from ")[0]
    assert parse_overrides([override])["reward"]["functions"] == [
        {"fn": "math", "weight": 1.0},
        {"fn": "evil_rewards:accuracy", "weight": 0.5},
    ]
    # once the user sets it, a run does import it: the marker is a real witness
    loads = _run("-c", "from streamrl.actors import plugins; "
                 "plugins.load('evil_rewards:accuracy', 'reward')", cwd=tmp_path)  # fmt: skip
    assert loads.returncode == 0, loads.stderr
    assert marker.exists()


def test_a_verl_custom_reward_file_and_trust_remote_code_are_code_references_held_back():
    tree = {
        "custom_reward_function": {"path": "/home/me/my_reward.py", "name": "compute_score"},
        "actor_rollout_ref": {"model": {"trust_remote_code": True}},
    }
    settings, rows = convert(tree, "verl")
    by = {r.field: r for r in rows}
    assert settings == {}
    path = by["custom_reward_function.path"]
    assert path.status == "code reference"
    assert path.held == (("reward.functions", [{"fn": "/home/me/my_reward.py:compute_score"}]),)
    # verl's signature differs from streamrl's: the note says so
    assert "solution_str" in path.note
    assert by["custom_reward_function.name"].status == "mapped"
    trust = by["actor_rollout_ref.model.trust_remote_code"]
    assert trust.status == "code reference"
    assert trust.held == (("model.init_kwargs.trust_remote_code", True),)
    settings, rows = convert({"trust_remote_code": False, "reward_funcs": "math"}, "trl")
    # false runs nothing, and a built-in reward is no code reference
    assert settings == {"reward.functions": [{"fn": "math", "weight": 1.0}]}
    assert {r.status for r in rows} == {"mapped"}


def _described_as_code(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The dotted keys of the schema whose description says they name a `module:...`."""
    keys = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        if "`module:" in (field.description or ""):
            keys.append(key)
        for arg in typing.get_args(field.annotation) or (field.annotation,):
            inner = typing.get_args(arg)[0] if typing.get_origin(arg) is list else arg
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                keys += _described_as_code(inner, f"{key}.")
    return keys


def test_every_schema_key_that_names_code_is_a_code_reference_to_the_converter():
    keys = _described_as_code(Config)
    assert {"env.name", "reward.functions.fn"} <= set(keys)
    assert [k for k in keys if not code_in(k, "some.module:function")] == []
