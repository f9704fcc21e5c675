"""Actor engine throughput: our hf decode loop vs transformers ``generate`` on the same model, same run.

Both sample every token (temperature 1, no stop token, fixed length) from the
demo policy with one torch thread. A second table repeats our loop with a
weight update (a full in-place copy of every parameter) every N decode steps,
the way the actor swaps in staged weights between steps.
"""

from __future__ import annotations

import datetime
import platform
import tempfile
import time

import torch

from actors.demo_task import ensure_demo_policy, make_example
from actors.engines.base import Request, SamplingParams
from actors.engines.hf import HFEngine
from weightsync.policy import load_policy, load_tokenizer


class _EveryNSteps:
    """A weight source that stages a fresh copy of the weights every ``every`` polls."""

    def __init__(self, model, every: int) -> None:
        self.every = every
        self.polls = 0
        self.version = 0
        self.tensors = {name: t.detach().clone() for name, t in model.state_dict().items()}

    def take_staged(self):
        self.polls += 1
        if self.polls % self.every:
            return None
        self.version += 1
        return self.version, self.tensors

    def applied(self, version: int) -> None:
        pass


def _prompts(tokenizer, batch: int) -> list[list[int]]:
    import random

    rng = random.Random(0)
    return [tokenizer(make_example(rng)["prompt"])["input_ids"] for _ in range(batch)]


def _ours(model, tokenizer, prompts, new_tokens: int, source=None) -> float:
    engine = HFEngine(model, tokenizer, batch_slots=len(prompts), weight_source=source, seed=0)
    params = SamplingParams(max_new_tokens=new_tokens)
    requests = [Request(str(i), p) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    outputs = engine.generate(requests, params)
    elapsed = time.perf_counter() - start
    return sum(len(o.token_ids) for o in outputs) / elapsed


def _hf_generate(model, tokenizer, prompts, new_tokens: int) -> float:
    ids = torch.tensor(prompts)  # demo prompts share one length: no padding needed
    start = time.perf_counter()
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
    elapsed = time.perf_counter() - start
    return (out.shape[1] - ids.shape[1]) * ids.shape[0] / elapsed


def _best(fn, repeats: int) -> float:
    return max(fn() for _ in range(repeats))


def run(quick: bool = False) -> str:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = ensure_demo_policy(f"{tmp}/policy", warm_start_steps=0)
        model = load_policy(path)
        tokenizer = load_tokenizer(path)
    new_tokens = 24 if quick else 48
    repeats = 1 if quick else 3
    batches = (1, 16, 64)
    lines = [
        "## Actors: hf engine decode throughput",
        "",
        f"{datetime.date.today().isoformat()}, {platform.machine()} {platform.processor() or ''}, "
        f"torch {torch.__version__}, 1 thread; command: `make bench`"
        f"{' (quick)' if quick else ''}. Demo policy (~0.5M params), {new_tokens} sampled tokens per sequence, "
        f"best of {repeats}.",
        "",
        "| batch | ours tokens/s | HF generate tokens/s | ours / generate |",
        "|---:|---:|---:|---:|",
    ]
    ours_by_batch = {}
    for batch in batches:
        prompts = _prompts(tokenizer, batch)
        _ours(model, tokenizer, prompts, 4)  # warm-up
        ours = _best(lambda p=prompts: _ours(model, tokenizer, p, new_tokens), repeats)
        ref = _best(lambda p=prompts: _hf_generate(model, tokenizer, p, new_tokens), repeats)
        ours_by_batch[batch] = ours
        lines.append(f"| {batch} | {ours:,.0f} | {ref:,.0f} | {ours / ref:.2f} |")
    lines += [
        "",
        "With a weight update (in-place copy of all parameters) every N decode steps:",
        "",
        "| batch | N | tokens/s | vs no updates |",
        "|---:|---:|---:|---:|",
    ]
    for batch in batches:
        prompts = _prompts(tokenizer, batch)
        for every in (1, 8):
            rate = _best(
                lambda p=prompts, e=every: _ours(model, tokenizer, p, new_tokens, _EveryNSteps(model, e)), repeats
            )
            lines.append(f"| {batch} | {every} | {rate:,.0f} | {rate / ours_by_batch[batch]:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    print(run(quick="--quick" in sys.argv))
