"""``streamrl.GRPOTrainer``: TRL's GRPO quickstart with one import changed trains a run, hands each
step row to its callbacks in the calling process and returns the run's summary; rewards that the
actor processes could not import are refused, saying why."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import streamrl
from streamrl.configs import ConfigError
from streamrl.launch.trainers import GRPOTrainer

ROOT = Path(__file__).resolve().parents[1]


def reward_len(completions, **kwargs):
    return [-abs(4 - len(c)) for c in completions]


def _args(tmp_path: Path, demo_policy: str, demo_dataset: str) -> streamrl.Config:
    return streamrl.load_config(
        "demo_cpu",
        {"run.dir": str(tmp_path / "run"), "model.path": demo_policy, "data.path": demo_dataset},
        env={},
    )


def test_a_reward_the_actors_cannot_import_is_refused_saying_why(
    tmp_path, demo_policy, demo_dataset
):
    def nested(completions, **kwargs):
        return [0.0] * len(completions)

    for bad in (lambda completions, **kwargs: [0.0] * len(completions), nested):
        with pytest.raises(ConfigError, match="rewards run in the actor processes"):
            GRPOTrainer(reward_funcs=bad, args=_args(tmp_path, demo_policy, demo_dataset))


def test_rewards_are_named_where_the_actors_import_them_and_a_dataset_lands_in_the_run_dir(
    tmp_path, demo_policy, demo_dataset
):
    from datasets import Dataset

    from streamrl.examples.reverse_digits.rewards import reverse_digits_exact as installed

    rows = [{"prompt": "12>", "answer": "21"}, {"prompt": "345>", "answer": "543"}]
    trainer = GRPOTrainer(
        model=demo_policy,
        reward_funcs=[reward_len, installed, "exact_match"],
        train_dataset=Dataset.from_list(rows),
        args=_args(tmp_path, demo_policy, demo_dataset),
    )
    refs = [spec.fn for spec in trainer.config.reward.functions]
    # parts named after the function, as TRL names its reward columns
    assert [spec.name for spec in trainer.config.reward.functions] == [
        "reward_len",
        "reverse_digits_exact",
        None,
    ]
    # a test module is no installed package: by its file; an installed one by its module
    assert refs == [
        f"{Path(__file__).resolve()}:reward_len",
        f"{installed.__module__}:reverse_digits_exact",
        "exact_match",
    ]
    data = Path(trainer.config.data.path)
    assert data == tmp_path / "run" / "dataset" / "train.jsonl"
    assert [json.loads(line) for line in data.read_text().splitlines()] == rows
    assert stat.S_IMODE(data.parent.stat().st_mode) & 0o077 == 0
    assert stat.S_IMODE((tmp_path / "run").stat().st_mode) & 0o077 == 0


QUICKSTART = """
from datasets import Dataset
from streamrl import GRPOTrainer, load_config

dataset = Dataset.from_json({dataset!r})


def reward_num_unique_letters(completions, **kwargs):
    return [float(len(set(content))) for content in completions]


rows = []
trainer = GRPOTrainer(
    model={model!r},
    reward_funcs=reward_num_unique_letters,
    train_dataset=dataset,
    args=load_config("demo_cpu", {overrides!r}),
    callbacks=[rows.append],
    actors=1,
)
summary = trainer.train()
print("RESULT", json.dumps({{"steps": summary.steps, "reason": summary.reason,
      "reward": summary.final_reward, "run_dir": str(summary.run_dir),
      "elapsed": summary.elapsed_s, "summary": type(summary).__name__,
      "rows": [r["step"] for r in rows], "parts": sorted(rows[-1]["reward_parts"])}}))
"""


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_trls_quickstart_with_one_import_changed_trains_and_calls_back_each_step(
    tmp_path, demo_policy, demo_dataset
):
    """The script is TRL's quickstart: a dataset, a reward defined in the script, the trainer, train();
    ``from trl import`` became ``from streamrl import`` (with ``load_config`` for the demo's
    recipe, as TRL's ``GRPOConfig``). It runs as a script (``__main__``), as a user runs it."""
    run_dir = tmp_path / "run"
    overrides = {
        "run.name": f"trainer-{uuid.uuid4().hex[:8]}",
        "run.dir": str(run_dir),
        "run.max_steps": 2,
        "run.max_time_s": 0,
    }
    script = tmp_path / "quickstart.py"
    body = QUICKSTART.format(dataset=demo_dataset, model=demo_policy, overrides=overrides)
    script.write_text("import json\n" + textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # as a user runs it: no Redis, not a torchrun rank (this process's test group set RANK...)
    for name in ("REDIS_URL", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=280,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert result["steps"] >= 2 and result["reason"] == "learner finished", result
    # streamrl.run's summary (this test stands for the API's run test too)
    assert result["summary"] == "RunSummary" and result["elapsed"] > 0
    assert result["reward"] is not None and result["run_dir"] == str(run_dir)
    # every step row, once, in order, in the calling process
    assert result["rows"] == list(range(1, result["steps"] + 1)), result
    assert result["parts"] == ["reward_num_unique_letters"]
    # the script's reward, copied with its imports, not the script (which would train again)
    copied = (run_dir / "rewards" / "reward_num_unique_letters.py").read_text()
    assert "def reward_num_unique_letters" in copied and "trainer.train()" not in copied


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["sft", "dpo"])
def test_sft_and_dpo_trainers_train_in_this_process_and_call_back_each_step(
    tmp_path, demo_policy, kind
):
    """A ``datasets.Dataset`` of TRL's rows (``text`` for SFT, ``prompt``/``chosen``/``rejected``
    for DPO), two steps, every row to the callbacks here; the trainer sets the process's umask as
    the command does, so the test restores it."""
    from datasets import Dataset

    if kind == "sft":
        rows = [{"text": f"{n}>{str(n)[::-1]}"} for n in (123, 456, 789, 321)]
        trainer_cls = streamrl.SFTTrainer
    else:
        rows = [
            {"prompt": f"{n}>", "chosen": str(n)[::-1], "rejected": str(n)}
            for n in (12, 34, 56, 78)
        ]
        trainer_cls = streamrl.DPOTrainer
    args = streamrl.load_config(
        f"{kind}_cpu",
        {"run.dir": str(tmp_path / "run"), "run.max_steps": 2, "run.report_to": [],
         "supervised.batch_size": 2},
        env={},
    )  # fmt: skip
    seen = []
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        trainer = trainer_cls(
            model=demo_policy,
            train_dataset=Dataset.from_list(rows),
            args=args,
            callbacks=[seen.append],
        )
        progress = trainer.train()
    finally:
        os.umask(umask)
    assert progress.step == 2
    assert [row["step"] for row in seen] == [1, 2] and all("loss" in row for row in seen)
    saved = tmp_path / "run" / "dataset" / "train.jsonl"
    assert [json.loads(line) for line in saved.read_text().splitlines()] == rows
