"""The CPU demo's step time with and without CPU placement (``learner.cpus``, ``actor.cpus``).

    python -m bench.cpu_placement [--pairs N] [--steps N]   (writes docs/bench/cpu_placement.md)

Each pair runs ``python -m streamrl.launch --config configs/demo_cpu.yaml --actors 2`` twice,
back to back in fresh run directories: once with the preset's placement (on 2 cores: the
learner on one core, the actors, Redis and the launcher on the other) and once with
``learner.cpus=null actor.cpus=null`` (every process on every core), the order alternating
between pairs. Both stop after ``--steps`` learner steps; the first ``WARMUP`` steps (start-up,
first allocations) are left out. Per run: the median time between consecutive learner steps
(what sets samples/s: the learner is the bottleneck on 2 cores), the learner's median step and
its median wait for data, from ``learner_steps.jsonl``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.cli import command_line, publish
from bench.startup import ROOT, demo_launch, prepare_demo

OUT = Path("docs/bench/cpu_placement.md")
WARMUP = 30
UNPINNED = ["learner.cpus=null", "actor.cpus=null"]
TIMEOUT_S = 600


def one_run(run_dir: Path, steps: int, extra: list[str]) -> dict:
    """One demo run of ``steps`` learner steps; medians over the steps after ``WARMUP``."""
    overrides = [f"run.max_steps={steps}", "run.target_reward=0", "run.target_parts={}", *extra]
    cmd, env = demo_launch(run_dir, "place", overrides)
    subprocess.run(
        cmd, cwd=ROOT, env=env, check=True, timeout=TIMEOUT_S,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return steady_state(run_dir / "learner_steps.jsonl")


def steady_state(steps: Path) -> dict:
    """Medians over the learner's step records after the first ``WARMUP``."""
    rows = [json.loads(line) for line in steps.read_text().splitlines()][WARMUP:]
    intervals = [b["time"] - a["time"] for a, b in itertools.pairwise(rows)]
    samples = statistics.median(r["samples"] for r in rows)
    interval = statistics.median(intervals)
    return {
        "interval_ms": 1000 * interval,
        "step_ms": 1000 * statistics.median(r["step_s"] for r in rows),
        "wait_ms": 1000 * statistics.median(r["wait_s"] for r in rows),
        "samples_per_s": samples / interval,
        "steps": len(rows),
    }


def report(runs: list[tuple[str, dict]], load: float, command: str, cores: int) -> str:
    from bench.__main__ import machine

    lines = [
        "## CPU placement: the demo's steps with and without pinning",
        "",
        f"{time.strftime('%Y-%m-%d')} · {machine()} · load average {load:.1f} at start · "
        f"command: `{command}`",
        "",
        f"The demo (learner + 2 hf actors) on this host's {cores} cores: *pinned* = the preset's "
        "`learner.cpus: auto`, `actor.cpus: auto` (the learner on its own core once started; the "
        "actors, Redis and the launcher on the others), *unpinned* = every process on every core. "
        f"Medians over the steps after the first {WARMUP}; each pair back to back, the order "
        "alternating.",
        "",
        "| run | placement | ms between learner steps | learner step ms | learner wait ms | samples/s |",
        "|---|---|---|---|---|---|",
    ]
    for i, (name, r) in enumerate(runs):
        lines.append(
            f"| {i // 2 + 1} | {name} | {r['interval_ms']:.0f} | {r['step_ms']:.0f} | "
            f"{r['wait_ms']:.0f} | {r['samples_per_s']:,.0f} |"
        )
    pinned = statistics.median(r["interval_ms"] for n, r in runs if n == "pinned")
    unpinned = statistics.median(r["interval_ms"] for n, r in runs if n == "unpinned")
    lines += [
        "",
        f"- **ms between learner steps, pinned / unpinned: {pinned / unpinned:.2f}x** "
        f"(medians {pinned:.0f} and {unpinned:.0f} ms).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.steps <= WARMUP + 2:
        parser.error(f"--steps must be over {WARMUP + 2}: the first {WARMUP} are left out")
    prepare_demo()
    load = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench-cpu-placement-"))
    runs: list[tuple[str, dict]] = []
    for pair in range(args.pairs):
        order = [("pinned", []), ("unpinned", UNPINNED)]
        for name, extra in order if pair % 2 == 0 else order[::-1]:
            result = one_run(tmp / f"{name}{pair}", args.steps, extra)
            runs.append((name, result))
            print(name, json.dumps(result), flush=True)
    shutil.rmtree(tmp)
    command = command_line("bench.cpu_placement", argv)
    publish(args.out, report(runs, load, command, len(os.sched_getaffinity(0))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
