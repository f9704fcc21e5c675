"""The long-tail copy task, its preset, the synchronous loop's padded batches and bench.longtail's pieces."""

from __future__ import annotations

import argparse
import csv
import hashlib
import random
import statistics
from pathlib import Path

import pytest
import torch

from bench import longtail
from bench.reference_loop import left_pad, run_reference, sample, token_logprobs
from bench.tasks import LONGTAIL
from streamrl.configs import load_config
from streamrl.examples.longtail_copy import build_policy, copy_digits, copy_digits_exact
from streamrl.examples.longtail_copy.task import MAX_DIGITS, examples, length_weights
from streamrl.examples.reverse_digits.task import EOS


def test_length_weights_are_the_normalised_power_law():
    weights = length_weights(24, 1.5)
    total = sum(1 / n**1.5 for n in range(1, 25))
    assert len(weights) == 24
    for n, w in enumerate(weights, start=1):
        assert w == pytest.approx(1 / n**1.5 / total, rel=1e-12)
    with pytest.raises(ValueError):
        length_weights(0)


def test_completion_lengths_are_heavy_tailed_median_at_most_a_sixth_of_the_longest():
    rows = examples(4000, seed=1)
    # completion tokens: the digits, then EOS
    lengths = [len(r["answer"]) + 1 for r in rows]
    assert statistics.median(lengths) <= (MAX_DIGITS + 1) / 6
    assert max(lengths) == MAX_DIGITS + 1
    assert all(r["prompt"] == r["answer"] + ">" for r in rows)
    assert examples(50, seed=1) == rows[:50]
    assert examples(50, seed=2) != rows[:50]


def test_the_reward_credits_a_copy_position_by_position():
    turn = lambda text: [{"role": "assistant", "content": text, "raw_content": text}]  # noqa: E731
    assert sum(copy_digits(turn("40712" + EOS), "40712").values()) == pytest.approx(1.0)
    assert copy_digits_exact(turn("40712" + EOS), "40712") == 1.0
    # four of five digits right, stopped at the right place
    assert sum(copy_digits(turn("40719" + EOS), "40712").values()) == pytest.approx(0.82)
    assert copy_digits_exact(turn("4071" + EOS), "40712") == 0.0


def test_the_preset_loads_by_name_and_its_target_names_a_reward():
    cfg = load_config("longtail_cpu", env={})
    names = {f.name for f in cfg.reward.functions}
    assert set(cfg.run.target_parts) <= names
    assert cfg.actor.refill and cfg.actor.engine == "hf"
    # the longest prompt and completion fit the demo model's 64 positions
    assert (MAX_DIGITS + 1) + cfg.rollout.max_new_tokens <= 64
    exact = cfg.run.target_parts["copy_digits_exact"]
    assert LONGTAIL.target() == (cfg.run.target_reward, exact, cfg.run.target_window)


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    """The long-tail policy with a two-step warm start: the loop's pieces, not its learning."""
    torch.set_num_threads(1)
    path = tmp_path_factory.mktemp("longtail") / "policy"
    return build_policy(path, seed=0, warm_start_steps=2)


def test_left_padded_prompts_give_the_log_probs_of_unpadded_ones(tiny_policy):
    from streamrl.policy.load import load_policy, load_tokenizer

    tokenizer = load_tokenizer(tiny_policy)
    # float64: padded and unpadded rows take different kernels, so compare without float32 noise
    model = load_policy(tiny_policy).double().eval()
    prompts = [tokenizer(p)["input_ids"] for p in ("1234567890123>", "5>", "42>")]
    ids, mask = left_pad(prompts, tokenizer.pad_token_id)
    assert mask is not None and mask.sum(1).tolist() == [len(p) for p in prompts]
    torch.manual_seed(0)
    completions, behaviour = sample(
        model, ids, 12, tokenizer.eos_token_id, tokenizer.pad_token_id, 1.0, mask
    )
    with torch.no_grad():
        padded = token_logprobs(model, ids, completions, 1.0, mask)
        for row, prompt in enumerate(prompts):
            alone = token_logprobs(model, torch.tensor([prompt]), completions[row : row + 1], 1.0)
            # the loop rounds to float32: values that agree in float64 differ by at most an ulp
            torch.testing.assert_close(padded[row], alone[0], atol=1e-9, rtol=2.4e-7)
    live = completions != tokenizer.pad_token_id
    # the KV-cache sampler's behaviour log-probs are the full forward pass's
    torch.testing.assert_close(behaviour[live], padded[live], atol=1e-5, rtol=0)


def test_the_synchronous_loop_runs_the_long_tail_task(tiny_policy, tmp_path):
    (tmp_path / "policy").symlink_to(tiny_policy)
    result = run_reference(
        0,
        600,
        tmp_path,
        ["learner.groups_per_step=2", "rollout.group_size=4"],
        max_rollouts=2,
        echo=lambda line: None,
        task=LONGTAIL,
    )
    assert result["steps"] == 2 and result["task"] == "longtail"
    assert all(0.0 <= reward <= 1.0 for _, reward, _ in result["curve"])


def test_grid_points_parse_and_bad_ones_are_named():
    assert longtail.parse_grid("3e-4:0, 6e-4:0.1") == [(3e-4, 0.0), (6e-4, 0.1)]
    for bad in ("3e-4", "x:0", "3e-4:-1", "3e-4:0,3e-4:0"):
        with pytest.raises(argparse.ArgumentTypeError):
            longtail.parse_grid(bad)


def test_the_yardstick_log_becomes_a_curve_timed_from_the_end_of_its_warm_start(tmp_path):
    log = tmp_path / "log.csv"
    header = ["phase", "step", "wall_s", "cpu_s", "reward_mean", "exact_frac"]
    with open(log, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerow(["sft", 0, "1.0", "1", "", ""])
        writer.writerow(["sft", 59, "4.0", "4", "", ""])
        rng = random.Random(0)
        rewards = [rng.random() for _ in range(3)]
        for step, reward in enumerate(rewards):
            writer.writerow(["rl", step, f"{5.0 + step}", "5", f"{reward}", "0.5"])
    curve, warm = longtail.yardstick_curve(log)
    assert warm == 4.0
    assert curve == [(1.0 + step, reward, 0.5) for step, reward in enumerate(rewards)]


# the reference folder's files the yardstick was copied from, as they were
YARDSTICK_SHA256 = {
    "grpo_toy.py": "690aefa68449634a439e1fdd454e681b595dffcc9b669cdbe44db09553d4caf7",
    "make_tiny.py": "f8a235c3dc38cebc68e4dbd000907f81428cd6b6efd1c7e46e6f77480db0361c",
}


def test_the_default_yardstick_is_the_unchanged_copy_the_repository_carries():
    repository = Path(longtail.__file__).resolve().parents[1]
    assert longtail.DEFAULT_YARDSTICK.is_relative_to(repository / "bench" / "yardstick")
    for name, digest in YARDSTICK_SHA256.items():
        text = (longtail.DEFAULT_YARDSTICK.parent / name).read_bytes()
        header, _, copied = text.partition(b"\n\n")
        assert b"copied unchanged" in header, name
        assert hashlib.sha256(copied).hexdigest() == digest, f"{name} changed below its header"


def test_without_the_yardstick_the_check_is_skipped_with_a_message(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "nowhere" / "grpo_toy.py"
    longtail.main(["--parts", "yardstick", "--yardstick", str(missing), "--seeds", "0"])
    out = capsys.readouterr().out.strip().splitlines()
    assert any("not found: its check is skipped" in line for line in out)
    assert out[-1] == "RATIO nan"
    assert "skipped" in (tmp_path / longtail.SECTION).read_text()
