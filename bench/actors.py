"""Actor engine throughput: our hf decode loop vs transformers ``generate`` on the same model, same run.

Both sample every token (temperature 1, no stop token, fixed length) from the
demo policy with one torch thread. Rates are tokens per CPU-second of this
process (``time.process_time``): the machines are shared, and wall-clock rates
swing with whatever else runs, while the CPU cost per token does not. A second table repeats our loop with a
weight update (a full in-place copy of every parameter) every N decode steps,
the way the actor swaps in staged weights between steps.
"""

from __future__ import annotations

import datetime
import os
import platform
import tempfile
import time

import torch

from streamrl.actors.engines.base import Request, SamplingParams
from streamrl.actors.engines.hf.engine import HFEngine
from streamrl.examples.reverse_digits.assets import build_policy
from streamrl.examples.reverse_digits.task import make_example
from streamrl.policy.load import load_policy, load_tokenizer


class _EveryNSteps:
    """A weight source that stages a fresh copy of the weights every ``every`` polls."""

    def __init__(self, model, every: int) -> None:
        self.every = every
        self.polls = 0
        self.version = 0
        self.tensors = {name: p.detach().clone() for name, p in model.named_parameters()}

    def take_staged(self):
        self.polls += 1
        if self.polls % self.every:
            return None
        self.version += 1
        return self.version, self.tensors

    def applied(self, version: int, recycled: dict | None = None) -> None:
        # the swapped-out weights are the next staging copy, as in weightsync
        self.tensors = recycled


def _prompts(tokenizer, batch: int) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [tokenizer(make_example(rng)["prompt"])["input_ids"] for _ in range(batch)]


def _ours(model, tokenizer, prompts, new_tokens: int, source=None) -> float:
    engine = HFEngine(model, tokenizer, batch_slots=len(prompts), weight_source=source, seed=0)
    params = SamplingParams(max_new_tokens=new_tokens)
    requests = [Request(str(i), p) for i, p in enumerate(prompts)]
    start = time.process_time()
    outputs = engine.generate(requests, params)
    elapsed = time.process_time() - start
    return sum(len(o.token_ids) for o in outputs) / elapsed


def _hf_generate(model, tokenizer, prompts, new_tokens: int) -> float:
    # demo prompts share one length: no padding needed
    ids = torch.tensor(prompts)
    start = time.process_time()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    elapsed = time.process_time() - start
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / elapsed


def run(quick: bool = False) -> str:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = build_policy(f"{tmp}/policy", warm_start_steps=0)
        model = load_policy(path)
        tokenizer = load_tokenizer(path)
    new_tokens = 24 if quick else 48
    repeats = 1 if quick else 5
    batches = (1, 16, 64)
    lines = [
        "## Actors: hf engine decode throughput",
        "",
        f"{datetime.date.today().isoformat()}, {os.cpu_count()} cores {platform.machine()}, "
        f"torch {torch.__version__}, 1 thread; command: `make bench`"
        f"{' (quick)' if quick else ''}. Demo policy (~0.5M params), {new_tokens} sampled tokens per sequence, "
        "tokens per CPU-second of the benchmark process, "
        f"best of {repeats}.",
        "",
        "| batch | ours tokens/s | HF generate tokens/s | ours / generate |",
        "|---:|---:|---:|---:|",
    ]
    for batch in batches:
        prompts = _prompts(tokenizer, batch)
        # warm-up
        _ours(model, tokenizer, prompts, 4)
        ours, ref = [], []
        # interleaved, so load changes hit both sides alike
        for _ in range(repeats):
            ours.append(_ours(model, tokenizer, prompts, new_tokens))
            ref.append(_hf_generate(model, tokenizer, prompts, new_tokens))
        lines.append(
            f"| {batch} | {max(ours):,.0f} | {max(ref):,.0f} | {max(ours) / max(ref):.2f} |"
        )
    lines += [
        "",
        "With a weight update (in-place copy of all parameters) every N decode steps, interleaved with",
        "runs without updates:",
        "",
        "| batch | N | tokens/s | without updates | ratio |",
        "|---:|---:|---:|---:|---:|",
    ]
    for batch in batches:
        prompts = _prompts(tokenizer, batch)
        rates: dict[int, list[float]] = {0: [], 1: [], 8: []}
        for _ in range(repeats):
            for every in rates:
                source = _EveryNSteps(model, every) if every else None
                rates[every].append(_ours(model, tokenizer, prompts, new_tokens, source))
        base = max(rates[0])
        for every in (1, 8):
            rate = max(rates[every])
            lines.append(f"| {batch} | {every} | {rate:,.0f} | {base:,.0f} | {rate / base:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    print(run(quick="--quick" in sys.argv))
