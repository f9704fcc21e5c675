"""The ``streamrl`` program as a user types it: commands, --help, --version, errors, config show.

Each test runs ``python -m streamrl ...`` in a process of its own, from a directory that is
not the repository, so what it checks is what a shell shows.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from streamrl import __version__
from streamrl.launch.cli import COMMANDS


def streamrl(*args: str, cwd, env: dict | None = None) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=os.getcwd(), **(env or {}))
    full.pop("REDIS_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "streamrl", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_lists_every_command_and_version_prints_it(tmp_path):
    done = streamrl("--help", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("usage: streamrl ")
    assert all(f"\n    {name}" in done.stdout for name in COMMANDS)
    assert "learner" in COMMANDS and "actors" in COMMANDS
    done = streamrl("--version", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == f"streamrl {__version__}"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["frobnicate"], "streamrl: error: argument <command>: invalid choice: 'frobnicate'"),
        ([], "streamrl: error: the following arguments are required: <command>"),
        (["--frobnicate"], "streamrl: error: the following arguments are required: <command>"),
        (["run", "--frobnicate"], "streamrl run: error: unrecognized arguments: --frobnicate"),
        (["learner", "--frobnicate"], "streamrl learner: error: unrecognized arguments"),
        (["config", "list"], "streamrl config: error: argument <action>: invalid choice: 'list'"),
    ],
)
def test_an_unknown_command_or_flag_is_named_with_exit_code_2(tmp_path, args, said):
    done = streamrl(*args, cwd=tmp_path)
    assert done.returncode == 2
    assert said in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("name", ["run", "learner", "actors", "export", "config"])
def test_each_command_has_its_own_help_under_the_one_program_name(tmp_path, name):
    done = streamrl(name, *(["show"] if name == "config" else []), "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: streamrl {name}") and "--config" in done.stdout


def test_config_show_resolves_overrides_and_redacts_secrets(tmp_path):
    # a password comes from a file, never the command line (every command refuses it there)
    demo = yaml.safe_load(Path("configs/demo_cpu.yaml").read_text())
    demo.setdefault("broker", {})["password"] = "hunter2"
    (tmp_path / "secret.yaml").write_text(yaml.safe_dump(demo))
    done = streamrl(
        "config",
        "show",
        "--config",
        "secret.yaml",
        "reward.functions.0.weight=0.5",
        "run.report_to=wandb",
        "broker.redis_url=redis://:s3cret@redis.example:6379/0",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)
    assert shown["reward"]["functions"][0]["weight"] == 0.5
    assert shown["reward"]["functions"][1]["weight"] == 0
    assert shown["run"]["report_to"] == ["wandb"]
    assert "hunter2" not in done.stdout and "s3cret" not in done.stdout
    assert shown["broker"]["password"] is None
    assert shown["broker"]["redis_url"] == "redis://:REDACTED@redis.example:6379/0"
    # what it shows is a whole config: it loads back as given
    (tmp_path / "shown.yaml").write_text(done.stdout)
    again = streamrl("config", "show", "--config", "shown.yaml", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == done.stdout


def test_config_show_of_a_run_directory_prints_what_the_run_saved(tmp_path):
    from streamrl.configs import load_config, write_config

    (tmp_path / "run").mkdir()
    cfg = load_config("demo_cpu", ["learner.lr=0.001", "broker.password=hunter2"], env={})
    saved = write_config(cfg, tmp_path / "run" / "config.yaml")
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    done = streamrl("config", "show", "--config", "run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["learner"]["lr"] == 0.001
    assert "hunter2" not in saved.read_text() + done.stdout


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("learner.lrr=1e-5", "learner.lrr: unknown key; did you mean learner.lr?"),
        (
            "reward.functions.0.wieght=2",
            "reward.functions.0.wieght: unknown key; did you mean reward.functions.0.weight?",
        ),
        ("lerner.lr=1e-5", "lerner: unknown key; did you mean learner?"),
        ("reward.functions.7.weight=2", "reward.functions has 2 item(s)"),
    ],
)
def test_a_mistyped_key_or_index_fails_naming_it_and_the_closest_key(tmp_path, override, said):
    done = streamrl("config", "show", "--config", "demo_cpu", override, cwd=tmp_path)
    assert done.returncode == 2
    assert said in done.stderr and "Traceback" not in done.stderr


def test_list_index_overrides_append_and_fill_an_empty_list(tmp_path):
    done = streamrl(
        "config",
        "show",
        "model.path=m",
        "reward.functions.0.fn=exact_match",
        "reward.functions.1.fn=gsm8k",
        "reward.functions.1.weight=2",
        "rollout.stop=</answer>",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)
    assert [(f["fn"], f["weight"]) for f in shown["reward"]["functions"]] == [
        ("exact_match", 1.0),
        ("gsm8k", 2.0),
    ]
    assert shown["rollout"]["stop"] == ["</answer>"]


def test_trl_and_verl_names_fail_naming_streamrls_key_as_docs_migrating_maps_them(tmp_path):
    from pathlib import Path

    from streamrl.configs import load_config
    from streamrl.configs.foreign import FOREIGN

    page = (Path(__file__).resolve().parents[1] / "docs" / "migrating.md").read_text()
    for name, (_who, ours) in FOREIGN.items():
        assert re.search(rf"[`.]{name}[`:]", page), name
        # every target is a real key: setting it (the list's first item for reward keys) loads
        key = ours.replace("<i>", "0")
        if key == "reward.functions":
            continue
        assert f"`{ours.split('.<i>')[0]}" in page, ours
        *section, leaf = key.split(".")
        node = load_config("demo_cpu", env={})
        for part in section:
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        assert hasattr(node, leaf), ours
    done = streamrl(
        "config", "show", "--config", "demo_cpu", "rollout.num_generations=8", "beta=0.1",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        "rollout.num_generations: unknown key; num_generations is TRL's name: "
        "streamrl's is rollout.group_size (docs/migrating.md)" in done.stderr
    )
    assert "beta is TRL's name: streamrl's is algo.kl_coef" in done.stderr
