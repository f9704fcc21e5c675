"""Actor engines side by side: the vLLM engine (CPU build) vs the hf engine, tokens/s on the demo
policy and on a ~10M-parameter Qwen2, with and without a weight push before every generation step.

    make bench-vllm          (= python -m bench --only engines, in .venv-vllm)

Both engines are the actor's own (``actors.engines``), built from one config, and get their weights
the way they do in a run: a learner-side publisher writes each version into shared memory and
announces it in a real Redis; the vLLM engine's workers load the slot themselves (``streamrl_shm``),
the hf engine's subscriber stages it and the engine swaps it in between decode steps. One step =
one batch of requests (an actor's batch), sampled at temperature 1 until EOS or the token limit.
With pushes, the learner publishes a new version before each step (not timed: that is the
learner's cost) and the step's time runs until the engine has generated the batch *and* serves the
new version, so the whole push is inside it.

Two rates per engine, best of the steps: tokens per CPU-second of every process the engine computes
in (the benchmark process, plus vLLM's engine core and worker), and wall-clock tokens/s. The
machines are shared: wall-clock rates swing with whatever else runs, the CPU cost per token does
not. The two engines' steps alternate, so load hits both alike. Every process runs one torch thread.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import torch

# the benchmark is the only thing vLLM shares the machine with here; see actors/engines/vllm/engine.py
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

BATCH = 64
NEW_TOKENS = 48


def _ten_million(folder: Path) -> Path:
    """A random-init Qwen2 of ~10M parameters on the demo's character tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from streamrl.examples.reverse_digits.task import build_tokenizer

    if (folder / "config.json").exists():
        return folder
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=256, intermediate_size=1024, num_hidden_layers=10,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _config(url: str, policy: Path, engine: str):
    from streamrl.configs import Config

    return Config.model_validate(
        {
            "run": {"name": f"bench-{engine}-{uuid.uuid4().hex[:8]}", "dir": tempfile.gettempdir()},
            "broker": {"redis_url": url},
            "model": {"path": str(policy)},
            "actor": {"engine": engine, "batch_slots": BATCH},
            "weightsync": {"transport": "shm", "timeout_s": 120},
        }
    )


class _Side:
    """One engine, the publisher feeding it, its version counter and the processes it computes in."""

    def __init__(self, url: str, policy: Path, engine: str) -> None:
        from streamrl.actors import engines
        from streamrl.policy.load import load_policy, load_tokenizer
        from streamrl.weightsync.feed import WeightFeed
        from streamrl.weightsync.publisher import Publisher

        self.name = engine
        cfg = _config(url, policy, engine)
        self.tokenizer = load_tokenizer(policy)
        self.weights = {n: p.detach().clone() for n, p in load_policy(policy).named_parameters()}
        self.publisher = Publisher.from_config(cfg.weightsync, cfg.broker, cfg.run)
        feed = WeightFeed.from_config(cfg.weightsync, cfg.broker, cfg.run, "bench")
        parts = engines.EngineParts(feed, self.tokenizer, seed=0)
        me = psutil.Process()
        before = {p.pid for p in me.children(recursive=True)}
        started = time.perf_counter()
        self.engine = engines.get(engine).from_config(parts, model=cfg.model, actor=cfg.actor)
        self.start_s = time.perf_counter() - started
        # this process and the ones the engine started (vLLM's engine core and worker)
        self.processes = [me] + [p for p in me.children(recursive=True) if p.pid not in before]
        self.version = 0

    def cpu_seconds(self) -> float:
        # user + system
        return sum(sum(p.cpu_times()[:2]) for p in self.processes)

    def step(self, requests, params, push: bool) -> tuple[int, float, float]:
        """One batch (after publishing a new version when ``push``): tokens, CPU and wall seconds."""
        if push:
            self.version += 1
            self.publisher.publish(self.version, self.weights)
        started, cpu = time.perf_counter(), self.cpu_seconds()
        outputs = self.engine.generate(requests, params)
        while self.engine.version != self.version:
            self.engine.maybe_swap_weights()
            time.sleep(0.001)
        tokens = sum(len(o.token_ids) for o in outputs)
        return tokens, self.cpu_seconds() - cpu, time.perf_counter() - started

    def close(self) -> None:
        self.engine.close()
        self.publisher.close()


def _requests(tokenizer, n: int, step: int):
    from streamrl.actors.engines.base import Request
    from streamrl.examples.reverse_digits.task import make_example

    rng = random.Random(step)
    prompts = [tokenizer(make_example(rng)["prompt"])["input_ids"] for _ in range(n)]
    return [Request(f"{step}-{i}", p) for i, p in enumerate(prompts)]


def _measure(url: str, policy: Path, steps: int) -> dict:
    from streamrl.actors.engines.base import SamplingParams

    hf = _Side(url, policy, "hf")
    vllm = _Side(url, policy, "vllm")
    params = SamplingParams(max_new_tokens=NEW_TOKENS, stop_token_ids=(hf.tokenizer.eos_token_id,))
    rates: dict[tuple[str, bool, str], list[float]] = {}
    try:
        # version 1 and first-use costs, not reported
        for side in (hf, vllm):
            side.step(_requests(side.tokenizer, BATCH, -1), params, push=True)
        for step in range(steps):
            for push in (False, True):
                for side in (vllm, hf) if step % 2 else (hf, vllm):
                    requests = _requests(side.tokenizer, BATCH, step)
                    tokens, cpu, wall = side.step(requests, params, push)
                    rates.setdefault((side.name, push, "cpu"), []).append(tokens / cpu)
                    rates.setdefault((side.name, push, "wall"), []).append(tokens / wall)
    finally:
        vllm.close()
        hf.close()
    return {
        "params": sum(t.numel() for t in hf.weights.values()),
        "best": {key: max(values) for key, values in rates.items()},
        "vllm_start": vllm.start_s,
    }


def run(quick: bool = False) -> str:
    import vllm

    from bench.__main__ import machine
    from streamrl.broker.server import EmbeddedRedis
    from streamrl.configs import Config
    from streamrl.examples.reverse_digits.assets import build_policy

    torch.set_num_threads(1)
    steps = 2 if quick else 10
    command = f"python -m bench --only engines{' --quick' if quick else ''}"
    lines = [
        "## Actor engines: vLLM (CPU build) vs hf",
        "",
        f"{time.strftime('%Y-%m-%d')} · {machine()}, vLLM {vllm.__version__} · command: "
        f"`make bench-vllm` (`{command}`, in .venv-vllm)",
        "",
        f"Each engine built as an actor builds it; one step = {BATCH} requests, temperature 1, up "
        f"to {NEW_TOKENS} new tokens (random-init policies: few stop early). *push* = the learner "
        "publishes a new version (shm) before every step and the step lasts until the engine "
        f"serves it. Best of {steps} steps, the engines' steps alternating. *CPU* = tokens per "
        "CPU-second of the processes the engine computes in (vLLM: the benchmark's, its engine "
        "core's and its worker's); *wall* = tokens per second of wall clock. vLLM: eager, "
        "float32, 1 GiB KV cache.",
        "",
        "| model | params | push | hf tokens/CPU-s | vLLM tokens/CPU-s | vLLM / hf (CPU) "
        "| hf tokens/s (wall) | vLLM tokens/s (wall) | vLLM / hf (wall) |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    push_ratios, starts = [], []
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        models = {
            "demo": build_policy(Path(tmp) / "demo", warm_start_steps=0),
            "qwen2-10M": _ten_million(Path(tmp) / "ten"),
        }
        with EmbeddedRedis(Config().broker, Path(tmp) / "redis") as server:
            for name, policy in models.items():
                r = _measure(server.url, policy, steps)
                best = r["best"]
                for push in (False, True):
                    row = (
                        f"| {name} | {r['params'] / 1e6:.1f}M | {'every step' if push else 'none'} "
                    )
                    for clock in ("cpu", "wall"):
                        hf, vl = best[("hf", push, clock)], best[("vllm", push, clock)]
                        row += f"| {hf:,.0f} | {vl:,.0f} | {vl / hf:.2f} "
                    lines.append(row + "|")
                for engine in ("hf", "vllm"):
                    ratio = best[(engine, True, "cpu")] / best[(engine, False, "cpu")]
                    push_ratios.append(f"{name} {engine} {ratio:.2f}")
                starts.append(f"{r['vllm_start']:.0f} s ({name})")
    lines += [
        "",
        "Tokens per CPU-second with a push every step / without: " + ", ".join(push_ratios) + ".",
        "The vLLM engine was built (after `import vllm`: engine core, worker, KV cache, warm-up) in "
        + " and ".join(starts)
        + ".",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    print(run(quick="--quick" in sys.argv))
