"""Learner benchmark: the DeepSpeed ZeRO-2 step against a plain torch AdamW loop, same model and batch.

Both sides run the same micro-batches through the same loss (``learner.algorithm.policy_loss``,
proximal = behaviour so no extra pass), gradient clipping 1.0 and AdamW. The
engine side is the learner's real ``train_batch`` (ZeRO-2, 1 rank, gloo).
Reported: median step time of each, their ratio (goal <= 1.3x) and tokens/s.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import time
from functools import partial

import numpy as np
import torch

from streamrl.configs import Config
from streamrl.learner import algorithm
from streamrl.learner.batching import Sample, collate, plan_rank_micro_batches
from streamrl.learner.engine import build_engine, init_distributed, token_logprobs
from streamrl.learner.step import loss_normalizer, train_batch

MODELS = {
    # name: (hidden, layers, heads, kv heads, intermediate, vocab)
    "demo (0.5M)": (128, 2, 4, 2, 512, 104),
    "qwen2-10M": (256, 4, 8, 2, 1024, 16_000),
}
PROMPT, COMPLETION = 16, 112


def _model(hidden, layers, heads, kv, inter, vocab, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=256, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def _samples(n: int, vocab: int, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    return [
        Sample(
            input_ids=rng.integers(0, vocab, PROMPT + COMPLETION),
            prompt_len=PROMPT,
            behaviour_logprobs=-rng.random(COMPLETION).astype(np.float32) * 3,
            versions=np.zeros(COMPLETION, dtype=np.int64),
            advantage=float(rng.standard_normal()),
            reward=0.0,
            group_id=str(i),
        )
        for i in range(n)
    ]


def _plain_step(model, optimizer, batches, cfg: Config, normalizer: float) -> None:
    a = cfg.algo
    optimizer.zero_grad(set_to_none=True)
    for mb in batches:
        logprobs = token_logprobs(model, mb, 1.0)
        loss, _ = algorithm.policy_loss(
            logprobs, mb.behaviour_logprobs, mb.advantages, mb.completion_mask,
            clip_low=a.clip_low, clip_high=a.clip_high, rho_max=a.rho_max, normalizer=normalizer,
        )  # fmt: skip
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.learner.grad_clip)
    optimizer.step()


def _interleaved_medians(a, b, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """Median seconds of ``a`` and ``b`` run alternately, so load from other processes hits both alike."""
    for _ in range(warmup):
        a()
        b()
    times_a, times_b = [], []
    for _ in range(repeats):
        for fn, times in ((a, times_a), (b, times_b)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times_a), statistics.median(times_b)


def run(quick: bool = False) -> str:
    torch.set_num_threads(1)
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    rank, world = init_distributed()
    n_samples, repeats = (8, 3) if quick else (16, 7)
    cfg = Config.model_validate(
        {
            "algo": {"proximal": "behaviour", "max_staleness": 100},
            "learner": {"micro_batch_tokens": 2048},
        }
    )
    rows = []
    for name, shape in MODELS.items():
        samples = _samples(n_samples, shape[-1])
        tokens = n_samples * COMPLETION
        mine, _ = plan_rank_micro_batches(samples, world, rank, cfg.learner.micro_batch_tokens)
        batches = [collate(b, 0, cfg.learner.micro_batch_tokens) for b in mine]
        normalizer = loss_normalizer(cfg.algo, cfg.rollout, samples, 0)

        plain = _model(*shape)
        plain.train()
        lc = cfg.learner
        optimizer = torch.optim.AdamW(
            plain.parameters(), lr=lc.lr, betas=lc.betas, weight_decay=lc.weight_decay
        )
        engine = build_engine(cfg.learner, _model(*shape), world)
        plain_s, engine_s = _interleaved_medians(
            lambda: _plain_step(plain, optimizer, batches, cfg, normalizer),  # noqa: B023
            partial(
                train_batch,
                engine,
                samples,
                0,
                algo=cfg.algo,
                learner=cfg.learner,
                rollout=cfg.rollout,
                seed=cfg.run.seed,
                rank=rank,
                world=world,
                pad_id=0,
            ),
            repeats,
        )
        params = sum(p.numel() for p in plain.parameters()) / 1e6
        rows.append(
            f"| {name} | {params:.1f}M | {n_samples}x{PROMPT + COMPLETION} ({len(batches)} micro) "
            f"| {plain_s * 1000:.0f} | {engine_s * 1000:.0f} | {engine_s / plain_s:.2f}x | {tokens / engine_s:,.0f} |"
        )
    today = datetime.date.today().isoformat()
    return "\n".join(
        [
            "## Learner: ZeRO-2 step vs plain torch AdamW",
            "",
            f"{today}, {os.cpu_count()} cores, {platform.machine()}, torch {torch.__version__}, 1 rank (gloo), "
            f"1 torch thread. Command: `make bench` (`python -m bench --only learner{' --quick' if quick else ''}`).",
            "Same model, batch, micro-batches and loss on both sides; median of "
            f"{repeats} steps each, the two alternating, after 2 warm-up steps each. Goal: ZeRO-2 / plain <= 1.3x.",
            "",
            "| model | params | batch (samples x tokens) | plain AdamW ms | ZeRO-2 ms | ratio | ZeRO-2 completion tokens/s |",
            "|---|---|---|---|---|---|---|",
            *rows,
        ]
    )


if __name__ == "__main__":
    print(run())
