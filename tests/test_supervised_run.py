"""``streamrl sft`` / ``streamrl dpo`` runs on the learner: step rows, exact resume, export.

Runs are driven in-process (``SFT``, ``DPO``), a handful of steps on the demo policy.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import urllib.request
from pathlib import Path

import pytest
import recipes
from safetensors.torch import load_file

from streamrl.broker.client import connect_sync
from streamrl.broker.keys import Keys
from streamrl.configs import Config, load_config
from streamrl.configs.schema import BrokerConfig, MetricsConfig, RunConfig
from streamrl.learner import init_optimizer
from streamrl.learner import supervised_batches as sb
from streamrl.learner.dpo import DPO
from streamrl.learner.sft import SFT
from streamrl.learner.supervised import Supervised
from streamrl.learner.throughput import matmul_parameters, training_flops_per_token
from streamrl.learner.trainer import rank0_endpoint
from streamrl.policy.load import load_policy

ROWS = [{"prompt": f"{n:03d}>", "completion": f"{n:03d}"[::-1]} for n in range(100, 900, 100)]


def _dataset(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


SFT_RECIPE = recipes.SUPERVISED | {
    "supervised.batch_size": 4,
    "supervised.epochs": 2,
    "learner.lr": 1e-3,
    # constant: the first half's run.max_steps would otherwise be a shorter decay horizon
    "learner.lr_scheduler": "constant",
    "run.max_steps": 0,
}
# The learning asserted below, against its spread: these runs are deterministic (the resumed run
# repeats the losses exactly), so the spread is over run.seed (the order the examples are drawn),
# measured 2026-11-29 on the 2-core machine under load for seeds 1-6 (n=6; tests/recipes.py has
# why recipes are pinned). SFT: the second epoch's mean loss below the first's by 0.449 (sd
# 0.098; the last step's loss below the first's, asserted before, only 3.9 sd above 0 on seed 1's
# 0.27); a 0.05 bar is 4.05 sd below the mean.
SFT_DROP = 0.05
# DPO after 6 steps: reward margin 0.42 (sd 0.053), log 2 - loss 0.188 (sd 0.021); bars 0.2 and
# 0.1 are 4.2 sd below each.
DPO_MARGIN, DPO_LOSS_DROP = 0.2, 0.1
DPO_STEPS = 6
DPO_RECIPE = recipes.SUPERVISED | {
    "supervised.batch_size": 4,
    "supervised.epochs": 3,
    "learner.lr": 1e-2,
    "learner.lr_scheduler": "linear",
    "run.max_steps": DPO_STEPS,
    "model.lora.rank": 4,
    "model.lora.alpha": 8.0,
    "model.lora.dropout": 0.0,
    "model.lora.target_modules": "all-linear",
}

# configs/dpo_cpu.yaml's recipe (its auto schedule is linear over its run: two epochs of its 1000
# pairs at 16 a step), on the tests' demo policy and the preset's pairs. Measured 2026-11-30 on the
# 2-core machine, seeds 0-11 (n=12, deterministic: seed 0 under a busy loop on each core repeated
# its figures exactly), the mean of the last 16 steps less that of the first 16: reward margin
# +3.64 (sd 0.68, min 2.54), reward accuracy +0.500 (sd 0.034, min 0.457); the bars 0.9 and 0.35
# are 4.05 and 4.4 sd below each. Before issue 49's recipe (beta 0.1, lr 3e-4 on 64 pairs a step,
# the warm start's AdamW moments, the digits as they stand as the rejected response) the margin
# stayed within +-0.001 over the 32 steps.
DPO_PRESET_STEPS, DPO_PRESET_WINDOW = 126, 16
DPO_PRESET_MARGIN_RISE, DPO_PRESET_ACCURACY_RISE = 0.9, 0.35
DPO_PRESET_RECIPE = recipes.SUPERVISED | {
    "supervised.batch_size": 16,
    "supervised.epochs": 2,
    "supervised.beta": 0.5,
    "supervised.loss": "sigmoid",
    "learner.lr": 1e-3,
    "learner.lr_scheduler": "linear",
    "learner.init_optimizer": "fresh",
    "run.max_steps": DPO_PRESET_STEPS,
}


def _cfg(policy: str, data: str, run_dir: Path, recipe=SFT_RECIPE, **overrides) -> Config:
    """``recipe`` with ``overrides`` (``section__name=value``) on top."""
    settings = {
        "run.dir": str(run_dir),
        "run.report_to": [],
        "model.path": policy,
        "supervised.path": data,
        "learner.micro_batch_tokens": 64,
        **recipe,
        **{key.replace("__", "."): value for key, value in overrides.items()},
    }
    return load_config(None, settings, env={})


def learning_configs(tmp_path: Path) -> dict[str, Config]:
    """The configs this module's learning assertions train with (tests/recipes.py)."""
    return {
        "sft": _cfg("policy", "data.jsonl", tmp_path / "whole"),
        "dpo": _cfg("policy", "data.jsonl", tmp_path / "dpo", DPO_RECIPE),
        "dpo_preset": _dpo_preset_cfg("policy", "data.jsonl", tmp_path / "dpo_preset"),
    }


def _dpo_preset_cfg(policy: str, data: str, run_dir: Path) -> Config:
    # a step's 16 pairs in one micro-batch: in 64-token ones the 126 steps take several times longer
    return _cfg(policy, data, run_dir, DPO_PRESET_RECIPE, learner__micro_batch_tokens=8192)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "learner_steps.jsonl").read_text().splitlines()]


def _run(cfg: Config, objective: type[Supervised] = SFT) -> Supervised:
    runner = objective(cfg)
    runner.run(echo=lambda _line: None)
    return runner


@pytest.mark.timeout(300)
def test_sft_resumed_midway_ends_with_the_weights_of_an_uninterrupted_run(demo_policy, tmp_path):
    data = _dataset(tmp_path, ROWS)
    whole = tmp_path / "whole"
    _run(_cfg(demo_policy, data, whole, supervised__save_optimizer=True, learner__peak_tflops=1e-3))
    halves = tmp_path / "halves"
    _run(_cfg(demo_policy, data, halves, run__max_steps=2))
    assert (halves / "policy").exists() and len(_rows(halves)) == 2
    _run(_cfg(demo_policy, data, halves))

    rows = _rows(whole)
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["epoch"] for r in rows] == [0, 0, 1, 1]
    # 4 rows of 3 digits + the end token a step, the 4 samples of 8 tokens packed into one row
    assert all(r["tokens"] == 16 and r["packed_tokens"] == 64 for r in rows)
    first, second = (statistics.fmean(r["loss"] for r in rows if r["epoch"] == e) for e in (0, 1))
    assert second < first - SFT_DROP, [r["loss"] for r in rows]
    assert [r["loss"] for r in _rows(halves)] == [r["loss"] for r in rows]
    # mfu as the RL step row's: 6N per trained token over the peak the config names (a CPU has
    # none in the table: the halves' rows leave it empty)
    flops = training_flops_per_token(*matmul_parameters(load_policy(demo_policy)))
    for r in rows:
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * flops / 1e9, rel=1e-9)
    assert all(r["mfu"] is None for r in _rows(halves))
    ours, theirs = (load_file(d / "policy" / "model.safetensors") for d in (halves, whole))
    assert all((ours[name] == theirs[name]).all() for name in theirs)
    info = json.loads((whole / "policy" / "streamrl_export.json").read_text())
    assert info["step"] == 4
    moments = init_optimizer.read(whole / "policy")
    assert moments.step == 4 and moments.betas == (0.9, 0.99)
    assert all(m["exp_avg_sq"].abs().sum() > 0 for m in moments.tensors.values())


PAIRS = [
    {"prompt": f"{n:03d}>", "chosen": f"{n:03d}"[::-1], "rejected": f"{n:03d}"}
    for n in range(120, 920, 100)
]


@pytest.mark.timeout(300)
def test_dpo_on_lora_starts_at_log_2_against_its_adapters_off_and_learns_the_preference(
    demo_policy, tmp_path
):
    data = _dataset(tmp_path, PAIRS)
    run_dir = tmp_path / "dpo"
    _run(_cfg(demo_policy, data, run_dir, DPO_RECIPE), DPO)
    rows = _rows(run_dir)
    # fresh adapters add nothing: the policy is its reference, every margin 0
    assert rows[0]["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert rows[-1]["reward_margin"] > DPO_MARGIN, rows[-1]
    assert rows[-1]["loss"] < math.log(2) - DPO_LOSS_DROP, rows[-1]
    # the learner's LR schedule, over the run's 6 steps
    steps = DPO_STEPS
    assert [r["lr"] for r in rows] == pytest.approx(
        [1e-2 * (steps - k) / steps for k in range(steps)]
    )
    assert (run_dir / "policy" / "adapter").is_dir()


def _rise(rows: list[dict], key: str) -> float:
    window = DPO_PRESET_WINDOW
    values = [r[key] for r in rows]
    return statistics.fmean(values[-window:]) - statistics.fmean(values[:window])


@pytest.mark.timeout(300)
def test_dpo_on_the_dpo_cpu_recipe_raises_the_reward_margin_and_the_preference_accuracy(
    demo_policy, tmp_path
):
    from streamrl.examples.reverse_digits.assets import write_preference_dataset

    data = write_preference_dataset(tmp_path / "pairs.jsonl")
    run_dir = tmp_path / "dpo"
    _run(_dpo_preset_cfg(demo_policy, str(data), run_dir), DPO)
    rows = _rows(run_dir)
    assert len(rows) == DPO_PRESET_STEPS
    assert _rise(rows, "reward_margin") > DPO_PRESET_MARGIN_RISE, rows[-1]
    assert _rise(rows, "reward_accuracy") > DPO_PRESET_ACCURACY_RISE, rows[-1]


def test_the_dpo_preset_trains_with_the_recipe_its_learning_test_pins(tmp_path):
    from streamrl.examples.reverse_digits.assets import write_preference_dataset

    preset = load_config("dpo_cpu", [], env={})
    for knob, value in DPO_PRESET_RECIPE.items():
        if knob in ("run.seed", "run.max_steps", "learner.lr_scheduler"):
            continue
        got = functools.reduce(getattr, knob.split("."), preset)
        assert got == (tuple(value) if isinstance(got, tuple) else value), knob
    # auto: linear over the run's steps, which its pairs, batch and epochs make DPO_PRESET_STEPS
    assert preset.learner.lr_scheduler == "auto" and not preset.run.max_steps
    pairs = len(write_preference_dataset(tmp_path / "pairs.jsonl").read_text().splitlines())
    steps = sb.steps_per_epoch(pairs, preset.supervised.batch_size) * preset.supervised.epochs
    assert steps == DPO_PRESET_STEPS


def test_streamrl_example_sft_makes_the_sft_presets_inputs_and_a_missing_one_is_named(
    tmp_path, monkeypatch
):
    from streamrl.configs.errors import ConfigError
    from streamrl.examples.assets_cli import example_targets, make
    from streamrl.launch.supervised import check_inputs
    from streamrl.policy.load import load_policy

    monkeypatch.chdir(tmp_path)
    preset = load_config("sft_cpu", [], env={})
    with pytest.raises(ConfigError) as err:
        check_inputs(preset.model, preset.supervised)
    assert str(err.value) == (
        "model.path 'runs/demo-init' does not exist: make it with `streamrl example sft`"
    )
    assert make(example_targets("sft", None, None), say=lambda _: None) == [
        preset.model.path,
        preset.supervised.path,
    ]
    check_inputs(preset.model, preset.supervised)
    assert load_policy(preset.model.path).config.num_hidden_layers == 2
    rows = Path(preset.supervised.path).read_text().splitlines()
    assert len(rows) == 60 * preset.supervised.batch_size
    assert set(json.loads(rows[0])) == {"prompt", "completion"}
    with pytest.raises(ConfigError, match="supervised.path"):
        check_inputs(preset.model, preset.supervised.model_copy(update={"path": "nothere"}))


def _scraped(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return float(next(line.split()[1] for line in body.splitlines() if line.startswith(name + " ")))


@pytest.mark.timeout(300)
def test_a_supervised_run_serves_the_learner_metrics_where_a_redis_lists_its_endpoint(
    demo_policy, redis_cfg, tmp_path
):
    cfg = _cfg(
        demo_policy,
        _dataset(tmp_path, ROWS),
        tmp_path / "sft",
        run__name=redis_cfg.run.name,
        broker__redis_url=redis_cfg.broker.redis_url,
    )
    targets = Keys.from_config(cfg.run, cfg.broker).metrics_targets
    client = connect_sync(cfg.broker, cfg.run.dir)
    runner = SFT(cfg)
    try:
        port = runner.metrics_port
        assert client.hget(targets, "learner:0") == f"127.0.0.1:{port}".encode()
        steps, samples = (
            _scraped(port, f"streamrl_learner_{n}_total") for n in ("steps", "samples_trained")
        )
        rows = [runner.train_next() for _ in range(2)]
        assert _scraped(port, "streamrl_learner_steps_total") == steps + 2
        assert _scraped(port, "streamrl_learner_samples_trained_total") == samples + 8
        assert _scraped(port, "streamrl_learner_grad_norm_count") >= 2
        assert _scraped(port, "streamrl_learner_tokens_per_second") == rows[-1]["tokens_per_s"]
    finally:
        runner.close()
    assert client.hget(targets, "learner:0") is None


def test_without_a_redis_to_list_it_in_the_trainer_serves_no_endpoint(tmp_path, redis_cfg):
    run = RunConfig(dir=str(tmp_path))
    assert not rank0_endpoint(MetricsConfig(), BrokerConfig(), run).enabled
    assert rank0_endpoint(MetricsConfig(), redis_cfg.broker, run).enabled
