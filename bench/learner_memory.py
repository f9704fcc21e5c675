"""Peak GPU memory of one learner rank per memory knob: an estimate from the model's shape, and a measurement.

    python -m bench.learner_memory                        # the estimate table of docs/gpu.md
    python -m bench.learner_memory --measure --device cuda  # measure at the Qwen2.5-0.5B shape
                                                          # (8,192 and 16,384-token micro-batches)
    python -m bench.learner_memory --measure --cpu          # the same code at a tiny shape on the CPU (smoke)

The estimate counts bytes, per rank, at the peak of a micro-batch's backward pass (bf16 weights,
DeepSpeed ZeRO-2 with ``learner.ranks`` ranks):

- weights: 2 bytes per parameter (bf16, every rank holds them all);
- trainable state (ZeRO-2 partitions it over the ranks): bf16 gradient partition (2), fp32 master
  weights (4), Adam moments (8) = 14 bytes per trainable parameter; with ``offload_optimizer`` it
  lives in host memory instead (16 bytes: the fp32 gradient too), and the GPU keeps none of it;
- DeepSpeed's gradient reduction bucket: ``reduce_bucket_size`` (5e8) bf16 elements, allocated
  whole whatever the model's size;
- activations saved for the backward pass, per token of the micro-batch's packed rows
  (``learner.micro_batch_tokens`` bounds them: packed rows x their width):
  ``activation_bytes_per_token``;
- the log-prob head, per completion token only (``learner.engine.token_logprobs`` runs the output
  layer on the completion positions): ``head_bytes_per_token``, with the entropy's gradients only
  when ``algo.entropy_coef`` > 0.

Rows are GSM8K's: a ~128-token prompt and a completion of up to ``rollout.max_new_tokens`` (512),
so 4/5 of a micro-batch's tokens reach the head. Left out: the CUDA context (~0.5 GiB, outside
PyTorch's allocator), allocator fragmentation and cuBLAS/attention workspaces. The two peaks
measured on an H200 at the 0.5B shape (45.7 GiB at 8,192 tokens, 84.0 at 16,384) were taken on
the step before packing (``OLD_STEP``: logits at every position, the entropy with gradients);
that step's count comes out 6-8 % below them. ``--measure`` runs the
learner's real ``train_batch`` (DeepSpeed, the loss, the optimizer) on a random-init model of the
shape, once per knob set in a fresh process (about a minute of training in all, plus start-ups),
and reports PyTorch's peak allocated and reserved memory and trained tokens per second. Two rows
train a long tail of short samples (``bench_samples``: some micro-batches pack several to a row),
under ``learner.packed_attention`` mask and varlen. Beside them, in the same run, a plain torch reference with no streamrl code: the same
model, dtype and attention, forward + backward (transformers' own loss over every position) on
rows of one sample each at the same tokens per micro-batch, then an AdamW step; each learner row
shows its tokens/s over the reference's and both show their MFU (``learner.throughput``: 6N per
token over the GPU's dense bf16 peak).
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
    # the entropy with its gradients (algo.entropy_coef > 0): 20 instead of 12 bytes per vocab entry
    entropy_grad: bool = False
    lora_rank: int = 0
    ranks: int = 1
    # a row: GSM8K's ~128-token prompt and a completion of up to max_new_tokens
    prompt_len: int = 128
    completion_len: int = 512
    # the output layer at every position, as before completion-only logits (``OLD_STEP``)
    all_positions: bool = False
    # learner.logprob_chunk_tokens; None = the whole micro-batch's logits at once (``OLD_STEP``)
    logprob_chunk_tokens: int | None = 1024
    # rows that carry transformers' 4D mask (``activation_bytes_per_token``); learner.packed_attention
    # varlen builds none
    masked: bool = True

    @property
    def row_width(self) -> int:
        return self.prompt_len + self.completion_len

    @property
    def head_tokens(self) -> int:
        """Tokens of a micro-batch that reach the output layer."""
        if self.all_positions:
            return self.micro_batch_tokens
        return self.micro_batch_tokens * self.completion_len // self.row_width


# the learner step the H200 measurements of docs/gpu.md were taken on (before packing): logits at
# every position and the entropy with its gradients whatever algo.entropy_coef
OLD_STEP = {"all_positions": True, "entropy_grad": True, "logprob_chunk_tokens": None}


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


def activation_bytes_per_token(
    s: Shape, gradient_checkpointing: bool, row_width: int, masked: bool = True
) -> int:
    """Bytes the decoder saves for the backward pass per token (bf16 weights), final norm included.

    A layer: its two RMSNorms (the fp32 input, 4h, and the bf16 normalised input, 2h, each, plus
    the bf16 output the next projection saves, 2h), q and the attention output (4h), k and v,
    the attention's fp32 log-sum-exp per head, o_proj's input (2h), the MLP's gate, up, SiLU and
    product (8i). ``masked``: rows that carry an attention mask (several packed samples in a row,
    as completions of different lengths give, or padded rows): transformers repeats k and v to
    every head for SDPA (4h) and the layer keeps the additive bf16 mask (2 x ``row_width``); a row
    of one sample needs neither (SDPA's own GQA and causal mask: 4 x the k/v width). The final
    RMSNorm adds 6h. With gradient checkpointing each layer keeps only its input (2h) and the
    backward recomputes one layer at a time.
    """
    outside = 6 * s.hidden
    layer = layer_bytes_per_token(s, row_width, masked)
    if gradient_checkpointing:
        return s.layers * 2 * s.hidden + layer + outside
    return s.layers * layer + outside


def layer_bytes_per_token(s: Shape, row_width: int, masked: bool = True) -> int:
    kv = 4 * s.hidden + 2 * row_width if masked else 4 * s.kv_dim
    return 20 * s.hidden + kv + 8 * s.intermediate + 4 * s.heads


def head_bytes_per_token(s: Shape, entropy_grad: bool) -> tuple[int, int]:
    """(saved by the forward, peak in the backward) of the log-prob head (``sequence_logprobs``)
    per token it scores.

    Saved: the output layer's bf16 input (2h), the fp32 log-softmax (4 bytes per vocabulary entry)
    and, with the entropy's gradients, its exp (4). The backward adds fp32 gradients of the same
    size before it frees them: of the log-probs and the log-softmax's input (8), and with the
    entropy those of its two factors (4 more). An entropy without gradients takes the same 8 for
    its exp and product in the forward, and frees them before the backward.
    """
    saved = 2 * s.hidden + s.vocab * (8 if entropy_grad else 4)
    return saved, saved + s.vocab * (12 if entropy_grad else 8)


def chunked_head_saved_per_token(s: Shape) -> int:
    """What the chunked log-prob head (``learner.logprob_chunk_tokens``) keeps for the backward per
    token it scores: the output layer's bf16 input (2h) and two int64 indices (the position the
    token is scored at and the token). Each chunk's logits are recomputed in the backward pass."""
    return 2 * s.hidden + 16


def head_bytes(s: Shape, k: Knobs) -> int:
    """Peak bytes of the log-prob head over one micro-batch: unchunked, every scored token's
    ``head_bytes_per_token`` peak; chunked, every token's hidden state and one chunk's logits."""
    saved, peak = head_bytes_per_token(s, k.entropy_grad)
    if k.logprob_chunk_tokens is None:
        return k.head_tokens * peak
    one_chunk = min(k.head_tokens, k.logprob_chunk_tokens) * (peak - 2 * s.hidden)
    return k.head_tokens * chunked_head_saved_per_token(s) + one_chunk


def estimate(s: Shape, k: Knobs) -> Estimate:
    total = parameters(s)
    trainable = lora_parameters(s, k.lora_rank) if k.lora_rank else total
    on_gpu_state = 0 if k.offload_optimizer else 14 * trainable // k.ranks
    return Estimate(
        weights=2 * (total + (trainable if k.lora_rank else 0)),
        trainable_state=on_gpu_state,
        bucket=2 * REDUCE_BUCKET,
        activations=k.micro_batch_tokens
        * activation_bytes_per_token(s, k.gradient_checkpointing, k.row_width, k.masked),
        logits=head_bytes(s, k),
        host=16 * trainable // k.ranks if k.offload_optimizer else 0,
    )


def shape_of(model_path: str) -> Shape:
    """The shape of a Qwen2.5 model named in ``model.path`` (hub id or folder name)."""
    for name, shape in SHAPES.items():
        if name.lower() in model_path.lower():
            return shape
    raise ValueError(f"model.path {model_path!r}: no known shape (known: {', '.join(SHAPES)})")


def config_knobs(cfg) -> Knobs:
    """The knobs of a run's learner (``cfg``: a ``Config``), rows of a GSM8K-sized prompt (~128
    tokens with the chat template) and the longest completion; adapters counted on all seven
    projections (``LORA_TARGETS``; fewer ``target_modules`` train fewer)."""
    lc = cfg.learner
    return Knobs(
        lc.micro_batch_tokens,
        gradient_checkpointing=lc.gradient_checkpointing,
        offload_optimizer=lc.offload_optimizer,
        entropy_grad=cfg.algo.entropy_coef > 0,
        lora_rank=cfg.model.lora.rank,
        ranks=lc.ranks,
        completion_len=cfg.rollout.max_new_tokens,
        logprob_chunk_tokens=lc.logprob_chunk_tokens,
    )


def config_estimate(cfg) -> Estimate:
    """The estimate for a run's learner."""
    return estimate(shape_of(cfg.model.path), config_knobs(cfg))


KNOB_ROWS = {
    "ZeRO-2": {},
    "+ gradient checkpointing": {"gradient_checkpointing": True},
    "+ optimizer offload": {"offload_optimizer": True},
    "+ both": {"gradient_checkpointing": True, "offload_optimizer": True},
    "LoRA r=16": {"lora_rank": 16},
    "LoRA r=16 + checkpointing": {"lora_rank": 16, "gradient_checkpointing": True},
}
TOKENS = (8192, 16384)


def table(**step) -> str:
    """Markdown: estimated peak GiB per model, knob row and micro-batch size (``step``: further
    ``Knobs``, e.g. ``entropy_grad`` or ``OLD_STEP``)."""
    head = "| model | params | knobs | " + " | ".join(f"{t:,} tokens" for t in TOKENS) + " | host |"
    lines = [head, "|---|---|---|" + "---|" * len(TOKENS) + "---|"]
    for name, shape in SHAPES.items():
        for label, knobs in KNOB_ROWS.items():
            ests = [estimate(shape, Knobs(t, **step, **knobs)) for t in TOKENS]
            host = f"{ests[0].host / GiB:.1f} GiB" if ests[0].host else "-"
            cells = " | ".join(f"{e.gpu / GiB:.1f}" for e in ests)
            lines.append(
                f"| {name} | {parameters(shape) / 1e9:.2f}B | {label} | {cells} | {host} |"
            )
    return "\n".join(lines)


# ---- measurement -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Variant:
    """A measured row: its learner knobs, and whether its samples are ``bench_samples``' long tail
    (``mixed``: some rows hold several, so how packed samples are kept apart matters) or full rows."""

    knobs: dict
    mixed: bool = False

    def estimate_knobs(self, tokens: int) -> Knobs:
        """The estimate's knobs: the memory ones, and no mask under varlen."""
        names = {"gradient_checkpointing", "offload_optimizer", "lora_rank", "logprob_chunk_tokens"}
        memory = {k: v for k, v in self.knobs.items() if k in names}
        return Knobs(tokens, **memory, masked=self.knobs.get("packed_attention") != "varlen")


# logprob_chunk_tokens above any micro-batch: the output layer over all completion tokens at
# once, as the step scored before chunking (issue 41's "today's"), measured beside it
UNCHUNKED = 1 << 30
MEASURED = {
    "ZeRO-2": Variant({}),
    "ZeRO-2, unchunked log-probs, mask": Variant(
        {"logprob_chunk_tokens": UNCHUNKED, "packed_attention": "mask"}
    ),
    "ZeRO-2, long tail, mask": Variant({"packed_attention": "mask"}, mixed=True),
    "ZeRO-2, long tail, varlen": Variant({"packed_attention": "varlen"}, mixed=True),
    "+ gradient checkpointing": Variant({"gradient_checkpointing": True}),
    "+ optimizer offload": Variant({"offload_optimizer": True}),
}
# the plain torch row each learner row's tokens/s is compared with
REFERENCE = "plain torch (no streamrl)"
# ``--rows``: the measured rows by purpose (bench.gpu measures one set per check)
ROW_SETS = {
    # the step against its plain torch reference and against itself before chunking
    "step": ("ZeRO-2", "ZeRO-2, unchunked log-probs, mask"),
    # how packed samples are kept apart, on rows that hold several
    "packing": ("ZeRO-2, long tail, mask", "ZeRO-2, long tail, varlen"),
    "knobs": ("+ gradient checkpointing", "+ optimizer offload"),
}
MEASURED_TOKENS = (8192, 16384)


def row_lengths(device: str) -> tuple[int, int]:
    """(prompt, longest completion): GSM8K-like on a GPU, tiny on the CPU smoke."""
    return (128, 512) if device == "cuda" else (8, 24)


def bench_samples(tokens: int, vocab: int, device: str, mixed: bool) -> list:
    """About 4 micro-batches of ``tokens``: full-length rows, or with ``mixed`` a long tail of
    short samples (seeded): a prompt 1/8 as long and completions Zipf(1.2) x ``completion`` / 128
    tokens, up to the full row.

    The planner sorts samples by length before packing, so a micro-batch's rows hold several
    samples only where its lengths run 2x apart: GSM8K-like rows (a 128-token prompt, completions
    of 64-512) pack none, so transformers builds no mask for them and the two
    ``learner.packed_attention`` settings run alike; the long tail packs some micro-batches."""
    import numpy as np

    from bench.learner import random_samples

    prompt, completion = row_lengths(device)
    if not mixed:
        return random_samples(4 * (tokens // (prompt + completion)), vocab, 0, prompt, completion)
    rng = np.random.default_rng(0)
    short_prompt = max(prompt // 8, 1)
    longest = prompt + completion - short_prompt
    samples: list = []
    while sum(len(s) for s in samples) < 4 * tokens:
        length = min(int(rng.zipf(1.2)) * max(completion // 128, 1), longest)
        samples += random_samples(1, vocab, len(samples), short_prompt, length)
    return samples


def packed_layout(samples: list, tokens: int) -> dict:
    """How the learner packs ``samples`` (one rank): samples per row, and the micro-batches whose
    rows hold several samples (those carry transformers' 4D mask under packed_attention mask)."""
    from streamrl.learner.batching import collate, pack_micro_batches

    batches = [collate(part, 0, tokens) for part in pack_micro_batches(samples, tokens)]
    rows = sum(b.packed_ids.shape[0] for b in batches)
    restarts = [(b.position_ids[:, 1:] != b.position_ids[:, :-1] + 1).any() for b in batches]
    return {
        "samples_per_row": len(samples) / rows,
        "micro_batches": len(batches),
        "micro_batches_packed": int(sum(restarts)),
    }


def timed_steps(step, device: str, seconds: float, steps_min: int) -> tuple[int, float]:
    """One warm-up ``step`` (allocator, DeepSpeed buckets, kernels), the peak memory reset, then
    steps for ``seconds`` (at least ``steps_min``): (steps, their seconds)."""
    import torch

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    step()
    sync()
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    steps, t0 = 0, time.perf_counter()
    while steps < steps_min or time.perf_counter() - t0 < seconds:
        step()
        steps += 1
    sync()
    return steps, time.perf_counter() - t0


def measure_one(
    shape: Shape,
    knobs: dict,
    tokens: int,
    seconds: float,
    device: str,
    steps_min: int = 2,
    mixed: bool = False,
) -> dict:
    """Train the learner's real step on a random-init model of ``shape`` for ``seconds`` (at least
    ``steps_min`` steps); peak memory, trained tokens/s and MFU. Run in a fresh process per knob set."""
    import torch
    from transformers import Qwen2ForCausalLM

    from streamrl.configs import Config
    from streamrl.learner.engine import build_engine, init_distributed
    from streamrl.learner.step import train_batch
    from streamrl.learner.throughput import Throughput

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
    config = _qwen2_config(shape)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    started = time.perf_counter()

    def phase(what: str) -> None:
        print(f"{what}: {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)

    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    phase("model built")
    engine = build_engine(cfg.learner, model, world)
    phase("engine built")
    # GSM8K-like rows: a 128-token prompt and up to a 512-token completion; 4 micro-batches a step
    samples = bench_samples(tokens, shape.vocab, device, mixed)

    def step() -> None:
        train_batch(
            engine, samples, 0, algo=cfg.algo, learner=cfg.learner, rollout=cfg.rollout,
            seed=0, rank=rank, world=world, pad_id=0,
        )  # fmt: skip

    steps, elapsed = timed_steps(step, device, seconds, steps_min)
    phase("measured")
    tokens_per_s = steps * sum(len(s) for s in samples) / elapsed
    return {
        "steps": steps,
        "tokens_per_s": tokens_per_s,
        "mfu": Throughput.of(engine.module, None, world).mfu(tokens_per_s, 1.0),
        "attention": engine.module.config._attn_implementation,
        **packed_layout(samples, tokens),
        "optimizer": type(engine.basic_optimizer).__name__,
        **_peak_memory(device),
    }


def measure_reference(
    shape: Shape, tokens: int, seconds: float, device: str, steps_min: int = 2
) -> dict:
    """The plain torch step the learner is compared with: the same random-init model, dtype and
    attention (sdpa), forward + backward through transformers' own loss over every position on
    4 micro-batches of ``tokens`` (rows of one full-length sample, so no mask), then torch's AdamW.
    No streamrl code but the MFU formula."""
    import torch
    from transformers import Qwen2ForCausalLM

    from streamrl.learner.throughput import Throughput

    config = _qwen2_config(shape)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    width = sum(row_lengths(device))
    rows = max(tokens // width, 1)
    batches = [torch.randint(0, shape.vocab, (rows, width), device=device) for _ in range(4)]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        for ids in batches:
            model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()

    steps, elapsed = timed_steps(step, device, seconds, steps_min)
    tokens_per_s = steps * 4 * rows * width / elapsed
    return {
        "steps": steps,
        "tokens_per_s": tokens_per_s,
        "mfu": Throughput.of(model, None, 1).mfu(tokens_per_s, 1.0),
        "attention": model.config._attn_implementation,
        "optimizer": type(optimizer).__name__,
        **_peak_memory(device),
    }


def _qwen2_config(shape: Shape):
    from transformers import Qwen2Config

    return Qwen2Config(
        vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads, tie_word_embeddings=shape.tied,
        max_position_embeddings=4096,
    )  # fmt: skip


def _peak_memory(device: str) -> dict:
    """The peak since the last reset: CUDA's allocated and reserved bytes and the device's name,
    or on the CPU the process's peak resident size (model and all)."""
    import torch

    if device == "cuda":
        return {
            "peak_allocated": torch.cuda.max_memory_allocated(),
            "peak_reserved": torch.cuda.max_memory_reserved(),
            "device_name": torch.cuda.get_device_name(),
        }
    import resource

    # kilobytes on Linux
    return {"peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def measure(
    shape_name: str, tokens: int, seconds: float, device: str, labels=tuple(MEASURED)
) -> list[tuple[str, dict]]:
    """The plain torch reference, then ``measure_one`` per row of ``MEASURED`` named in ``labels``,
    each in its own process (DeepSpeed engines do not free all of their memory in-process); a row
    that runs out of memory reports the error."""
    rows = []
    jobs = [(REFERENCE, {"reference": True})] + [
        (label, {"knobs": MEASURED[label].knobs, "mixed": MEASURED[label].mixed})
        for label in labels
    ]
    for label, what in jobs:
        job = {"shape": shape_name, "tokens": tokens, "seconds": seconds, **what}
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.learner_memory", "--one", json.dumps(job), "--device", device],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        )  # fmt: skip
        # the child's progress is passed on as it comes: a run its caller kills still shows where it was
        err = []
        for line in proc.stderr:
            sys.stderr.write(line)
            err.append(line.rstrip())
        lines = proc.stdout.read().strip().splitlines()
        proc.wait()
        if proc.returncode == 0 and lines:
            rows.append((label, json.loads(lines[-1])))
        else:
            tail = err[-1:] or [f"exit code {proc.returncode}"]
            rows.append((label, {"error": tail[0][:200]}))
        # as each row is done: a run cut short by its caller's timeout still shows what it measured
        print(f"{label}: {json.dumps(rows[-1][1])}", flush=True)
    return rows


def _ratio(r: dict, reference: dict) -> str:
    if "tokens_per_s" not in r or not reference.get("tokens_per_s"):
        return ""
    return f"{r['tokens_per_s'] / reference['tokens_per_s']:.2f}x"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def measured_table(shape_name: str, tokens: int, rows: list[tuple[str, dict]], device: str) -> str:
    """Markdown: each measured knob set beside its estimate, its tokens/s over the plain torch
    reference's, and MFU. On the CPU the peak is the process's resident size (model, libraries
    and all), which the estimate of GPU memory does not predict; MFU has no CPU peak."""
    shape = SHAPES.get(shape_name, TINY)
    peak = "peak allocated GiB | peak reserved GiB" if device == "cuda" else "peak RSS GiB | -"
    name = next((r["device_name"] for _, r in rows if "device_name" in r), device)
    reference = dict(rows).get(REFERENCE, {})
    lines = [
        f"Measured: {shape_name} shape, random init, {tokens:,}-token micro-batches, on {name}.",
        "",
        f"| knobs | {peak} | estimate GiB | tokens/s | vs plain torch | MFU | steps | optimizer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, r in rows:
        variant = MEASURED.get(label)
        est = f"{estimate(shape, variant.estimate_knobs(tokens)).gpu / GiB:.1f}" if variant else "-"
        if "error" in r:
            lines.append(f"| {label} | {r['error']} | | {est} | | | | | |")
            continue
        if device == "cuda":
            cells = f"{r['peak_allocated'] / GiB:.2f} | {r['peak_reserved'] / GiB:.2f}"
        else:
            cells = f"{r['peak_rss'] / GiB:.2f} | -"
        lines.append(
            f"| {label} | {cells} | {est} | {r['tokens_per_s']:,.0f} | {_ratio(r, reference)} "
            f"| {_percent(r.get('mfu'))} | {r['steps']} | {r['optimizer']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.learner_memory", description=__doc__.strip().splitlines()[0]
    )
    parser.add_argument("--measure", action="store_true", help="measure instead of estimating")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--cpu", action="store_true", help="smoke: tiny shape on the CPU")
    parser.add_argument(
        "--tokens",
        default=",".join(map(str, MEASURED_TOKENS)),
        help="micro-batch tokens to measure, comma-separated",
    )
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="training time per measured knob set"
    )
    parser.add_argument(
        "--entropy-grad", action="store_true", help="the entropy with gradients (entropy_coef > 0)"
    )
    parser.add_argument(
        "--old-step",
        action="store_true",
        help="the step the H200 measurements were taken on: logits at every position, entropy gradients",
    )
    parser.add_argument(
        "--rows",
        default=",".join(ROW_SETS),
        help=f"comma-separated row sets to measure, of {', '.join(ROW_SETS)} (the plain torch reference always runs)",
    )
    parser.add_argument("--config", help="estimate this run config's learner instead of the table")
    parser.add_argument("overrides", nargs="*", help="dotted overrides of --config")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cpu:
        args.device = "cpu"
    if args.one:
        job = json.loads(args.one)
        shape = TINY if job["shape"] == "tiny" else SHAPES[job["shape"]]
        if job.get("reference"):
            out = measure_reference(shape, job["tokens"], job["seconds"], args.device)
        else:
            out = measure_one(
                shape, job["knobs"], job["tokens"], job["seconds"], args.device,
                mixed=job["mixed"],
            )  # fmt: skip
        print(json.dumps(out))
        return 0
    if args.config:
        from streamrl.configs import load_config

        cfg = load_config(args.config, args.overrides, env={})
        knobs, est = config_knobs(cfg), config_estimate(cfg)
        print(f"{args.config}: {knobs}")
        parts = ", ".join(
            f"{part} {getattr(est, part) / GiB:.1f}"
            for part in ("weights", "trainable_state", "bucket", "activations", "logits")
        )
        print(
            f"{args.config}: estimated learner peak {est.gpu / GiB:.1f} GiB per rank ({parts} GiB)"
        )
        return 0
    if not args.measure:
        print(table(**(OLD_STEP if args.old_step else {"entropy_grad": args.entropy_grad})))
        return 0
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print(
                "--device cuda: no CUDA device here (use --cpu for the smoke run)", file=sys.stderr
            )
            return 2
    unknown = sorted(set(args.rows.split(",")) - set(ROW_SETS))
    if unknown:
        parser.error(f"--rows: unknown row sets {unknown}; known: {', '.join(ROW_SETS)}")
    labels = tuple(label for name in args.rows.split(",") for label in ROW_SETS[name])
    shape_name = "tiny" if args.cpu else "Qwen2.5-0.5B"
    sizes = [256] if args.cpu else [int(t) for t in args.tokens.split(",")]
    seconds = 0.0 if args.cpu else args.seconds
    measured, ok = [], True
    for tokens in sizes:
        rows = measure(shape_name, tokens, seconds, args.device, labels)
        print(measured_table(shape_name, tokens, rows, args.device), flush=True)
        measured += [{"knobs": k, "tokens": tokens, **r} for k, r in rows]
        ok = ok and all("error" not in r for _, r in rows)
    print(json.dumps({"measured": measured}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
