"""Bad configs and datasets stop a process before anything starts, naming the key, file and row.

test_configs.py and test_actors_prompt_data.py check the messages of the loaders;
these check the processes: the exit status, that the message reaches stderr,
and that nothing was started half-way (no Redis, no run state).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # a command as a user types it: no Redis, and not a torchrun rank (a test's single-rank
    # process group leaves RANK and its kin in this process's environment)
    for name in ("REDIS_URL", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def _redis_servers_under(path: Path) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline"])
        if any(str(path) in part for part in p.info["cmdline"] or [])
    ]


def _broken_dataset(tmp_path: Path) -> Path:
    path = tmp_path / "broken.jsonl"
    path.write_text(
        '{"prompt": "123>", "answer": "321"}\n{"prompt": "456>", "answer": "654"}\n{"prompt": "78\n'
    )
    return path


def test_launch_with_a_bad_config_exits_2_naming_the_key_before_starting_redis(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text(f"run:\n  dir: {tmp_path / 'run'}\nlearner:\n  lr: -1\n")
    result = _run("streamrl.launch", "--config", str(config), "--actors", "1")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "bad.yaml" in result.stderr and "learner.lr" in result.stderr
    assert not (tmp_path / "run").exists()


def test_launch_with_a_broken_dataset_exits_2_naming_file_and_row_before_starting_redis(
    tmp_path, demo_policy
):
    dataset = _broken_dataset(tmp_path)
    run_dir = tmp_path / "run"
    result = _run(
        "streamrl.launch",
        "--config",
        "configs/demo_cpu.yaml",
        "--actors",
        "1",
        f"run.dir={run_dir}",
        f"model.path={demo_policy}",
        f"data.path={dataset}",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{dataset}: row 3" in result.stderr
    assert not (run_dir / "redis").exists() and not _redis_servers_under(run_dir)
    assert "Traceback" not in result.stderr


def test_an_actor_whose_redis_is_out_of_reach_exits_1_in_one_line_for_its_supervisor(
    tmp_path, demo_policy, demo_dataset
):
    # Nothing listens on port 1: the first Redis command fails once its retries are spent.
    result = _run(
        "streamrl.actors",
        "--config",
        "configs/demo_cpu.yaml",
        f"model.path={demo_policy}",
        f"data.path={demo_dataset}",
        "broker.redis_url=redis://127.0.0.1:1/0",
        "broker.retries=0",
        f"run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "actor: Redis out of reach past broker.retries" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-2000:]


def test_an_actor_with_a_broken_dataset_exits_2_naming_file_and_row_without_redis(
    tmp_path, demo_policy
):
    dataset = _broken_dataset(tmp_path)
    # Nothing listens on port 1: the actor must fail on its input before it ever connects.
    result = _run(
        "streamrl.actors",
        "--config",
        "configs/demo_cpu.yaml",
        f"model.path={demo_policy}",
        f"data.path={dataset}",
        "broker.redis_url=redis://127.0.0.1:1/0",
        f"run.dir={tmp_path / 'run'}",
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"{dataset}: row 3" in result.stderr and "Traceback" not in result.stderr


def test_a_tracker_that_is_not_installed_stops_every_learner_command_in_one_line(
    tmp_path, demo_policy
):
    """`run.report_to` naming an extra this interpreter lacks (trackio is in no extra the tests
    install): `streamrl run`, `sft` and `learner` each exit 2 in one line naming the key and the
    pip command, before a run directory or a Redis exists (the learner once crash-looped)."""
    import importlib.util

    assert importlib.util.find_spec("trackio") is None
    common = [f"model.path={demo_policy}", "run.report_to=[trackio]"]
    commands = {
        "run": ["streamrl", "run", "--config", "demo_cpu", "--actors", "1"],
        "sft": ["streamrl", "sft", "--config", "sft_cpu"],
        "learner": ["streamrl", "learner", "--config", "demo_cpu"],
    }
    for name, command in commands.items():
        run_dir = tmp_path / name
        result = _run(*command, f"run.dir={run_dir}", *common)
        assert result.returncode == 2, (name, result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "run.report_to includes trackio" in lines[0], (name, lines)
        assert "pip install 'streamrl[trackio]'" in lines[0]
        assert not run_dir.exists() and not _redis_servers_under(run_dir), name


def test_a_supervised_row_that_cannot_train_stops_sft_and_dpo_in_one_line_naming_file_and_line(
    tmp_path, demo_policy
):
    """Broken JSON on line 3 (after a blank line) of an SFT file, a DPO row without `rejected`:
    one line naming supervised.path, the file's line and what is wrong; no run directory."""
    sft = tmp_path / "sft.jsonl"
    sft.write_text('{"prompt": "12>", "completion": "21"}\n\n{"prompt": "34>", "completion": \n')
    dpo = tmp_path / "dpo.jsonl"
    dpo.write_text('{"prompt": "12>", "chosen": "21"}\n')
    for name, data, said in (
        ("sft", sft, "sft.jsonl:3: not JSON (Expecting value at column 33)"),
        ("dpo", dpo, "dpo.jsonl:1: a preference row holds `chosen` and `rejected`"),
    ):
        run_dir = tmp_path / f"run-{name}"
        result = _run(
            "streamrl", name, "--config", f"{name}_cpu", f"run.dir={run_dir}",
            f"model.path={demo_policy}", f"supervised.path={data}", "run.report_to=[]",
        )  # fmt: skip
        assert result.returncode == 2, (name, result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and f"supervised.path={data}: {said}" in lines[0], (name, lines)
        assert not run_dir.exists(), name
