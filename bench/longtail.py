"""Where asynchrony pays: the long-tail task, streamrl against synchronous loops, and the yardstick.

    python -m bench.longtail --seeds 0,1,2 [--cap-s 900] [--grid 3e-4:0,3e-4:0.1,6e-4:0,6e-4:0.1] \\
        [--systems streamrl,loop,trl] [--parts yardstick,demo,longtail] [--yardstick PATH] [--reuse]
    python -m bench.longtail --device cuda --seeds 0 --grid 3e-4:0 --cap-s 120   (a lent GPU)

Three parts, every run stopped at its task's target or at ``--cap-s`` (seconds after launch):

- ``yardstick``: per seed, back to back, the one-file loop of ``--yardstick`` (default
  ``bench/yardstick/grpo_toy.py``, the copy this repository carries; skipped, saying so, when
  a path given is absent) with its README command, then this repository's loop (``bench.reference_loop``) on the demo
  task with the same recipe (no KL, lr 3e-4, the warm start's AdamW kept, 16 x 16). Both are
  timed from the end of their warm start to the first 20 rollouts of mean reward >= 0.95 (the
  one-file loop's own target); the repository's loop must be within 20 % of the one-file loop.
- ``demo``: streamrl (``configs/demo_cpu.yaml``, learner + 2 actors, from launch) and TRL's
  GRPOTrainer at the preset's point, per seed, against the yardstick runs above.
- ``longtail``: the long-tail copy task (``configs/longtail_cpu.yaml``), per seed and grid
  point back to back: streamrl (learner + 2 actors, from launch), the synchronous loop
  (``bench.reference_loop --task longtail``, the warm start's AdamW kept, its best start on
  the demo) and TRL. Each system's best grid point is the one with the lowest median time to
  the target over the seeds; the ratios compare medians at each system's best point.

``--device cuda`` runs the long-tail part only, every system on the one GPU in float32: the
loop wholly on it, streamrl's learner and its actors' hf engines on it (``actor.gpus=share``);
TRL is not run there. It writes docs/bench/longtail_gpu.md and docs/img/longtail_gpu_curves.png.

Writes docs/bench/longtail.md and the reward-against-wall-time plots docs/img/longtail_curves.png
and docs/img/demo_curves.png. The last line printed is ``RATIO <streamrl median / loop median>``
on the long-tail task. Every finished run is saved under runs/bench-system/outcomes; ``--reuse``
reads those instead of running again.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import system
from bench.cli import command_line, gpu_name, publish
from bench.system import CARRY, REFERENCE, TRL, Outcome, median_ttt, save_outcome, saved_path
from bench.tasks import DEMO, LONGTAIL, Task

DEFAULT_YARDSTICK = Path(__file__).resolve().parent / "yardstick" / "grpo_toy.py"
SECTION = Path("docs/bench/longtail.md")
IMG = {"demo": Path("docs/img/demo_curves.png"), "longtail": Path("docs/img/longtail_curves.png")}
GPU_SECTION = Path("docs/bench/longtail_gpu.md")
GPU_IMG = Path("docs/img/longtail_gpu_curves.png")
# streamrl on one GPU: the learner takes it (DeepSpeed's accelerator follows CUDA), the actors'
# hf engines share it, and the tiny model stays in float32 as the loop does. Each actor decodes
# 256 sequences at once, as the loop does: at the CPU's 64 two actors generated half the loop's
# samples per second on an H100 (docs/bench/gpu.md)
GPU_OVERRIDES = (
    "actor.device=cuda",
    "actor.gpus=share",
    "model.dtype=float32",
    "actor.batch_slots=256",
)
# the ratio each device's long-tail run must reach
GOAL = {"cpu": 0.5, "cuda": 0.6}
STREAMRL, LOOP, YARDSTICK = "streamrl", "synchronous loop", "one-file loop (yardstick)"
SYSTEM_NAMES = {"streamrl": STREAMRL, "loop": LOOP, "trl": TRL}
PARTS = ("yardstick", "demo", "longtail")
GRID = "3e-4:0,3e-4:0.1,6e-4:0,6e-4:0.1"
ACTORS = 2
# the repository's loop on the demo may take this much longer than the yardstick
YARDSTICK_SLACK = 1.2
# the yardstick's recipe (its README command); --seed, --time and --log are added per run
YARDSTICK_ARGS = (
    "--task rev --ndig 3 --sft 60 --lr 3e-4 --G 16 --B 16 --threads 1 --target 0.95".split()
)
YARDSTICK_POINT = (3e-4, 0.0)
YARDSTICK_REWARD = 0.95


def parse_grid(text: str) -> list[tuple[float, float]]:
    """``"3e-4:0,6e-4:0.1"`` -> ``[(3e-4, 0.0), (6e-4, 0.1)]``: (lr, k3 KL coefficient) points."""
    points = []
    for item in text.split(","):
        lr, sep, kl = item.strip().partition(":")
        try:
            point = (float(lr), float(kl))
        except ValueError:
            point = None
        if not sep or point is None or point[0] <= 0 or point[1] < 0:
            raise argparse.ArgumentTypeError(f"grid point {item!r}: expected lr:kl, e.g. 3e-4:0.1")
        points.append(point)
    if not points or len(set(points)) != len(points):
        raise argparse.ArgumentTypeError(f"grid {text!r}: expected distinct lr:kl points")
    return points


def yardstick_curve(path: Path) -> tuple[list[tuple[float, float, float]], float]:
    """The one-file loop's CSV log -> its RL curve (seconds since the warm start ended, reward,
    exact match) and the warm start's seconds (the wall time of its last ``sft`` row)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    sft_end = max((float(r["wall_s"]) for r in rows if r["phase"] == "sft"), default=0.0)
    curve = [
        (float(r["wall_s"]) - sft_end, float(r["reward_mean"]), float(r["exact_frac"]))
        for r in rows
        if r["phase"] == "rl"
    ]
    return curve, sft_end


def run_yardstick(path: Path, seed: int, cap_s: float, reuse: bool) -> Outcome:
    """One run of the one-file loop on the demo task, its clock from the end of its warm start."""
    saved = saved_path(f"yardstick-s{seed}", cap_s)
    if reuse and saved.exists():
        print(f"   {YARDSTICK} seed {seed}: reusing {saved}", flush=True)
        return system.load_outcome(saved)
    print(f"   {YARDSTICK} seed {seed}: {path}, cap {cap_s:g} s of RL", flush=True)
    with tempfile.TemporaryDirectory(prefix="yardstick-") as tmp:
        log = Path(tmp) / "log.csv"
        started = time.monotonic()
        # the warm start runs inside its clock: give the cap on top of it
        subprocess.run(
            [sys.executable, str(path), *YARDSTICK_ARGS, "--seed", str(seed)]
            + ["--time", f"{cap_s:g}", "--log", str(log)],
            check=True,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        wall_s = time.monotonic() - started
        curve, sft_s = yardstick_curve(log)
    rl_s = curve[-1][0] if curve else 0.0
    outcome = Outcome(
        YARDSTICK,
        seed,
        cap_s,
        curve,
        256 * len(curve) / rl_s if rl_s > 0 else 0.0,
        0.0,
        wall_s,
        extra={"warm_start_s": sft_s},
        samples=[256] * len(curve),
        wasted_fraction=0.0,
        bars=(YARDSTICK_REWARD, 0.0),
    )
    save_outcome(outcome, saved)
    return outcome


def run_system(
    name: str,
    task: Task,
    seed: int,
    point: tuple[float, float],
    cap_s: float,
    reuse: bool,
    device: str = "cpu",
) -> Outcome:
    """One run of ``name`` (streamrl, the loop or TRL) on ``task`` at ``point``, on ``device``."""
    if name == STREAMRL:
        label = f"{STREAMRL}, {system.point_label(point)}"
        extra = system.point_overrides(point)
        if device != "cpu":
            label = f"{label}, {device}"
            extra = [*extra, *GPU_OVERRIDES]
        outcome = system.run_streamrl(label, seed, extra, ACTORS, cap_s, True, reuse, task)
    elif name == LOOP:
        outcome = system.run_loop_outcome(
            REFERENCE, seed, point, cap_s, reuse, task, [CARRY], device
        )
    else:
        outcome = system.run_loop_outcome(TRL, seed, point, cap_s, reuse, task)
    outcome.system = name
    return outcome


def best_point(
    by_point: dict[tuple[float, float], list[Outcome]],
) -> tuple[tuple[float, float], list[Outcome]]:
    """The grid point with the lowest median time to target (ties: the higher reward reached)."""
    return min(by_point.items(), key=lambda item: system.rank_key(item[1]))


def ratio(num: list[Outcome], den: list[Outcome]) -> float:
    """Median time to target over median time to target; nan when a side missed on most seeds."""
    a, b = median_ttt(num), median_ttt(den)
    return a / b if math.isfinite(a) and math.isfinite(b) and b > 0 else math.nan


def reward_only_ratio(num: list[Outcome], den: list[Outcome]) -> float:
    """Median times to the one-file loop's own target (a 20-step mean reward >= 0.95, no
    exact-match bar), ``num`` over ``den``."""
    a = system.median_of([o.time_to(YARDSTICK_REWARD) for o in num])
    b = system.median_of([o.time_to(YARDSTICK_REWARD) for o in den])
    if not math.isfinite(b) or b <= 0:
        return math.nan
    # a side that missed on most seeds is infinitely slower: the check fails
    return a / b


def plot(results: dict[str, list[Outcome]], title: str, path: Path) -> None:
    """Reward (20-step mean) against wall time, every run of every system, one colour per system;
    without matplotlib (a bare GPU machine) a line saying so, the measured rows already printed."""
    try:
        import matplotlib
    except ImportError:
        print(f"no matplotlib here: {path.name} not drawn (pip install matplotlib)", flush=True)
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    bar = None
    for i, (name, outcomes) in enumerate(results.items()):
        for j, o in enumerate(outcomes):
            if not o.curve:
                continue
            bar = o.bars[0]
            reward = system.rolling_mean([r for _, r, _ in o.curve])
            ax.plot(
                [t for t, _, _ in o.curve],
                reward,
                color=f"C{i}",
                lw=1,
                label=name if j == 0 else None,
            )
    if bar is not None:
        ax.axhline(bar, color="grey", lw=0.8, ls=":")
    ax.set_xlabel(
        "wall time (s): streamrl and TRL from launch, loops from the end of the warm start"
    )
    ax.set_ylabel("reward (20-step mean)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _cell(o: Outcome) -> str:
    ttt = o.time_to_target_s
    if ttt is None:
        reward, exact = o.reached
        return f"not in {o.cap_s:.0f} s ({reward:.2f} / {exact:.2f})"
    samples = o.samples_to_target
    return f"{ttt:.0f} s ({samples:,} samples)" if samples else f"{ttt:.0f} s"


def _fmt_ratio(value: float, goal: float) -> str:
    if math.isnan(value):
        return "n/a (a side missed the target on most seeds)"
    return f"**{value:.2f}×** (goal ≤ {goal}×: {'met' if value <= goal else 'not met'})"


def grid_table(grid: dict[str, dict[tuple[float, float], list[Outcome]]]) -> list[str]:
    points = sorted({p for by_point in grid.values() for p in by_point})
    rows = [
        f"| {name} | "
        + " | ".join(
            system._fmt_s(median_ttt(by_point[p])) if p in by_point else "–" for p in points
        )
        + " |"
        for name, by_point in grid.items()
    ]
    return [
        "| system | " + " | ".join(system.point_label(p) for p in points) + " |",
        "|---|" + "---|" * len(points),
        *rows,
    ]


def seed_table(results: dict[str, list[Outcome]]) -> list[str]:
    names = list(results)
    seeds = [o.seed for o in next(iter(results.values()))]
    return [
        "| seed | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        *(
            f"| {seed} | " + " | ".join(_cell(results[n][i]) for n in names) + " |"
            for i, seed in enumerate(seeds)
        ),
        "| median | " + " | ".join(system._fmt_s(median_ttt(results[n])) for n in names) + " |",
    ]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    """The command line, checked; ``--device cuda`` narrows it to the long-tail part without TRL."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--cap-s", type=float, default=900.0, help="cap of one run (seconds)")
    parser.add_argument("--grid", type=parse_grid, default=parse_grid(GRID), help="lr:kl,...")
    parser.add_argument("--systems", default="streamrl,loop,trl", help="of streamrl,loop,trl")
    parser.add_argument("--parts", default=",".join(PARTS), help=f"of {','.join(PARTS)}")
    parser.add_argument("--yardstick", type=Path, default=DEFAULT_YARDSTICK)
    parser.add_argument("--reuse", action="store_true", help="read saved runs instead")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the long-tail part on a GPU"
    )
    args = parser.parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device here")
        if set(args.parts.split(",")) - {"longtail"} and args.parts != ",".join(PARTS):
            parser.error("--device cuda runs the long-tail part only")
        args.parts = "longtail"
        if "trl" in args.systems.split(","):
            args.systems = ",".join(s for s in args.systems.split(",") if s != "trl")
    args.seeds = [int(s) for s in args.seeds.split(",")]
    args.names = [SYSTEM_NAMES[s.strip()] for s in args.systems.split(",") if s.strip()]
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = set(args.parts) - set(PARTS)
    if unknown or STREAMRL not in args.names:
        parser.error(f"parts of {PARTS} (got {sorted(unknown)}), systems must include streamrl")
    return args


def yardstick_part(args: argparse.Namespace, demo: dict[str, list[Outcome]]) -> list[str]:
    """Per seed, the one-file loop and the repository's loop on the demo (into ``demo``), and
    the line that says whether the latter is within ``YARDSTICK_SLACK`` of the former."""
    if not args.yardstick.exists():
        message = f"yardstick {args.yardstick} not found: its check is skipped"
        print(message, flush=True)
        return [f"**Yardstick:** {message}.", ""]
    demo[YARDSTICK] = []
    demo[LOOP] = []
    for seed in args.seeds:
        demo[YARDSTICK].append(run_yardstick(args.yardstick, seed, args.cap_s, args.reuse))
        demo[LOOP].append(run_system(LOOP, DEMO, seed, YARDSTICK_POINT, args.cap_s, args.reuse))
    value = reward_only_ratio(demo[LOOP], demo[YARDSTICK])
    within = f"{'within' if value <= YARDSTICK_SLACK else 'NOT within'} {YARDSTICK_SLACK - 1:.0%}"
    if math.isnan(value):
        verdict = "n/a (the one-file loop missed its target on most seeds)"
    elif math.isinf(value):
        verdict = f"the repository's loop missed the target on most seeds: {within}"
    else:
        verdict = f"{value:.2f}× ({within})"
    print(f"YARDSTICK repository loop / one-file loop on the demo: {verdict}", flush=True)
    return [
        f"**Yardstick:** the repository's loop on the demo, no KL, lr 3e-4, the warm start's AdamW "
        f"kept, over `{args.yardstick.name}` with its README command, each from the end of its "
        f"warm start to 20 rollouts of mean reward ≥ {YARDSTICK_REWARD}, medians: {verdict}.",
        "",
    ]


def demo_part(args: argparse.Namespace, demo: dict[str, list[Outcome]]) -> list[str]:
    """streamrl (and TRL) on the demo at the preset's point, against the yardstick's runs in
    ``demo`` (or, without them, the repository's loop)."""
    # the yardstick part ran the loop on every seed already (asked before the first run adds one)
    loop_ran = LOOP in demo
    for seed in args.seeds:
        for name in args.names:
            if name == LOOP and loop_ran:
                continue
            point = system.preset_point()
            demo.setdefault(name, []).append(
                run_system(name, DEMO, seed, point, args.cap_s, args.reuse)
            )
    plot(demo, "CPU demo (reverse 3 digits), every seed", IMG["demo"])
    base = YARDSTICK if YARDSTICK in demo else LOOP
    return [
        "### The demo task",
        "",
        f"streamrl and TRL at the preset's point ({system.point_label(system.preset_point())}); "
        "the loops with no KL and the warm start's AdamW kept. Time to the demo target "
        "(20-step means of reward ≥ 0.95 and exact match ≥ 0.85; the one-file loop: reward only).",
        "",
        *seed_table(demo),
        "",
        f"- streamrl / {base}: {_fmt_ratio(ratio(demo[STREAMRL], demo[base]), 0.9)}",
        *(
            [
                f"- streamrl / {base}, both to the one-file loop's own target (20-step mean "
                f"reward ≥ {YARDSTICK_REWARD}, no exact-match bar): "
                f"{_fmt_ratio(reward_only_ratio(demo[STREAMRL], demo[base]), 0.9)}"
            ]
            if base == YARDSTICK
            else []
        ),
        "",
        f"![reward against wall time on the demo]({IMG['demo'].relative_to('docs')})",
        "",
    ]


def longtail_part(args: argparse.Namespace) -> tuple[list[str], float]:
    """Every system on the long-tail task at every grid point and seed: the section's lines and
    streamrl's median time over the loop's at their best points (nan without the loop)."""
    gpu = args.device == "cuda"
    grid: dict[str, dict[tuple[float, float], list[Outcome]]] = {n: {} for n in args.names}
    for seed in args.seeds:
        for point in args.grid:
            for name in args.names:
                outcome = run_system(
                    name, LONGTAIL, seed, point, args.cap_s, args.reuse, args.device
                )
                grid[name].setdefault(point, []).append(outcome)
    best = {name: best_point(by_point) for name, by_point in grid.items()}
    results = {name: outcomes for name, (_, outcomes) in best.items()}
    where = f"on {gpu_name()}, float32" if gpu else "on the CPU"
    img = GPU_IMG if gpu else IMG["longtail"]
    plot(results, f"long-tail copy task {where}, each system at its best grid point", img)
    final = ratio(results[STREAMRL], results[LOOP]) if LOOP in results else math.nan
    reward_bar, exact_bar, window = LONGTAIL.target()
    gpu_note = [
        f"The loop wholly on the GPU; streamrl's learner and its {ACTORS} actors' hf engines "
        f"on it too (`{' '.join(GPU_OVERRIDES)}`).",
        "",
    ]
    lines = [
        f"### The long-tail task {where}",
        "",
        *(gpu_note if gpu else []),
        f"`{LONGTAIL.config}`: copy 1–24 digits, lengths P(n) ∝ n^-1.5 (median 2), the preset's "
        "recipe and a light warm start (100 steps at 3e-4). Target: "
        f"{window}-step means of reward ≥ {reward_bar} and exact copies ≥ {exact_bar}. "
        f"Cap {args.cap_s:.0f} s. Grid (lr, KL) of every system; median time to target:",
        "",
        *grid_table(grid),
        "",
        "Each system at its best point: "
        + ", ".join(f"{n} {system.point_label(p)}" for n, (p, _) in best.items()),
        "",
        *seed_table(results),
        "",
        f"- streamrl / synchronous loop: {_fmt_ratio(final, GOAL[args.device])}",
        *(
            [f"- streamrl / TRL: {_fmt_ratio(ratio(results[STREAMRL], results[TRL]), 0.5)}"]
            if TRL in results
            else []
        ),
        "",
        f"![reward against wall time on the long-tail task]({img.relative_to('docs')})",
        "",
    ]
    return lines, final


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("DS_ACCELERATOR", args.device)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)
    started = time.monotonic()
    lines = [
        "## Where asynchrony pays: the long-tail task, and the yardstick",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC · {system.machine()} · "
        f"`{command_line('bench.longtail', argv)}`",
        "",
    ]
    demo: dict[str, list[Outcome]] = {}
    if "yardstick" in args.parts or "demo" in args.parts:
        lines += yardstick_part(args, demo)
    if "demo" in args.parts:
        lines += demo_part(args, demo)
    final = math.nan
    if "longtail" in args.parts:
        part, final = longtail_part(args)
        lines += part
    lines.append(f"All runs took {(time.monotonic() - started) / 60:.0f} min.")
    publish(GPU_SECTION if args.device == "cuda" else SECTION, "\n".join(lines) + "\n")
    print(f"RATIO {final:.3f}" if math.isfinite(final) else "RATIO nan")
    return 0


if __name__ == "__main__":
    sys.exit(main())
