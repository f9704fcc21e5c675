"""Peak GPU memory of one learner rank per memory knob: an estimate from the model's shape, and a measurement.

    python -m bench.learner_memory                        # the estimate table of docs/gpu.md
    python -m bench.learner_memory --measure --device cuda  # measure at the Qwen2.5-0.5B shape
    python -m bench.learner_memory --measure --cpu          # the same code at a tiny shape on the CPU (smoke)

The estimate counts bytes, per rank, at the peak of a micro-batch's backward pass (bf16 weights,
DeepSpeed ZeRO-2 with ``learner.ranks`` ranks):

- weights: 2 bytes per parameter (bf16, every rank holds them all);
- trainable state (ZeRO-2 partitions it over the ranks): bf16 gradient partition (2), fp32 master
  weights (4), Adam moments (8) = 14 bytes per trainable parameter; with ``offload_optimizer`` it
  lives in host memory instead (16 bytes: the fp32 gradient too), and the GPU keeps none of it;
- DeepSpeed's gradient reduction bucket: ``reduce_bucket_size`` (5e8) bf16 elements, allocated
  whole whatever the model's size;
- activations saved for the backward pass, per token of the micro-batch's padded tensor
  (``learner.micro_batch_tokens`` bounds it): ``activation_bytes_per_token``;
- the log-prob head, per token: ``head_bytes_per_token`` (today's learner step always takes the
  entropy with gradients).

Left out: the CUDA context (~0.5 GiB, outside PyTorch's allocator), allocator fragmentation and
cuBLAS/attention workspaces. Against the two peaks measured on an H200 at the 0.5B shape (45.7
GiB at 8,192 tokens, 84.0 at 16,384) the count comes out 6-8 % low. ``--measure`` runs the
learner's real ``train_batch`` (DeepSpeed, the loss, the optimizer) on a random-init model of the
shape, once per knob set in a fresh process (about a minute of training in all, plus start-ups),
and reports PyTorch's peak allocated and reserved memory and trained tokens per second.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

GiB = 1 << 30
ROOT = Path(__file__).resolve().parents[1]
REDUCE_BUCKET = 500_000_000
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * (self.hidden // self.heads)


# the config.json of each Qwen2.5 model on the hub
SHAPES = {
    "Qwen2.5-0.5B": Shape(896, 24, 14, 2, 4864, 151936, True),
    "Qwen2.5-1.5B": Shape(1536, 28, 12, 2, 8960, 151936, True),
    "Qwen2.5-3B": Shape(2048, 36, 16, 2, 11008, 151936, True),
    "Qwen2.5-7B": Shape(3584, 28, 28, 4, 18944, 152064, False),
}
# the --cpu smoke shape: every code path of the measurement, seconds on one core
TINY = Shape(64, 2, 4, 2, 128, 512, True)


def parameters(s: Shape) -> int:
    """Parameters of a Qwen2 causal LM of this shape (q, k, v carry biases; tied head counted once)."""
    h, kv = s.hidden, s.kv_dim
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * s.intermediate + 2 * h
    return s.vocab * h * (1 if s.tied else 2) + s.layers * layer + h


def lora_parameters(s: Shape, rank: int) -> int:
    """Adapter parameters of rank ``rank`` on every linear layer of the decoder (``LORA_TARGETS``)."""
    h, kv, i = s.hidden, s.kv_dim, s.intermediate
    # (in, out) of q, k, v, o, gate, up, down; an adapter is A [rank, in] and B [out, rank]
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]
    return s.layers * sum(rank * (fan_in + fan_out) for fan_in, fan_out in shapes)


@dataclass(frozen=True)
class Knobs:
    micro_batch_tokens: int
    gradient_checkpointing: bool = False
    offload_optimizer: bool = False
    # today's learner step takes the entropy with gradients; 12 instead of 20 bytes per vocab entry without
    entropy_grad: bool = True
    lora_rank: int = 0
    ranks: int = 1
    # padded row length: GSM8K's prompts and 512-token completions
    seq_len: int = 640


@dataclass(frozen=True)
class Estimate:
    """Bytes on one rank's GPU at its peak, by part, and the host memory an offloaded optimizer takes."""

    weights: int
    trainable_state: int
    bucket: int
    activations: int
    logits: int
    host: int

    @property
    def gpu(self) -> int:
        return self.weights + self.trainable_state + self.bucket + self.activations + self.logits


def activation_bytes_per_token(s: Shape, gradient_checkpointing: bool, seq_len: int) -> int:
    """Bytes the decoder saves for the backward pass per token (bf16 weights), final norm included.

    A layer: its two RMSNorms (the fp32 input, 4h, and the bf16 normalised input, 2h, each, plus
    the bf16 output the next projection saves, 2h), q, k and v repeated to every head, and the
    attention output (8h), its fp32 log-sum-exp per head, o_proj's input (2h), the MLP's gate, up,
    SiLU and product (8i), and the attention's additive bf16 padding mask (2 x the padded row
    length ``seq_len``). The final RMSNorm adds 6h. With gradient checkpointing each layer keeps
    only its input (2h) and the backward recomputes one layer at a time.
    """
    outside = 6 * s.hidden
    if gradient_checkpointing:
        return s.layers * 2 * s.hidden + layer_bytes_per_token(s, seq_len) + outside
    return s.layers * layer_bytes_per_token(s, seq_len) + outside


def layer_bytes_per_token(s: Shape, seq_len: int) -> int:
    return 24 * s.hidden + 8 * s.intermediate + 4 * s.heads + 2 * seq_len


def head_bytes_per_token(s: Shape, entropy_grad: bool) -> tuple[int, int]:
    """(saved by the forward, peak in the backward) of the log-prob head (``sequence_logprobs``).

    Saved: the fp32 log-softmax (4 bytes per vocabulary entry) and, with the entropy, its exp (4).
    The backward adds fp32 gradients of the same size before it frees them: of the log-probs and
    the log-softmax's input (8), and with the entropy those of its two factors (4 more).
    """
    saved = s.vocab * (8 if entropy_grad else 4)
    return saved, saved + s.vocab * (12 if entropy_grad else 8)


def estimate(s: Shape, k: Knobs) -> Estimate:
    total = parameters(s)
    trainable = lora_parameters(s, k.lora_rank) if k.lora_rank else total
    on_gpu_state = 0 if k.offload_optimizer else 14 * trainable // k.ranks
    return Estimate(
        weights=2 * (total + (trainable if k.lora_rank else 0)),
        trainable_state=on_gpu_state,
        bucket=2 * REDUCE_BUCKET,
        activations=k.micro_batch_tokens
        * activation_bytes_per_token(s, k.gradient_checkpointing, k.seq_len),
        logits=k.micro_batch_tokens * head_bytes_per_token(s, k.entropy_grad)[1],
        host=16 * trainable // k.ranks if k.offload_optimizer else 0,
    )


def shape_of(model_path: str) -> Shape:
    """The shape of a Qwen2.5 model named in ``model.path`` (hub id or folder name)."""
    for name, shape in SHAPES.items():
        if name.lower() in model_path.lower():
            return shape
    raise ValueError(f"model.path {model_path!r}: no known shape (known: {', '.join(SHAPES)})")


def config_estimate(cfg) -> Estimate:
    """The estimate for a run's learner (``cfg``: a ``Config``), today's entropy with gradients included."""
    lc = cfg.learner
    knobs = Knobs(
        lc.micro_batch_tokens,
        gradient_checkpointing=lc.gradient_checkpointing,
        offload_optimizer=lc.offload_optimizer,
        ranks=lc.ranks,
        # a GSM8K-sized prompt (~128 tokens with the chat template) before the longest completion
        seq_len=128 + cfg.rollout.max_new_tokens,
    )
    return estimate(shape_of(cfg.model.path), knobs)


KNOB_ROWS = {
    "ZeRO-2": {},
    "+ gradient checkpointing": {"gradient_checkpointing": True},
    "+ optimizer offload": {"offload_optimizer": True},
    "+ both": {"gradient_checkpointing": True, "offload_optimizer": True},
    "LoRA r=16": {"lora_rank": 16},
    "LoRA r=16 + checkpointing": {"lora_rank": 16, "gradient_checkpointing": True},
}
TOKENS = (8192, 16384)


def table(entropy_grad: bool = True) -> str:
    """Markdown: estimated peak GiB per model, knob row and micro-batch size."""
    head = "| model | params | knobs | " + " | ".join(f"{t:,} tokens" for t in TOKENS) + " | host |"
    lines = [head, "|---|---|---|" + "---|" * len(TOKENS) + "---|"]
    for name, shape in SHAPES.items():
        for label, knobs in KNOB_ROWS.items():
            ests = [estimate(shape, Knobs(t, entropy_grad=entropy_grad, **knobs)) for t in TOKENS]
            host = f"{ests[0].host / GiB:.1f} GiB" if ests[0].host else "-"
            cells = " | ".join(f"{e.gpu / GiB:.1f}" for e in ests)
            lines.append(
                f"| {name} | {parameters(shape) / 1e9:.2f}B | {label} | {cells} | {host} |"
            )
    return "\n".join(lines)


# ---- measurement -------------------------------------------------------------------------------
MEASURED = {
    "ZeRO-2": {},
    "+ gradient checkpointing": {"gradient_checkpointing": True},
    "+ optimizer offload": {"offload_optimizer": True},
}


def _samples(n: int, vocab: int, prompt: int, completion: int, seed: int):
    import numpy as np

    from streamrl.learner.batching import Sample

    rng = np.random.default_rng(seed)
    return [
        Sample(
            input_ids=rng.integers(0, vocab, prompt + completion),
            prompt_len=prompt,
            behaviour_logprobs=-rng.random(completion).astype(np.float32) * 3,
            versions=np.zeros(completion, dtype=np.int64),
            advantage=float(rng.standard_normal()),
            reward=0.0,
            group_id=str(i),
        )
        for i in range(n)
    ]


def measure_one(
    shape: Shape, knobs: dict, tokens: int, seconds: float, device: str, steps_min: int = 2
) -> dict:
    """Train the learner's real step on a random-init model of ``shape`` for ``seconds`` (at least
    ``steps_min`` steps); peak memory and trained tokens/s. Run in a fresh process per knob set."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from streamrl.configs import Config
    from streamrl.learner.engine import build_engine, init_distributed
    from streamrl.learner.step import train_batch

    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device == "cuda" else "cpu")
    rank, world = init_distributed()
    cfg = Config.model_validate(
        {
            # the recipe's objective; no proximal pass, whose no-grad memory is never the peak
            "algo": {"proximal": "behaviour", "max_staleness": 100, "clip_high": 0.28},
            "learner": {"micro_batch_tokens": tokens, **knobs},
            "rollout": {"max_new_tokens": 512},
        }
    )
    config = Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, tie_word_embeddings=shape.tied,
        max_position_embeddings=4096,
    )  # fmt: skip
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    engine = build_engine(cfg.learner, model, world)
    # GSM8K-like rows: a 128-token prompt and a 512-token completion; 4 micro-batches per step
    prompt, completion = (128, 512) if device == "cuda" else (8, 24)
    samples = _samples(4 * (tokens // (prompt + completion)), shape.vocab, prompt, completion, 0)

    def step() -> None:
        train_batch(
            engine, samples, 0, algo=cfg.algo, learner=cfg.learner, rollout=cfg.rollout,
            seed=0, rank=rank, world=world, pad_id=0,
        )  # fmt: skip

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up: allocator, DeepSpeed buckets, kernels
    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    steps, t0 = 0, time.perf_counter()
    while steps < steps_min or time.perf_counter() - t0 < seconds:
        step()
        steps += 1
    sync()
    elapsed = time.perf_counter() - t0
    out = {
        "steps": steps,
        "tokens_per_s": steps * len(samples) * (prompt + completion) / elapsed,
        "optimizer": type(engine.basic_optimizer).__name__,
    }
    if device == "cuda":
        out["peak_allocated"] = torch.cuda.max_memory_allocated()
        out["peak_reserved"] = torch.cuda.max_memory_reserved()
        out["device_name"] = torch.cuda.get_device_name()
    else:
        import resource

        # kilobytes on Linux: the process's peak resident size, model and all
        out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return out


def measure(shape_name: str, tokens: int, seconds: float, device: str) -> list[tuple[str, dict]]:
    """``measure_one`` per row of ``MEASURED``, each in its own process (DeepSpeed engines do not
    free all of their memory in-process); a row that runs out of memory reports the error."""
    rows = []
    for label, knobs in MEASURED.items():
        job = {"shape": shape_name, "knobs": knobs, "tokens": tokens, "seconds": seconds}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.learner_memory",
                "--one",
                json.dumps(job),
                "--device",
                device,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        lines = done.stdout.strip().splitlines()
        if done.returncode == 0 and lines:
            rows.append((label, json.loads(lines[-1])))
        else:
            tail = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
            rows.append((label, {"error": tail[0][:200]}))
    return rows


def measured_table(shape_name: str, tokens: int, rows: list[tuple[str, dict]], device: str) -> str:
    """Markdown: each measured knob set beside its estimate. On the CPU the peak is the process's
    resident size (model, libraries and all), which the estimate of GPU memory does not predict."""
    shape = SHAPES.get(shape_name, TINY)
    peak = "peak allocated GiB | peak reserved GiB" if device == "cuda" else "peak RSS GiB | -"
    name = next((r["device_name"] for _, r in rows if "device_name" in r), device)
    lines = [
        f"Measured: {shape_name} shape, random init, {tokens:,}-token micro-batches, on {name}.",
        "",
        f"| knobs | {peak} | estimate GiB | tokens/s | steps | optimizer |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, r in rows:
        est = estimate(shape, Knobs(tokens, **MEASURED[label])).gpu / GiB
        if "error" in r:
            lines.append(f"| {label} | {r['error']} | | {est:.1f} | | | |")
            continue
        if device == "cuda":
            cells = f"{r['peak_allocated'] / GiB:.2f} | {r['peak_reserved'] / GiB:.2f}"
        else:
            cells = f"{r['peak_rss'] / GiB:.2f} | -"
        lines.append(
            f"| {label} | {cells} | {est:.1f} | {r['tokens_per_s']:,.0f} | {r['steps']} | {r['optimizer']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.learner_memory", description=__doc__.strip().splitlines()[0]
    )
    parser.add_argument("--measure", action="store_true", help="measure instead of estimating")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--cpu", action="store_true", help="smoke: tiny shape on the CPU")
    parser.add_argument("--tokens", type=int, default=8192, help="micro-batch tokens to measure")
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="training time per measured knob set"
    )
    parser.add_argument("--no-entropy-grad", action="store_true", help="estimate without it")
    parser.add_argument("--config", help="estimate this run config's learner instead of the table")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of --config")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cpu:
        args.device = "cpu"
    if args.one:
        job = json.loads(args.one)
        shape = TINY if job["shape"] == "tiny" else SHAPES[job["shape"]]
        print(
            json.dumps(measure_one(shape, job["knobs"], job["tokens"], job["seconds"], args.device))
        )
        return 0
    if args.config:
        from streamrl.configs import load_config

        est = config_estimate(load_config(args.config, args.overrides, env={}))
        parts = ", ".join(
            f"{part} {getattr(est, part) / GiB:.1f}"
            for part in ("weights", "trainable_state", "bucket", "activations", "logits")
        )
        print(
            f"{args.config}: estimated learner peak {est.gpu / GiB:.1f} GiB per rank ({parts} GiB)"
        )
        return 0
    if not args.measure:
        print(table(entropy_grad=not args.no_entropy_grad))
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(
                "--device cuda: no CUDA device here (use --cpu for the smoke run)", file=sys.stderr
            )
            return 2
    shape_name = "tiny" if args.cpu else "Qwen2.5-0.5B"
    tokens = 256 if args.cpu else args.tokens
    seconds = 0.0 if args.cpu else args.seconds
    rows = measure(shape_name, tokens, seconds, args.device)
    print(measured_table(shape_name, tokens, rows, args.device))
    print(json.dumps({"measured": [{"knobs": k, **r} for k, r in rows]}))
    return 0 if all("error" not in r for _, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
