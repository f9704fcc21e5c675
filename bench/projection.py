"""Beyond one machine: what the asynchronous design should buy on a GPU node, computed from costs.

A GRPO step needs ``gen`` device-seconds of generation and ``train``
device-seconds of training (tokens / per-device tokens/s). With ``a`` actor
devices and ``l`` learner devices:

    synchronous alternation   T_sync  = gen/a + train/l + publish
    asynchronous (streamrl)   T_async = max(gen/a, train/l) + publish
    colocated synchronous     T_coloc = (gen + train)/(a + l) + publish   (every device does both, in turn)

``publish`` sits outside the max, which charges the asynchronous design the
full weight hand-over each step (its learner only waits for its own copy).
The learner is the bottleneck once ``a/l > gen/train``. Throughputs are ideal
(linear in devices, no tail of long completions), so the async gain over the
colocated setup is a lower bound: AReaL's measured gain comes mostly from the
tail that this model leaves out.

The per-token costs of this machine come from our own benchmarks; the GPU
figures are published numbers, each with its source in ``SOURCES``.

    python -m bench --only projection           (part of `make bench`)
    python -m bench.projection --cpu-gen-tps 8851 --cpu-train-tps 23000
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path

ACTORS_MD = Path("docs/bench/actors.md")
LEARNER_MD = Path("docs/bench/learner.md")

# Published figures (H100 SXM 80 GB, Llama-3.1-8B-class dense model).
PARAMS_8B = 8.03e9
LLAMA3_BF16_TFLOPS_PER_GPU = (380e12, 430e12)
VLLM_GEN_TPS_H100 = {"MLPerf offline, FP8": 5_777.0, "BF16, third-party compilation": 12_500.0}
NVLINK_BUSBW = 460e9
IB_NDR_BYTES_PER_S = 400e9 / 8
GPUS_PER_NODE = 8

# Measured here, used when no docs/bench file gives a newer number.
FALLBACK_CPU_TRAIN_TPS = 23_000.0
FALLBACK_CPU_GEN_TPS = 8_500.0
CPU_SHM_PUBLISH_BYTES_PER_S = 40e6 / 14.1e-3
# bench/learner.py's sample shape
LEARNER_BENCH_PROMPT, LEARNER_BENCH_COMPLETION = 16, 112

SOURCES = {
    "gen_low": "Red Hat, MLPerf Inference v5.1 results: Llama-3.1-8B FP8, vLLM 0.10.0, 1×H100, offline "
    "scenario 5,777 tokens/s — https://www.redhat.com/en/blog/efficient-and-reproducible-llm-inference-red-hat-mlperf-inference-v51-results",
    "gen_high": "Morph, vLLM benchmarks (third-party compilation): Llama 3.1 8B BF16, 1×H100 80GB, ~12,500 tok/s "
    "(FlashInfer, 0.8 GPU util) — https://www.morphllm.com/vllm-benchmarks",
    "train": "Meta, The Llama 3 Herd of Models (arXiv 2407.21783), pre-training on H100: 380–430 BF16 TFLOPS per GPU "
    "(38–43 % MFU); tokens/s = TFLOPS / (6 × 8.03e9 params); cross-check NVIDIA NeMo 24.12 performance summary, "
    "LLAMA3-8B on 8×H100 (FP8, Megatron) 12,273 tokens/s/GPU — "
    "https://docs.nvidia.com/nemo-framework/user-guide/24.12/nemotoolkit/performance/performance_summary.html",
    "nvlink": "8×H100 SXM NVLink nccl-tests all_reduce busbw 460–480 GB/s at large sizes, taken as the broadcast bandwidth — "
    "https://docs.alayanew.com/en/docs/tech-blog/2026-05-06-nccl-tests",
    "ib": "InfiniBand NDR 400 Gb/s per GPU (= 50 GB/s), the inter-node fabric of the Llama 3 clusters (arXiv 2407.21783)",
    "areal": "AReaL (arXiv 2505.24298): up to 2.77× training speedup over synchronous systems with the same number "
    "of GPUs, measured end to end on math and code reasoning",
}


@dataclass(frozen=True)
class Workload:
    """One optimizer step's rollouts."""

    prompts: int
    group_size: int
    prompt_tokens: float
    completion_tokens: float

    @property
    def generated_tokens(self) -> float:
        return self.prompts * self.group_size * self.completion_tokens

    @property
    def trained_tokens(self) -> float:
        return self.prompts * self.group_size * (self.prompt_tokens + self.completion_tokens)


def device_seconds(work: Workload, gen_tps: float, train_tps: float) -> tuple[float, float]:
    """(generation, training) seconds of one device per step, from per-device tokens/s."""
    if gen_tps <= 0 or train_tps <= 0:
        raise ValueError(f"throughputs must be positive, got gen {gen_tps}, train {train_tps}")
    return work.generated_tokens / gen_tps, work.trained_tokens / train_tps


def sync_step_s(
    gen_s: float, train_s: float, actors: int, learners: int, publish_s: float
) -> float:
    # T_sync = gen/a + train/l + publish: each side idles while the other works
    return gen_s / actors + train_s / learners + publish_s


def async_step_s(
    gen_s: float, train_s: float, actors: int, learners: int, publish_s: float
) -> float:
    # T_async = max(gen/a, train/l) + publish: both sides busy at once
    return max(gen_s / actors, train_s / learners) + publish_s


def colocated_step_s(gen_s: float, train_s: float, devices: int, publish_s: float) -> float:
    # T_coloc = (gen + train)/N + publish: every device generates, then trains
    return (gen_s + train_s) / devices + publish_s


def learner_bound_ratio(gen_s: float, train_s: float) -> float:
    """Actor:learner device ratio above which the learner is the bottleneck (gen/a = train/l)."""
    return gen_s / train_s


def best_split(
    gen_s: float, train_s: float, devices: int, publish_s: float
) -> tuple[int, int, float]:
    """(actors, learners, T_async) with the shortest asynchronous step over integer splits of ``devices``."""
    if devices < 2:
        raise ValueError("an actor-learner split needs at least 2 devices")
    return min(
        (
            (a, devices - a, async_step_s(gen_s, train_s, a, devices - a, publish_s))
            for a in range(1, devices)
        ),
        key=lambda row: row[2],
    )


def train_tps_from_flops(flops_per_s: float, params: float) -> float:
    # forward + backward = 6 x params FLOPs per token; behaviour log-probs come from the actors
    return flops_per_s / (6 * params)


def publish_seconds(params: float, bytes_per_param: float, bytes_per_s: float) -> float:
    return params * bytes_per_param / bytes_per_s


def parse_actor_tps(markdown: str, batch: int = 16) -> float | None:
    """Our engine's tokens/s at ``batch`` from docs/bench/actors.md's first table, if present."""
    match = re.search(rf"^\|\s*{batch}\s*\|\s*([\d,]+(?:\.\d+)?)\s*\|", markdown, re.MULTILINE)
    return float(match.group(1).replace(",", "")) if match else None


def parse_learner_tps(markdown: str) -> float | None:
    """All-token training tokens/s of the demo model from docs/bench/learner.md, if present.

    That table reports ZeRO-2 *completion* tokens/s (last column) for samples of
    ``LEARNER_BENCH_PROMPT`` + ``LEARNER_BENCH_COMPLETION`` tokens; every token costs
    the same forward and backward, so the all-token rate is that times total / completion.
    """
    match = re.search(r"^\|\s*demo\b.*\|\s*([\d,]+(?:\.\d+)?)\s*\|\s*$", markdown, re.MULTILINE)
    if not match:
        return None
    completion_tps = float(match.group(1).replace(",", ""))
    return (
        completion_tps
        * (LEARNER_BENCH_PROMPT + LEARNER_BENCH_COMPLETION)
        / LEARNER_BENCH_COMPLETION
    )


def measured_cpu_inputs() -> tuple[float, str, float, str]:
    """(gen tokens/s, its source, train tokens/s, its source) for this machine."""
    gen = parse_actor_tps(ACTORS_MD.read_text()) if ACTORS_MD.exists() else None
    train = parse_learner_tps(LEARNER_MD.read_text()) if LEARNER_MD.exists() else None
    gen_src = (
        f"{ACTORS_MD} (our engine, batch 16)"
        if gen
        else "docs/measured.md (hand-written sampling loop, batch 16)"
    )
    train_src = (
        f"{LEARNER_MD} (ZeRO-2, demo model, × 128/112 for prompt tokens)"
        if train
        else "docs/measured.md (learner forward+backward+AdamW, 1 thread)"
    )
    return gen or FALLBACK_CPU_GEN_TPS, gen_src, train or FALLBACK_CPU_TRAIN_TPS, train_src


def _fmt_s(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.1f} s"


def split_table(
    gen_s: float, train_s: float, splits: list[tuple[int, int]], publish_s: float
) -> list[str]:
    rows = [
        "| actors : learners | gen/a | train/l | publish | T_sync | T_async | T_sync / T_async | bottleneck |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a, lrn in splits:
        t_sync = sync_step_s(gen_s, train_s, a, lrn, publish_s)
        t_async = async_step_s(gen_s, train_s, a, lrn, publish_s)
        side = "learner" if train_s / lrn > gen_s / a else "actors"
        rows.append(
            f"| {a} : {lrn} | {_fmt_s(gen_s / a)} | {_fmt_s(train_s / lrn)} | {_fmt_s(publish_s)} | "
            f"{_fmt_s(t_sync)} | {_fmt_s(t_async)} | **{t_sync / t_async:.2f}×** | {side} |"
        )
    return rows


def cluster_table(gen_s: float, train_s: float, params: float) -> list[str]:
    rows = [
        "| GPUs | publish over | best split a : l | T_async | T_sync same split | T_coloc | async vs sync | async vs coloc |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for devices in (2, 4, 8, 16, 32):
        fabric, bw = (
            ("NVLink", NVLINK_BUSBW) if devices <= GPUS_PER_NODE else ("IB NDR", IB_NDR_BYTES_PER_S)
        )
        publish = publish_seconds(params, 2, bw)
        a, lrn, t_async = best_split(gen_s, train_s, devices, publish)
        t_sync = sync_step_s(gen_s, train_s, a, lrn, publish)
        t_coloc = colocated_step_s(gen_s, train_s, devices, publish)
        rows.append(
            f"| {devices} | {fabric} ({_fmt_s(publish)}) | {a} : {lrn} | {_fmt_s(t_async)} | {_fmt_s(t_sync)} | "
            f"{_fmt_s(t_coloc)} | **{t_sync / t_async:.2f}×** | {t_coloc / t_async:.2f}× |"
        )
    return rows


DEMO_STEP = Workload(prompts=16, group_size=16, prompt_tokens=4, completion_tokens=4)
GPU_STEP = Workload(prompts=64, group_size=16, prompt_tokens=256, completion_tokens=1024)
CPU_PUBLISH_S = publish_seconds(0.5e6, 4, CPU_SHM_PUBLISH_BYTES_PER_S)
NVLINK_PUBLISH_S = publish_seconds(PARAMS_8B, 2, NVLINK_BUSBW)


def _h100_train_tps() -> list[float]:
    """The 8B model's training tokens/s per H100, low and high, from Llama 3's TFLOPS."""
    return [train_tps_from_flops(f, PARAMS_8B) for f in LLAMA3_BF16_TFLOPS_PER_GPU]


def inputs_lines(
    cpu_gen_tps: float, gen_src: str, cpu_train_tps: float, train_src: str
) -> list[str]:
    """The inputs' table, each with its source, and the two workloads."""
    train_tps = _h100_train_tps()
    demo, gpu_work = DEMO_STEP, GPU_STEP
    return [
        "### Inputs",
        "",
        "| input | value | source |",
        "|---|---|---|",
        f"| this machine: generation tokens/s (1 core) | {cpu_gen_tps:,.0f} | {gen_src} |",
        f"| this machine: training tokens/s (1 core) | {cpu_train_tps:,.0f} | {train_src} |",
        f"| this machine: publish (2 MB fp32 over shm) | {_fmt_s(CPU_PUBLISH_S)} | docs/bench/weightsync.md, shm 40 MB in 14.1 ms |",
        f"| H100: vLLM generation tokens/s, 8B (low) | {VLLM_GEN_TPS_H100['MLPerf offline, FP8']:,.0f} | {SOURCES['gen_low']} |",
        f"| H100: vLLM generation tokens/s, 8B (high) | {VLLM_GEN_TPS_H100['BF16, third-party compilation']:,.0f} | {SOURCES['gen_high']} |",
        f"| H100: training tokens/s, 8B | {train_tps[0]:,.0f}–{train_tps[1]:,.0f} (mid {sum(train_tps) / 2:,.0f}) | {SOURCES['train']} |",
        f"| publish 16 GB bf16 within a node | {_fmt_s(NVLINK_PUBLISH_S)} | {SOURCES['nvlink']} |",
        f"| publish across nodes | {_fmt_s(publish_seconds(PARAMS_8B, 2, IB_NDR_BYTES_PER_S))} | {SOURCES['ib']} |",
        "",
        f"Workloads: the CPU demo step is {demo.prompts} prompts × {demo.group_size} completions of "
        f"{demo.prompt_tokens:g} prompt + {demo.completion_tokens:g} completion tokens; the GPU step is "
        f"{gpu_work.prompts} × {gpu_work.group_size} of {gpu_work.prompt_tokens:g} + {gpu_work.completion_tokens:g} "
        f"({gpu_work.generated_tokens / 1e6:.2f} M generated, {gpu_work.trained_tokens / 1e6:.2f} M trained tokens). "
        "Training counts prompt + completion tokens, generation counts completion tokens.",
    ]


def machine_lines(cpu_gen_tps: float, cpu_train_tps: float) -> list[str]:
    """The demo step on this machine's cores, at 1-3 actors per learner."""
    cpu_gen_s, cpu_train_s = device_seconds(DEMO_STEP, cpu_gen_tps, cpu_train_tps)
    return [
        "### This machine (demo task)",
        "",
        f"gen = {_fmt_s(cpu_gen_s)}, train = {_fmt_s(cpu_train_s)} per step on one core; "
        f"learner-bound above actors : learners = {learner_bound_ratio(cpu_gen_s, cpu_train_s):.2f}. "
        "With 2 cores, 1 : 1 is the only split that does not oversubscribe them.",
        "",
        *split_table(cpu_gen_s, cpu_train_s, [(1, 1), (2, 1), (3, 1)], CPU_PUBLISH_S),
    ]


def h100_lines(label: str, gen_tps: float) -> list[str]:
    """The GPU step on H100s with vLLM actors at ``gen_tps``: splits within a node, then clusters."""
    train_mid = sum(_h100_train_tps()) / 2
    gen_s, train_s = device_seconds(GPU_STEP, gen_tps, train_mid)
    return [
        f"### H100 node, 8B model, vLLM actors at {gen_tps:,.0f} tokens/s ({label}), ZeRO-2 learner at "
        f"{train_mid:,.0f} tokens/s",
        "",
        f"gen = {_fmt_s(gen_s)}, train = {_fmt_s(train_s)} GPU-seconds per step; the learner becomes the "
        f"bottleneck above **{learner_bound_ratio(gen_s, train_s):.2f} actor GPUs per learner GPU**.",
        "",
        *split_table(
            gen_s, train_s, [(1, 1), (2, 2), (4, 4), (5, 3), (6, 2), (7, 1)], NVLINK_PUBLISH_S
        ),
        "",
        *cluster_table(gen_s, train_s, PARAMS_8B),
    ]


READING = [
    "### Reading it",
    "",
    "- Against synchronous alternation on the same split, overlapping the two phases gives up to 2× "
    "(reached when gen/a = train/l; publish is a rounding error at these step sizes).",
    "- Against a colocated synchronous trainer with perfectly linear scaling the ideal gain is about 1× "
    "(the integer split and the per-step publish cost a little): the asynchronous design's "
    "advantage there is the idle tail of each synchronous batch and the reload of weights into the "
    "inference engine, neither of which is in this model. For scale, "
    f"{SOURCES['areal']}.",
    "- The actor:learner ratio that balances the node follows from gen/train alone; with faster "
    "generation (the high vLLM figure) fewer actor GPUs are needed and the learner is the bottleneck sooner.",
]


def report(
    cpu_gen_tps: float, gen_src: str, cpu_train_tps: float, train_src: str, command: str
) -> str:
    lines = [
        "## Beyond one machine: projected async speedup on GPUs",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')} · {platform.node()} ({platform.machine()}, {os.cpu_count()} cores) · "
        f"`{command}` (`python -m bench --only projection`)",
        "",
        "Arithmetic, not a measurement of GPUs: per-step device-seconds of generation (gen) and training (train) "
        "from per-device tokens/s, then",
        "",
        "- synchronous alternation: `T_sync = gen/a + train/l + publish`",
        "- asynchronous (streamrl): `T_async = max(gen/a, train/l) + publish`",
        "- colocated synchronous (every GPU generates, then trains): `T_coloc = (gen + train)/N + publish`",
        "- the learner is the bottleneck once `a/l > gen/train`.",
        "",
        "Throughputs scale linearly and completions have no long tail, the best case for the synchronous designs: "
        "a synchronous batch waits for its longest completion, which this model leaves out.",
        "",
        *inputs_lines(cpu_gen_tps, gen_src, cpu_train_tps, train_src),
        "",
        *machine_lines(cpu_gen_tps, cpu_train_tps),
    ]
    for label, gen_tps in VLLM_GEN_TPS_H100.items():
        lines += ["", *h100_lines(label, gen_tps)]
    return "\n".join([*lines, "", *READING])


def run(quick: bool = False) -> str:
    """Benchmark section (pure arithmetic; ``quick`` changes nothing)."""
    gen, gen_src, train, train_src = measured_cpu_inputs()
    return report(gen, gen_src, train, train_src, "make bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--cpu-gen-tps", type=float, help="measured generation tokens/s on this machine"
    )
    parser.add_argument(
        "--cpu-train-tps", type=float, help="measured training tokens/s on this machine"
    )
    args = parser.parse_args()
    gen, gen_src, train, train_src = measured_cpu_inputs()
    if args.cpu_gen_tps:
        gen, gen_src = args.cpu_gen_tps, "command line"
    if args.cpu_train_tps:
        train, train_src = args.cpu_train_tps, "command line"
    print(report(gen, gen_src, train, train_src, "python -m bench.projection"))


if __name__ == "__main__":
    main()
