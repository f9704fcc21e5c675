"""SFT tokens/s: ``streamrl sft`` on the learner against TRL's ``SFTTrainer``, same data and model.

    python -m bench.sft [--steps 30] [--rounds 2]   # writes docs/bench/sft.md

Data: the CPU demo's format warm start (``write_warm_start_dataset``: prompt "314>", a 3-digit
completion and the end token; 8 tokens a row). Models: the demo's tiny Qwen2 (0.5M parameters)
and a wider one with the same tokenizer (hidden 512, 4 layers: 12M), both randomly initialised.
Both systems pack: streamrl its token-budget rows (one step = 256 rows, ~2,048 tokens), TRL
``packing=True`` (best-fit decreasing into ``max_length=2048`` rows, padding-free, position ids
restarting per sample), one packed row a step; the loss on the completion tokens only, AdamW at
3e-4, fp32, one torch thread, no gradient clipping. Each system runs in a process of its own, the
two alternating ``--rounds`` times; tokens/s counts the prompt + completion tokens each trained
per second of its training steps after the first (start-up and the first step's warm-up left out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.cli import command_line, publish

SECTION = Path("docs/bench/sft.md")
BATCH = 256
MAX_LENGTH = 2048
LR = 3e-4
# name -> (hidden, layers, heads, kv heads, intermediate)
MODELS = {"demo (0.5M)": (128, 2, 4, 2, 512), "qwen2-12M": (512, 4, 8, 2, 2048)}


def build_model(folder: Path, shape: tuple[int, ...]) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from streamrl.examples.reverse_digits.task import build_tokenizer

    hidden, layers, heads, kv, inter = shape
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
        max_position_embeddings=64, tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    import torch

    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def run_streamrl(policy: str, data: str, steps: int, work: Path) -> dict:
    from streamrl.configs import load_config
    from streamrl.learner.sft import SFT

    cfg = load_config(
        "sft_cpu",
        [
            f"model.path={policy}", f"supervised.path={data}", f"supervised.batch_size={BATCH}",
            f"run.max_steps={steps}", f"run.dir={work}", "run.report_to=[]",
            "run.export_at_end=false", "supervised.save_optimizer=false",
        ],
        env={},
    )  # fmt: skip
    SFT(cfg).run(echo=lambda _line: None)
    rows = [json.loads(line) for line in (work / "learner_steps.jsonl").read_text().splitlines()]
    timed = rows[1:]
    return {
        "tokens": sum(r["sequence_tokens"] for r in timed),
        "seconds": sum(r["step_s"] for r in timed),
        "steps": len(rows),
    }


def run_trl(policy: str, data: str, steps: int, work: Path) -> dict:
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    marks: list[tuple[float, int]] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            marks.append((time.perf_counter(), state.num_input_tokens_seen))

    args = SFTConfig(
        output_dir=str(work), use_cpu=True, bf16=False, report_to="none", save_strategy="no",
        disable_tqdm=True, packing=True, max_length=MAX_LENGTH, per_device_train_batch_size=1,
        learning_rate=LR, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=0.0,
        lr_scheduler_type="constant", max_steps=steps, logging_steps=10**6,
        include_num_input_tokens_seen=True, dataloader_num_workers=0, seed=0,
    )  # fmt: skip
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(policy),
        args=args,
        train_dataset=load_dataset("json", data_files=data, split="train"),
        processing_class=AutoTokenizer.from_pretrained(policy),
        callbacks=[Clock()],
    )
    trainer.train()
    (t0, n0), (t1, n1) = marks[0], marks[-1]
    return {"tokens": int(n1 - n0), "seconds": t1 - t0, "steps": len(marks)}


def child(system: str, policy: str, data: str, steps: int) -> dict:
    """One system's run in a process of its own (its imports and process group stay there)."""
    with tempfile.TemporaryDirectory() as work:
        done = subprocess.run(
            [sys.executable, "-m", "bench.sft", "--child", system, policy, data, str(steps),
             str(work)],
            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    if done.returncode:
        raise RuntimeError(f"{system} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(steps: int, rounds: int) -> list[dict]:
    from streamrl.examples.reverse_digits.assets import write_warm_start_dataset

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        data = str(write_warm_start_dataset(Path(tmp) / "data.jsonl", steps=steps + 4))
        for name, shape in MODELS.items():
            policy = str(build_model(Path(tmp) / name.split()[0], shape))
            runs: dict[str, list[dict]] = {"streamrl": [], "trl": []}
            for _ in range(rounds):
                for system in runs:
                    runs[system].append(child(system, policy, data, steps))
                    print(name, system, runs[system][-1], flush=True)
            rates = {s: [r["tokens"] / r["seconds"] for r in rs] for s, rs in runs.items()}
            results.append({"model": name, "rates": rates})
    return results


def render(results: list[dict], steps: int, rounds: int, argv: list[str] | None) -> str:
    import torch
    import trl

    lines = [
        "## SFT: streamrl sft vs TRL SFTTrainer",
        "",
        f"{datetime.date.today()}, {os.cpu_count()} cores, {platform.machine()}, torch "
        f"{torch.__version__}, TRL {trl.__version__}, 1 torch thread. Command: "
        f"`{command_line('bench.sft', argv)}`.",
        f"Same data and model, packing on for both, {steps} steps each, {rounds} alternating "
        "runs per system (median). Goal: streamrl / TRL >= 1.0x.",
        "",
        "| model | streamrl tokens/s | TRL tokens/s | ratio | runs (streamrl; TRL) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        ours, theirs = (statistics.median(r["rates"][s]) for s in ("streamrl", "trl"))
        runs = "; ".join(", ".join(f"{v:,.0f}" for v in r["rates"][s]) for s in ("streamrl", "trl"))
        lines.append(
            f"| {r['model']} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x | {runs} |"
        )
    return "\n".join(lines) + "\n"


def run(quick: bool = False) -> str:
    """The section, for `make bench` (``bench.__main__`` writes it)."""
    steps, rounds = (5, 1) if quick else (30, 2)
    return render(measure(steps, rounds), steps, rounds, [])


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--child":
        import torch

        torch.set_num_threads(1)
        system, policy, data, steps, work = argv[1:]
        run = run_streamrl if system == "streamrl" else run_trl
        print(json.dumps(run(policy, data, int(steps), Path(work))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    results = measure(args.steps, args.rounds)
    publish(SECTION, render(results, args.steps, args.rounds, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
