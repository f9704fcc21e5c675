"""The Python API: ``streamrl.load_config`` finds presets by name, ``streamrl.run`` trains and
returns its summary, and the processes it starts get the resolved config through a private file,
never through their command line."""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import streamrl
from streamrl.configs import ConfigError, load_config, presets

ROOT = Path(__file__).resolve().parents[1]


def test_a_preset_by_name_is_the_shipped_file():
    assert streamrl.load_config("demo_cpu", env={}) == load_config(
        ROOT / "configs" / "demo_cpu.yaml", env={}
    )


def test_the_presets_are_the_yaml_files_shipped_in_configs():
    assert presets() == sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))


def test_an_unknown_preset_fails_listing_the_presets():
    with pytest.raises(ConfigError) as err:
        streamrl.load_config("demo_gpu")
    assert "demo_gpu" in str(err.value)
    assert all(name in str(err.value) for name in presets())


def test_a_missing_file_path_is_reported_as_a_file_not_a_preset(tmp_path):
    with pytest.raises(ConfigError, match="config file .*nothere.yaml"):
        streamrl.load_config(str(tmp_path / "nothere.yaml"))


def test_overrides_as_a_mapping_equal_the_same_overrides_as_command_line_strings():
    as_mapping = streamrl.load_config(
        "demo_cpu", {"run.max_steps": 2, "rollout.stop": ["a", "b"]}, env={}
    )
    as_strings = streamrl.load_config(
        "demo_cpu", ["run.max_steps=2", "rollout.stop=[a, b]"], env={}
    )
    assert as_mapping == as_strings
    assert as_mapping.run.max_steps == 2


@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="needs an interpreter without vLLM"
)
def test_the_cli_reports_a_streamrl_error_in_one_line_and_exits_2(tmp_path):
    """A vLLM actor asked for where vLLM is missing: an EngineUnavailable, not a traceback."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("REDIS_URL", None)
    result = subprocess.run(
        [sys.executable, "-m", "streamrl", "run", "--config", "demo_cpu", "--actors", "1",
         "actor.engine=vllm", f"run.dir={tmp_path / 'run'}"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("streamrl run: a vLLM actor needs vLLM"), line


def _secret_cfg(tmp_path: Path, demo_policy: str, demo_dataset: str, secret: str):
    return load_config(
        "demo_cpu",
        {
            "run.name": f"api-{uuid.uuid4().hex[:8]}",
            "run.dir": str(tmp_path / "run"),
            "model.path": demo_policy,
            "data.path": demo_dataset,
            "broker.password": secret,
            # every child at once: the stand-in interpreter below never sends a heartbeat
            "actor.staggered_start": False,
        },
        env={},
    )


def test_children_get_the_redacted_config_in_a_0600_file_and_no_secret_on_their_command_line(
    tmp_path, demo_policy, demo_dataset
):
    from streamrl.launch.supervisor import Supervisor

    secret = f"pw-{uuid.uuid4().hex}"
    cfg = _secret_cfg(tmp_path, demo_policy, demo_dataset, secret)
    # A stand-in for the interpreter that stays up until SIGTERM: what is checked is the command
    # line each child runs with, as every local user sees it in /proc.
    stand_in = tmp_path / "python"
    stand_in.write_text("#!/bin/sh\ntrap 'exit 0' TERM\nwhile :; do sleep 0.1; done\n")
    stand_in.chmod(0o700)
    sup = Supervisor(cfg, actors=2, python=str(stand_in))
    try:
        sup.start()
        children = [sup.learner, *sup.actors]
        cmdlines = [Path(f"/proc/{c.proc.pid}/cmdline").read_bytes() for c in children]
        environs = [Path(f"/proc/{c.proc.pid}/environ").read_bytes() for c in children]
    finally:
        sup.stop()
    assert len(cmdlines) == 3
    for cmdline in cmdlines:
        argv = cmdline.decode().split("\0")
        assert secret not in cmdline.decode()
        assert argv[argv.index("--config") + 1] == str(sup.config_file)
    # the saved config is the run's, secrets redacted; the children reach Redis through
    # REDIS_URL in their environment, which only this user can read
    assert stat.S_IMODE(sup.config_file.stat().st_mode) == 0o600
    assert secret not in sup.config_file.read_text()
    saved = load_config(sup.config_file, env={})
    assert saved.broker.password is None and saved == cfg.model_copy(
        update={"broker": cfg.broker.model_copy(update={"password": None})}
    )
    for environ in environs:
        url = dict(v.split("=", 1) for v in environ.decode().split("\0") if "=" in v)["REDIS_URL"]
        assert secret in url
    assert secret not in (sup.run_dir / "run.json").read_text()
